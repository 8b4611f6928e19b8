"""Starting and supervising a job's local processes, framework-neutral.

Both launchers (`tfoverlap.launch`, `torch_parity.launch`) start one process
per worker or rank on this host and hand them to `run_supervised`, which
waits for all of them. The first one that fails or is killed ends the job:
the others are stopped (SIGTERM, then SIGKILL after a grace period) and the
status is non-zero, with one line naming the process and how it died. A dead
peer never leaves the job waiting in a collective.

  status = run_supervised(
      [ProcessSpec(argv=[sys.executable, "-m", "my.trainer"], env=env_0),
       ProcessSpec(argv=[sys.executable, "-m", "my.trainer"], env=env_1)],
      program="my.launch", noun="worker")
"""

import ctypes
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

from overlap_core.runtime import config, failure
from overlap_core.runtime.run_record import (RUN_RECORD_NAME, default_model_dir,
                                             worker_dir)

STOP_GRACE_S = 10.0
POLL_INTERVAL_S = 0.2
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
  """One process of a job: its command line and its whole environment.

  `record_path` is where its run.json goes, if it writes one: a process
  that fails writes a failure record there, which names the cause.
  """
  argv: List[str]
  env: Dict[str, str]
  record_path: Optional[str] = None


# Where Linux says which ports it hands out itself: to `bind(port 0)` and
# to every outgoing connection (32768-60999 by default).
EPHEMERAL_RANGE_PATH = "/proc/sys/net/ipv4/ip_local_port_range"
# Ports picked below that range, at most this many below its start.
PICK_SPAN = 12000
_LOWEST_PICK = 1024


def ephemeral_port_range(path: str = EPHEMERAL_RANGE_PATH) -> Optional[tuple]:
  """(low, high) of the ports the kernel hands out itself, or None where
  the system does not say."""
  try:
    with open(path, encoding="ascii") as f:
      low, high = (int(v) for v in f.read().split()[:2])
  except (OSError, ValueError):
    return None
  return low, high


def free_ports(count: int, *, ephemeral=None) -> list:
  """`count` different ports that nothing is bound to now, on any address.

  A port the kernel picked (`bind` to port 0) is in its ephemeral range,
  which every outgoing connection also draws from: between the pick and
  the server's own bind, another process's connection could take it, and
  a TensorFlow stage server then failed with "Could not start gRPC
  server". So where the kernel says its range, ports are drawn at random
  below it, where only an explicit bind takes a port; elsewhere the
  kernel picks.

  Args:
    count: how many.
    ephemeral: (low, high) of the kernel's range; None reads it.
  """
  ephemeral = ephemeral or ephemeral_port_range()
  if not ephemeral or ephemeral[0] - PICK_SPAN < _LOWEST_PICK:
    return _ports_the_kernel_picks(count)
  draw = random.SystemRandom()
  ports = []
  while len(ports) < count:
    port = draw.randrange(ephemeral[0] - PICK_SPAN, ephemeral[0])
    if port not in ports and nothing_bound_to(port):
      ports.append(port)
  return ports


def nothing_bound_to(port: int) -> bool:
  """Whether `port` is free on every address: bound there for a moment,
  never listening, which fails where any address has the port (a
  listener, or a connection still closing)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    try:
      probe.bind(("", port))
    except OSError:
      return False
  return True


def _ports_the_kernel_picks(count: int) -> list:
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(("localhost", 0))
      sockets.append(s)  # held open together so that they differ
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def cpu_share(num_processes: int) -> int:
  """Cores each of `num_processes` processes gets on this host (at least 1).

  Processes sharing a host oversubscribe its cores with the frameworks'
  default thread pools, which size themselves to the whole machine.
  """
  return max(1, (os.cpu_count() or 1) // num_processes)


def threads_per_process(intra_op_threads: int, num_processes: int) -> int:
  """The intra-op threads each of a job's `num_processes` processes on this
  host runs with: --intra_op_threads when given, else the equal share
  `add_job_defaults` gives every process it launches. Planning asks this
  too, so a profile is timed on the threads a stage will have.
  """
  return intra_op_threads or cpu_share(num_processes)


def die_with_parent():
  """Children get SIGKILL if the launcher itself is killed (Linux only)."""
  try:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:
    pass


def describe_exit(code: int) -> str:
  if code < 0:
    return f"was killed by {signal.Signals(-code).name}"
  return f"exited with status {code}"


def stop_processes(processes: list, grace_s: float = STOP_GRACE_S) -> None:
  """SIGTERM the live processes, then SIGKILL what is left after the grace."""
  live = [p for p in processes if p.poll() is None]
  for p in live:
    p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  for p in live:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def _first_cause(failed: dict) -> int:
  """Of the processes found failed in one poll, the one that caused it.

  A peer of a killed process often fails a moment later with a connection
  error of its own; when both are seen in the same poll, the one killed by
  a signal is the cause the user needs to hear about.
  """
  killed = sorted(i for i, code in failed.items() if code < 0)
  return killed[0] if killed else min(failed)


def describe_failure(code: int, record_path: Optional[str], *,
                     since_s: float) -> str:
  """How a process ended, with the cause its failure record names.

  E.g. "exited with status 1 (timed out after 180 s waiting for a peer)".
  """
  cause = failure.recorded_cause(record_path, since_s=since_s)
  return describe_exit(code) + (f" ({cause})" if cause else "")


def supervise(processes: list, *, program: str, noun: str = "worker",
              record_paths: Optional[list] = None,
              since_s: float = 0.0, names: Optional[list] = None) -> int:
  """Waits for all processes; the first failure stops the rest.

  Args:
    processes: started `subprocess.Popen`s, in index order.
    program: the name the failure line starts with.
    noun: what one process is called in that line ("worker", "rank").
    record_paths: where each process writes its run.json (None: nowhere);
      a failure record written there after `since_s` names the cause.
    since_s: when the job started (time.time()).
    names: what each process is called in that line, for a job whose
      processes differ ("client", "stage 0"); None: "<noun> <index>".

  Returns:
    0 if every process succeeded, else the failed one's status (1 when it
    was killed by a signal).
  """
  remaining = set(range(len(processes)))
  while remaining:
    failed = {}
    for index in sorted(remaining):
      code = processes[index].poll()
      if code is None:
        continue
      remaining.discard(index)
      if code != 0:
        failed[index] = code
    if failed:
      index = _first_cause(failed)
      code = failed[index]
      others = [p for p in processes if p.poll() is None]
      how = describe_failure(
          code, record_paths[index] if record_paths else None,
          since_s=since_s)
      # Status 2 is a usage error, and the process has printed its one
      # line saying which flag and why; a second line would only bury it.
      if code != config.USAGE_ERROR_EXIT_CODE:
        name = names[index] if names else f"{noun} {index}"
        rest = "process(es)" if names else f"{noun}(s)"
        print(f"{program}: {name} {how}; "
              f"stopping the other {len(others)} {rest}",
              file=sys.stderr, flush=True)
      stop_processes(processes)
      return code if code > 0 else 1
    time.sleep(POLL_INTERVAL_S)
  return 0


def run_supervised(specs: List[ProcessSpec], *, program: str,
                   noun: str = "worker",
                   names: Optional[List[str]] = None) -> int:
  """Starts every process, supervises them, and returns the job's status.

  SIGINT and SIGTERM sent to the launcher stop the processes first, so an
  interrupted job leaves nothing running behind it.
  """
  processes = []
  started_s = time.time()
  previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

  def forward_stop(signum, frame):
    del frame
    stop_processes(processes)
    sys.exit(128 + signum)

  for s in previous:
    signal.signal(s, forward_stop)
  try:
    for spec in specs:
      processes.append(subprocess.Popen(spec.argv, env=dict(spec.env),
                                        preexec_fn=die_with_parent))
    return supervise(processes, program=program, noun=noun,
                     record_paths=[spec.record_path for spec in specs],
                     since_s=started_s, names=names)
  finally:
    stop_processes(processes)
    for s, handler in previous.items():
      signal.signal(s, handler)


def has_flag(args: list, name: str) -> bool:
  """Whether `--name` or `--name=...` is among the command-line `args`."""
  return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in args)


def add_job_defaults(args: list, *, framework: str,
                     num_processes: int) -> list:
  """Trainer flags every process of one job must share, unless given.

  One `--model_dir` for the whole job (each process would otherwise stamp
  its own), and thread pools sized to an equal share of the host's cores.
  """
  args = list(args)
  if not has_flag(args, "model_dir"):
    model_name = next((a.split("=", 1)[1] for a in args
                       if a.startswith("--model=")), "small_cnn")
    args.append(f"--model_dir={default_model_dir(framework, model_name)}")
  share = str(threads_per_process(0, num_processes))
  for pool in ("intra_op_threads", "inter_op_threads"):
    if not has_flag(args, pool):
      args.append(f"--{pool}={share}")
  return args


def flag_value(args: list, name: str) -> Optional[str]:
  """The last value of `--name=value` among the command-line `args`."""
  values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
  return values[-1] if values else None


def record_path(args: list, index: int) -> Optional[str]:
  """Where worker `index` of a job run with trainer flags `args` writes its
  run.json (None without --model_dir)."""
  model_dir = flag_value(args, "model_dir")
  if not model_dir:
    return None
  return os.path.join(worker_dir(model_dir, index), RUN_RECORD_NAME)
