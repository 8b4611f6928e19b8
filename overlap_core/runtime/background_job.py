"""A small training job meant to run beside the foreground at lowest priority.

`python -m overlap_core.runtime.background_job --job=small_mlp --stats=F`

Its first act, before any heavy import, is to put itself in the idle
scheduling class (SCHED_IDLE: the kernel runs it only when no normal task
wants the core), or, where that is refused, at nice 19. Then it trains a
two-layer perceptron with NumPy (framework-free, so both trainers start
the same job) by SGD on a fixed synthetic task, until SIGTERM or until its
parent is gone. Every `--report_every_steps` steps, and at exit, it
replaces F atomically with its counts:

  {"job": "small_mlp", "pid": 123, "policy": "SCHED_IDLE", "nice": 0,
   "steps": 40, "samples": 2560, "elapsed_s": 1.9,
   "samples_per_second": 1347.4, "first_loss": 2.31, "last_loss": 1.02,
   "finished": false}

Only the interpreter's own start-up runs at normal priority.
"""

import os
import signal
import sys

JOBS = ("small_mlp",)


def lower_priority() -> str:
  """SCHED_IDLE for this process, else nice 19; returns which one held."""
  try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return "SCHED_IDLE"
  except (AttributeError, PermissionError, OSError):
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    return "nice 19"


def _parse(argv):
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog="background_job")
  parser.add_argument("--job", choices=JOBS, required=True)
  parser.add_argument("--stats", required=True)
  parser.add_argument("--report_every_steps", type=int, default=10)
  parser.add_argument("--batch_size", type=int, default=64)
  return parser.parse_args(argv)


class _SmallMlp:
  """64 -> 128 -> 10 perceptron, softmax cross-entropy, plain SGD."""

  def __init__(self, np, seed: int = 0):
    rng = np.random.default_rng(seed)
    self._np = np
    self.w1 = rng.normal(0, 0.1, (64, 128)).astype(np.float32)
    self.w2 = rng.normal(0, 0.1, (128, 10)).astype(np.float32)
    self._teacher = rng.normal(0, 1, (64, 10)).astype(np.float32)
    self._rng = rng

  def step(self, batch_size: int, learning_rate: float = 0.05) -> float:
    np = self._np
    x = self._rng.normal(0, 1, (batch_size, 64)).astype(np.float32)
    labels = np.argmax(x @ self._teacher, axis=1)
    hidden = np.maximum(x @ self.w1, 0)
    logits = hidden @ self.w2
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = float(-np.log(probs[np.arange(batch_size), labels] + 1e-9).mean())
    grad_logits = probs
    grad_logits[np.arange(batch_size), labels] -= 1
    grad_logits /= batch_size
    grad_w2 = hidden.T @ grad_logits
    grad_hidden = (grad_logits @ self.w2.T) * (hidden > 0)
    self.w2 -= learning_rate * grad_w2
    self.w1 -= learning_rate * (x.T @ grad_hidden)
    return loss


def main(argv) -> int:
  policy = lower_priority()
  args = _parse(argv)
  # pylint: disable=g-import-not-at-top
  import time
  import numpy as np
  from overlap_core.runtime.run_record import write_json_atomically
  stop = []
  signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
  parent = os.getppid()
  model = _SmallMlp(np)
  start_s = time.perf_counter()
  steps, first_loss, loss = 0, None, None

  def report(finished: bool) -> None:
    elapsed_s = time.perf_counter() - start_s
    samples = steps * args.batch_size
    write_json_atomically(args.stats, {
        "job": args.job, "pid": os.getpid(), "policy": policy,
        "nice": os.getpriority(os.PRIO_PROCESS, 0), "steps": steps,
        "samples": samples, "elapsed_s": elapsed_s,
        "samples_per_second": samples / elapsed_s if elapsed_s > 0 else 0.0,
        "first_loss": first_loss, "last_loss": loss, "finished": finished})

  while not stop and os.getppid() == parent:
    loss = model.step(args.batch_size)
    first_loss = loss if first_loss is None else first_loss
    steps += 1
    if steps == 1 or steps % args.report_every_steps == 0:
      report(finished=False)
  report(finished=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
