"""Several "hosts" on one machine, each started on its own as a user would.

Each host is one command (a trainer with its TF_CONFIG, a torchrun per
node) in a session of its own, so that killing a host kills everything it
started, as a machine that dies would. Output goes to files, read back as
the test goes; waits end on progress (a line appears), never on a timer.

  hosts = [start_host("a", argv_a, env=env_a, log_dir=tmp_path), ...]
  try:
    codes = wait_all(hosts, timeout_s=300)
  finally:
    stop_all(hosts)
"""

import dataclasses
import os
import signal
import socket
import subprocess
import time
from typing import List

from tests import sockets
from overlap_core.runtime import run_record

from tests.helpers import REPO_ROOT, run_module, wait_until

# The second "host": any 127.x.y.z reaches this machine.
HOST_ADDRESSES = ("127.0.0.1", "127.0.0.2")


@dataclasses.dataclass
class Host:
  name: str
  process: subprocess.Popen
  stdout_path: str
  stderr_path: str

  def stdout(self) -> str:
    with open(self.stdout_path, encoding="utf-8", errors="replace") as f:
      return f.read()

  def stderr(self) -> str:
    with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
      return f.read()


def start_host(name: str, argv: List[str], *, env: dict, log_dir) -> Host:
  """Starts one host's command in a new session, logging to files."""
  stdout_path = os.path.join(log_dir, f"{name}.stdout")
  stderr_path = os.path.join(log_dir, f"{name}.stderr")
  with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
    process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out,
                               stderr=err, start_new_session=True)
  return Host(name, process, stdout_path, stderr_path)


def kill_host(host: Host) -> None:
  """SIGKILL to everything the host started: the machine is gone.

  Its whole process tree, not only its session: torchrun starts each worker
  in a session of its own.
  """
  doomed = [host.process.pid] + sockets.descendants(host.process.pid)
  for pid in doomed:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  try:
    os.killpg(host.process.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  host.process.wait()


def stop_all(hosts: List[Host]) -> None:
  for host in hosts:
    kill_host(host)


def wait_all(hosts: List[Host], timeout_s: float) -> List[int]:
  """Every host's exit status; fails the test if any runs past timeout_s."""
  deadline = time.monotonic() + timeout_s
  codes = []
  for host in hosts:
    try:
      codes.append(host.process.wait(
          timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
      raise AssertionError(f"host {host.name} still running after "
                           f"{timeout_s} s:\n{host.stderr()[-2000:]}"
                           ) from None
  return codes


def run_all(hosts: List[Host], timeout_s: float) -> List[int]:
  """`wait_all`, then every host stopped, so that a failed wait leaves no
  process behind."""
  try:
    return wait_all(hosts, timeout_s)
  finally:
    stop_all(hosts)


def launched_digest(launcher: str, trainer_args: List[str], model_dir,
                    timeout_s: float) -> str:
  """The weights digest of a 2-worker job launched on one host by
  `python -m launcher`: what the same job over two hosts must match."""
  result = run_module(launcher, "--num_workers=2", "--", *trainer_args,
                      f"--model_dir={model_dir}", timeout=timeout_s)
  assert result.returncode == 0, result.stderr[-3000:]
  return run_record.load_run_record(str(model_dir))["weights_digest"]


def wait_for_output(host: Host, needle: str, timeout_s: float) -> None:
  """Waits until the host's stdout holds `needle` (its progress)."""
  wait_until(lambda: needle in host.stdout() or host.process.poll()
             is not None, f"{needle!r} from host {host.name}", timeout_s)
  assert needle in host.stdout(), host.stderr()[-3000:]


def ports_free_everywhere(ports) -> bool:
  """Whether each port can be bound on every interface now (TensorFlow's
  gRPC servers bind 0.0.0.0)."""
  bound = []
  try:
    for port in ports:
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      bound.append(s)
      s.bind(("", port))
    return True
  except OSError:
    return False
  finally:
    for s in bound:
      s.close()


def error_lines(text: str, program: str) -> List[str]:
  """The one-line errors a trainer printed ("<program>: error: ...")."""
  return [line for line in text.splitlines()
          if line.startswith(f"{program}: error: ")]
