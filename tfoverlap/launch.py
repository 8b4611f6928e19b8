"""python -m tfoverlap.launch: N multi-worker trainers on this host.

  python -m tfoverlap.launch --num_workers=2 -- --model=resnet18 --train_steps=50

Everything after `--` goes to every worker (the trainer's own flags, checked
here before anything starts). Each worker gets TF_CONFIG for a localhost
cluster, `--strategy=multi_worker`, the same `--model_dir`, and an equal share
of the host's cores. If any worker fails or is killed, the others are stopped
(SIGTERM, then SIGKILL after a grace period) and the launcher exits non-zero
naming the worker: a dead peer never leaves the job hanging in a collective.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

from absl import app

import flags as tfo_flags
from tfoverlap.core.run_record import default_model_dir

tfo_flags.define_flags()

FRAMEWORK = "tensorflow"
STOP_GRACE_S = 10.0
POLL_INTERVAL_S = 0.2
_PR_SET_PDEATHSIG = 1


def free_ports(count: int) -> list:
  """Ports free on localhost now (held open together so they differ)."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(("localhost", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def tf_config(ports: list, index: int) -> str:
  return json.dumps({
      "cluster": {"worker": [f"localhost:{p}" for p in ports]},
      "task": {"type": "worker", "index": index},
  })


def _die_with_parent():
  """Workers get SIGKILL if the launcher itself is killed (Linux only)."""
  try:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:
    pass


def _has_flag(args: list, name: str) -> bool:
  return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in args)


def build_worker_args(trainer_args: list, num_workers: int) -> list:
  """The trainer flags every worker runs with."""
  args = [a for a in trainer_args if not _has_flag([a], "num_workers")]
  args += ["--strategy=multi_worker", f"--num_workers={num_workers}"]
  if not _has_flag(args, "model_dir"):
    model_name = next((a.split("=", 1)[1] for a in args
                       if a.startswith("--model=")), "small_cnn")
    args.append(f"--model_dir={default_model_dir(FRAMEWORK, model_name)}")
  # Workers sharing a host oversubscribe its cores with default pools.
  share = str(max(1, (os.cpu_count() or 1) // num_workers))
  for pool in ("intra_op_threads", "inter_op_threads"):
    if not _has_flag(args, pool):
      args.append(f"--{pool}={share}")
  return args


def describe_exit(code: int) -> str:
  if code < 0:
    return f"was killed by {signal.Signals(-code).name}"
  return f"exited with status {code}"


def stop_workers(processes: list) -> None:
  """SIGTERM the live workers, then SIGKILL what is left after the grace."""
  live = [p for p in processes if p.poll() is None]
  for p in live:
    p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + STOP_GRACE_S
  for p in live:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def supervise(processes: list) -> int:
  """Waits for all workers; the first failure stops the rest.

  Returns:
    0 if every worker succeeded, else the failed worker's status (1 when it
    was killed by a signal).
  """
  remaining = set(range(len(processes)))
  while remaining:
    for index in sorted(remaining):
      code = processes[index].poll()
      if code is None:
        continue
      remaining.discard(index)
      if code != 0:
        others = [p for p in processes if p.poll() is None]
        print(f"tfoverlap.launch: worker {index} {describe_exit(code)}; "
              f"stopping the other {len(others)} worker(s)",
              file=sys.stderr, flush=True)
        stop_workers(processes)
        return code if code > 0 else 1
    time.sleep(POLL_INTERVAL_S)
  return 0


def launch(num_workers: int, worker_args: list,
           module: str = "tfoverlap.train") -> int:
  """Starts the workers and supervises them; returns the job's status."""
  ports = free_ports(num_workers)
  processes = []
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

  def forward_stop(signum, frame):
    del frame
    stop_workers(processes)
    sys.exit(128 + signum)

  for s in previous:
    signal.signal(s, forward_stop)
  try:
    for index in range(num_workers):
      env["TF_CONFIG"] = tf_config(ports, index)
      processes.append(subprocess.Popen(
          [sys.executable, "-m", module] + worker_args, env=dict(env),
          preexec_fn=_die_with_parent))
    return supervise(processes)
  finally:
    stop_workers(processes)
    for s, handler in previous.items():
      signal.signal(s, handler)


def parse_launcher_flags(argv):
  """Launcher flags before `--`; the trainer's after it, validated now.

  Returns:
    [program, *worker_args]: what `main` launches, already checked as the
    trainer will check it, so a bad flag exits 2 before any worker starts.
  """
  if "--" in argv:
    split = argv.index("--")
    own, trainer_args = argv[:split], argv[split + 1:]
  else:
    own, trainer_args = argv, []
  tfo_flags.parse_or_exit(own, validate=False)
  num_workers = tfo_flags.FLAGS.num_workers
  if num_workers < 2:
    tfo_flags.exit_with_usage_error(
        f"--num_workers={num_workers}: the launcher starts 2 or more workers")
  worker_args = build_worker_args(trainer_args, num_workers)
  tfo_flags.FLAGS.unparse_flags()
  tfo_flags.parse_or_exit(argv[:1] + worker_args)  # exits 2 on a bad flag
  return argv[:1] + worker_args


def main(argv):
  sys.exit(launch(tfo_flags.FLAGS.num_workers, argv[1:]))


def run_main():
  app.run(main, flags_parser=parse_launcher_flags)


if __name__ == "__main__":
  run_main()
