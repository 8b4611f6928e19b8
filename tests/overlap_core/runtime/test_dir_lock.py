"""One writer per directory: the LOCK file, with real processes holding it."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from overlap_core.runtime import dir_lock
from overlap_core.runtime.config import ConfigError

from tests.helpers import REPO_ROOT, subprocess_env, wait_for_line, wait_until

# Holds the directory, forks a child that outlives it (as a data loader
# worker would), says so, then waits until stdin closes. It says so only
# once the child runs Python code: the lock's after-fork handler has then
# closed the child's copy, which an idle, unscheduled child would not have.
_HOLDER = textwrap.dedent("""
    import os, sys
    from overlap_core.runtime import dir_lock
    lock = dir_lock.acquire(sys.argv[1], setting="--model_dir")
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
      os.write(ready_w, b"1")
      sys.stdin.read()
      os._exit(0)
    os.read(ready_r, 1)
    print("held", child, flush=True)
    sys.stdin.read()
""")


def _start_holder(directory: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", _HOLDER, directory],
                          cwd=REPO_ROOT, env=subprocess_env(),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_taken_refused_in_this_process_naming_it_and_released_on_close(
    tmp_path):
  directory = str(tmp_path / "run")
  lock = dir_lock.acquire(directory, setting="--model_dir")
  assert lock.locked
  with open(os.path.join(directory, dir_lock.LOCK_NAME)) as f:
    recorded = json.loads(f.read())
  assert recorded["pid"] == os.getpid()
  assert recorded["host"] == socket.gethostname()

  with pytest.raises(dir_lock.DirectoryInUseError) as refused:
    dir_lock.acquire(directory)  # a second writer, as a Python argument
  message = str(refused.value)
  assert isinstance(refused.value, ConfigError)  # the trainers exit 2
  assert "\n" not in message
  assert message.startswith(f"directory={directory!r}: in use by pid "
                            f"{os.getpid()} on host {socket.gethostname()}, "
                            f"started {recorded['started']}")

  lock.release()
  with dir_lock.acquire(directory, setting="--model_dir") as again:
    assert again.holder.pid == os.getpid()
  dir_lock.acquire(directory).release()  # and the `with` let it go


def test_another_process_is_refused_and_its_death_frees_the_directory(
    tmp_path):
  directory = str(tmp_path / "run")
  holder = _start_holder(directory)
  child = None
  try:
    child = int(wait_for_line(holder.stdout, "held", timeout=60).split()[1])
    with pytest.raises(dir_lock.DirectoryInUseError) as refused:
      dir_lock.acquire(directory, setting="--model_dir")
    assert str(refused.value).startswith(
        f"--model_dir={directory}: in use by pid {holder.pid} on host "
        f"{socket.gethostname()}, started ")
    assert refused.value.holder.pid == holder.pid

    # SIGKILLed, it leaves its LOCK file naming it, and its forked child
    # alive; neither may keep the next writer out.
    holder.kill()
    holder.wait(timeout=60)
    assert _alive(child)
    assert dir_lock.read_holder(directory).pid == holder.pid
    with dir_lock.acquire(directory, setting="--model_dir"):
      assert dir_lock.read_holder(directory).pid == os.getpid()
  finally:
    holder.kill()
    holder.wait(timeout=60)
    holder.stdin.close()  # the orphaned child reads its end and exits
    if child is not None:
      wait_until(lambda: not _alive(child) or _reaped(child),
                 "the holder's child to exit")


def _reaped(pid: int) -> bool:
  # Orphaned, the child is init's to reap; a zombie counts as gone.
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] == "Z"
  except FileNotFoundError:
    return True


def test_a_holder_that_released_lets_another_process_in(tmp_path):
  directory = str(tmp_path / "run")
  with dir_lock.acquire(directory):
    pass
  result = subprocess.run(
      [sys.executable, "-c",
       "import sys; from overlap_core.runtime import dir_lock; "
       "dir_lock.acquire(sys.argv[1]).release(); print('ok')", directory],
      cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True,
      timeout=60, check=False)
  assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
