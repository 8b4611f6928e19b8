"""The sides of an overhead comparison, run after run, in one process.

  with InProcessSides(trainer_flags, log_path) as sides:
    result = sides.run("plain_loop", run_dir)    # or "torch_parity", ...

Two processes started from one command line differ by themselves: on a
2-core host one runs the same steps a few percent faster or slower than
the next (where its memory lands, which core its threads take), more than
the 2% the trainers are allowed. Paired runs in separate processes carry
that difference into every ratio. Here one long-lived process (this
module, run as `python -m benchmarks.in_process_sides <trainer flags>`)
runs every repeat of one configuration's sides, one after the other, as
the harness orders them, so that what the process brings is the same on
every side. The sides, by framework (one process serves one framework):

  pytorch     plain_loop      `benchmarks.plain_torch_loop.run`
              torch_parity    `torch_parity.trainer.train`
  tensorflow  plain_fit       `benchmarks.plain_keras_fit.run`
              tfoverlap_ctl   `tfoverlap.trainer.train`, --loop=ctl
              tfoverlap_fit   `tfoverlap.trainer.train`, --loop=fit

The trainers train with the quiet flags, in a new model directory each
time; their run.json is read as `common.summarize_record` reads a trainer
process's. The process sets what the trainers' entry point sets once per
process before any side runs: the host allocator policy (so the plain
sides run under the trainers' allocator too); the thread pools are set by
the first side and asked for unchanged by the rest. Each side builds its
own model, optimizer and input; a PyTorch side ends its loader's workers
before the next starts, and after a TensorFlow side Keras' global state is
cleared (`keras.backend.clear_session`), as a new process would start.
One process means strategies that need no launcher: the PyTorch sides
take the plain loop's (`plain_torch_loop.check_supported`: `default`,
`one_device`), since `torch_parity.train` would launch a process per
mirrored replica; the Keras sides those plain `model.fit` builds, whose
mirrored strategy is one process in TensorFlow too.

Each result carries the process's costs over that side, as a side run in
its own process has them (`common.measure_in_this_process`). The protocol
is one JSON line each way: {"side", "run_dir", "plain_jit_compile"} in,
{"result"} or {"error"} out, on a descriptor of its own; whatever the
sides print goes to the log.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import select
import subprocess
import sys
from typing import Iterator, Optional, Sequence

from benchmarks import common

# {side: framework}
SIDES = {"plain_loop": "pytorch", "torch_parity": "pytorch",
         "plain_fit": "tensorflow", "tfoverlap_ctl": "tensorflow",
         "tfoverlap_fit": "tensorflow"}
# Where a driver runs its sides: every repeat of a configuration's sides
# in one process that serves them, or each run in a process of its own.
ONE_PROCESS = "one_process"
PROCESSES = "processes"
SIDES_IN = (ONE_PROCESS, PROCESSES)
_STDERR_TAIL_CHARS = 3000


def add_sides_in_arg(parser: argparse.ArgumentParser) -> None:
  """--sides_in, for a driver whose sides `InProcessSides` can run."""
  parser.add_argument(
      "--sides_in", choices=SIDES_IN, default=ONE_PROCESS,
      help="one_process: every run of a configuration's sides in one "
      "process that serves them, so that a process's own speed, which "
      "differs from process to process by more than the target, is the "
      "same on every side (benchmarks.in_process_sides); processes: each "
      "run in its own process, as a user starts one.")


class InProcessSides:
  """A client of one side process, started on the first `run`.

  Args:
    trainer_flags: the flags every side trains with (the quiet flags are
      added first, as `common.run_trainer` adds them).
    log_path: the process's stderr, and what the sides print.
    timeout_s: the longest one side may take.
  """

  def __init__(self, trainer_flags: Sequence[str], log_path: str, *,
               timeout_s: float = common.PROCESS_TIMEOUT_S):
    self._args = [*common.QUIET_TRAINER_FLAGS, *trainer_flags]
    self._log_path = log_path
    self._timeout_s = timeout_s
    self._process: Optional[subprocess.Popen] = None
    self._log = None

  def _start(self) -> subprocess.Popen:
    self._log = open(self._log_path, "w", encoding="utf-8")
    self._process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.in_process_sides", *self._args],
        cwd=common.REPO_ROOT, env=common.subprocess_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
        text=True)
    return self._process

  def _failure(self, what: str) -> common.BenchmarkError:
    self._log.flush()
    with open(self._log_path, encoding="utf-8", errors="replace") as f:
      tail = f.read()[-_STDERR_TAIL_CHARS:]
    return common.BenchmarkError(
        f"{what}: benchmarks.in_process_sides {' '.join(self._args)}\n{tail}")

  def run(self, side: str, run_dir: str, *,
          plain_jit_compile: str = "auto") -> dict:
    """One run of `side` in the side process; its result.

    Args:
      plain_jit_compile: plain_fit's model.compile(jit_compile=...), as
        `benchmarks.plain_keras_fit --jit_compile` takes it.

    Raises:
      ValueError: a side not in SIDES.
      common.BenchmarkError: the side failed or was refused, the process
        died, or it took longer than the timeout (the process is then
        ended).
    """
    if side not in SIDES:
      raise ValueError(f"side: got {side!r}; allowed: {', '.join(SIDES)}")
    process = self._process or self._start()
    process.stdin.write(json.dumps(
        {"side": side, "run_dir": run_dir,
         "plain_jit_compile": plain_jit_compile}) + "\n")
    process.stdin.flush()
    ready, _, _ = select.select([process.stdout], [], [], self._timeout_s)
    if not ready:
      self.close()
      raise self._failure(f"{side} timed out after {self._timeout_s:.0f}s")
    line = process.stdout.readline()
    if not line:
      process.wait()
      raise self._failure(f"{side}: the side process exited "
                          f"{process.returncode}")
    reply = json.loads(line)
    if "error" in reply:
      raise self._failure(f"{side}: {reply['error']}")
    return reply["result"]

  def close(self) -> None:
    """Ends the side process (closing its input lets it return)."""
    if self._process is None:
      return
    try:
      self._process.stdin.close()
      self._process.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):
      self._process.kill()
      self._process.wait()
    self._process = None
    self._log.close()

  def __enter__(self) -> "InProcessSides":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class SideProcesses:
  """One `InProcessSides` per set of trainer flags, for a driver whose
  configurations train with different flags; closes them all on exit.

    with SideProcesses(scratch_root) as processes:
      result = processes.run(flags, "plain_loop", run_dir)
  """

  def __init__(self, scratch_root: str):
    self._scratch_root = scratch_root
    self._by_flags = {}

  def run(self, trainer_flags: Sequence[str], side: str, run_dir: str,
          **options) -> dict:
    """`InProcessSides.run` in the process of these flags."""
    key = tuple(trainer_flags)
    if key not in self._by_flags:
      log_path = os.path.join(self._scratch_root,
                              f"side-process-{len(self._by_flags)}.log")
      self._by_flags[key] = InProcessSides(trainer_flags, log_path)
    return self._by_flags[key].run(side, run_dir, **options)

  def __enter__(self) -> "SideProcesses":
    return self

  def __exit__(self, *exc_info) -> None:
    for sides in self._by_flags.values():
      sides.close()


@contextlib.contextmanager
def open_side_processes(scratch_root: str, sides_in: str
                        ) -> Iterator[Optional[SideProcesses]]:
  """What a driver runs its sides in, as --sides_in says: `SideProcesses`
  (closed on exit) for one_process, None for a process per run."""
  if sides_in == PROCESSES:
    yield None
    return
  with SideProcesses(scratch_root) as processes:
    yield processes


# The trainers' loops by side; the plain sides have none.
_TRAINER_LOOPS = {"tfoverlap_ctl": "ctl", "tfoverlap_fit": "fit"}


def _run_side(request: dict, config) -> dict:
  """One side on `config`, in this process; its result.

  Raises:
    ConfigError: what the side refuses of the configuration.
  """
  # pylint: disable=g-import-not-at-top
  side = request["side"]
  if side == "plain_loop":
    from benchmarks import plain_torch_loop
    return plain_torch_loop.run(config)
  if side == "torch_parity":
    from benchmarks import plain_torch_loop
    # Both PyTorch sides run in this one process, or neither does: the
    # trainer would otherwise train one replica of a mirrored job alone.
    # (TensorFlow's mirrored strategy is one process either way.)
    plain_torch_loop.check_supported(config)
    from torch_parity import trainer
    return common.summarize_record(trainer.train(config))
  import keras
  try:
    if side == "plain_fit":
      from benchmarks import plain_keras_fit
      return plain_keras_fit.run(config, request["plain_jit_compile"])
    from tfoverlap import trainer
    config = dataclasses.replace(config, run=dataclasses.replace(
        config.run, loop=_TRAINER_LOOPS[side]))
    return common.summarize_record(trainer.train(config))
  finally:
    keras.backend.clear_session()
  # pylint: enable=g-import-not-at-top


def _serve(config, requests, reply) -> None:
  """Runs each requested side on `config` and answers on `reply`; the
  first request's framework is the only one served."""
  framework = None
  for line in requests:
    request = json.loads(line)
    side_config = dataclasses.replace(config, run=dataclasses.replace(
        config.run, model_dir=request["run_dir"]))
    framework = framework or SIDES[request["side"]]
    try:
      if SIDES[request["side"]] != framework:
        raise ValueError(f"side {request['side']}: this process serves "
                         f"{framework} sides only")
      result, costs = common.measure_in_this_process(
          lambda: _run_side(request, side_config))
      # The pid says, in the results file, which runs shared a process.
      answer = {"result": {**result, **costs,
                           "side_process_pid": os.getpid()}}
    except Exception as e:  # pylint: disable=broad-except
      # The client fails the benchmark with this line and the log's tail.
      answer = {"error": f"{type(e).__name__}: {e}"}
    reply.write(json.dumps(answer) + "\n")
    reply.flush()


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top
  import flags as tfo_flags
  from absl import logging
  from overlap_core.runtime import host_allocator
  # pylint: enable=g-import-not-at-top
  config = tfo_flags.to_config(tfo_flags.FLAGS)
  logging.set_verbosity(logging.WARNING)
  # What the trainers' entry point does once per process, before a
  # framework is imported (`flags.entry_point.run_trainer`).
  host_allocator.apply(config.run.host_allocator)
  # Answers go out on a copy of stdout; stdout itself becomes stderr, so
  # that nothing a side prints can break a reply line.
  reply = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
  sys.stdout.flush()
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
  _serve(config, sys.stdin, reply)


if __name__ == "__main__":
  # pylint: disable=g-import-not-at-top
  from absl import app
  import flags as tfo_flags
  # The plain baselines define their own flags (--result_json, and one of
  # them --jit_compile) when a side first imports them; this process
  # reads neither.
  tfo_flags.define_flags()
  app.run(main, argv=sys.argv, flags_parser=tfo_flags.parse_or_exit)
