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
import shutil
import signal
import socket
import subprocess
import time
from typing import Callable, List

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


# --- What both sides' multi-host tests check --------------------------------
# Each side passes `start(model_dirs, log_dir, *args, **env) -> [host0,
# host1]`, which starts its own kind of host (a TF_CONFIG worker, a
# torchrun node) on the model_dir of that index.


def finished_shared_dir_job(start, tmp_path_factory, name: str, args,
                            timeout_s: float):
  """A finished job of two hosts that share one model_dir, which both
  must end well: that model_dir (a pathlib.Path)."""
  model_dir = tmp_path_factory.mktemp(name)
  logs = tmp_path_factory.mktemp(f"{name}_logs")
  hosts = start([model_dir, model_dir], logs, *args)
  codes = run_all(hosts, timeout_s)
  assert codes == [0, 0], hosts[0].stderr()[-3000:] + hosts[1].stderr()[-3000:]
  return model_dir


def check_single_host_weights(model_dir, single_host_digest: str,
                              num_steps: int) -> dict:
  """Both workers of a finished two-host job ran `num_steps` steps and end
  with the weights of the same job launched on one host.

  Returns:
    The chief's run record.
  """
  chief = run_record.load_run_record(str(model_dir))
  other = run_record.load_run_record(str(model_dir / "worker-1"))
  assert chief["worker"] == {"index": 0, "num_workers": 2}
  assert chief["steps"] == other["steps"] == num_steps
  # --deterministic, the same global batches and one all-reduce order: the
  # same sums in the same order as on one host, so the digests match
  # exactly, not within a tolerance.
  assert chief["weights_digest"] == other["weights_digest"]
  assert chief["weights_digest"] == single_host_digest
  return chief


def run_with_unshared_checkpoint(start, finished_dir, tmp_path, args,
                                 timeout_s: float):
  """Resumes a copy of a finished shared-dir job, but host 1 is given a
  directory of its own (tmp_path/host1_local), where it sees no checkpoint.

  Returns:
    (the hosts, their exit statuses, the copy, host 1's directory).
  """
  shared = tmp_path / "shared"
  shutil.copytree(finished_dir, shared)
  local = tmp_path / "host1_local"
  hosts = start([shared, local], tmp_path, *args)
  return hosts, run_all(hosts, timeout_s), shared, local


def check_unshared_checkpoint_refused(host: Host, program: str, finished_dir,
                                      shared, local) -> str:
  """Host 1 of `run_with_unshared_checkpoint` ended on one line naming
  what it cannot see, and nobody trained.

  Returns:
    That line.
  """
  errors = error_lines(host.stderr(), program)
  assert len(errors) == 1, host.stderr()[-3000:]
  assert errors[0].startswith(
      f"{program}: error: CheckpointNotSharedError: "
      f"{local / 'checkpoints'}: this worker sees no checkpoint, another "
      "resumes from the checkpoint of step 10;"), errors
  # Nobody trained: no new checkpoint anywhere, the chief's still there.
  before = sorted(p.name for p in (finished_dir / "checkpoints").iterdir())
  assert sorted(p.name for p in (shared / "checkpoints").iterdir()) == before
  assert not list(local.glob("**/ckpt-*"))
  return errors[0]


def check_lost_peer_ends_the_other(hosts: List[Host],
                                   wait_for_progress: Callable[[], None],
                                   program: str, bound_s: float) -> None:
  """Once `wait_for_progress()` has seen the collectives live, host 1 is
  killed: host 0 must fail by `bound_s` (the collective timeout that bounds
  a wait on a lost peer, plus shutdown), with one error line."""
  try:
    wait_for_progress()
    kill_host(hosts[1])
    started = time.monotonic()
    code = wait_all(hosts[:1], bound_s)[0]
    ended_s = time.monotonic() - started
  finally:
    stop_all(hosts)
  assert code != 0
  assert ended_s < bound_s
  errors = error_lines(hosts[0].stderr(), program)
  assert len(errors) == 1, hosts[0].stderr()[-3000:]
