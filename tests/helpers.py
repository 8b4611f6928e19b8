"""Running the project's entry points as real subprocesses in tests."""

import os
import queue
import subprocess
import sys
import threading
import time

from overlap_core.runtime import processes

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subprocess_env(**extra) -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  env.pop("TF_CONFIG", None)
  env.update(extra)
  return env


def run_module(module: str, *args, timeout: float = 600, cwd=None,
               **env) -> subprocess.CompletedProcess:
  """Runs `python -m module args...` and captures its output."""
  return subprocess.run([sys.executable, "-m", module, *args],
                        capture_output=True, text=True, timeout=timeout,
                        cwd=cwd or REPO_ROOT, env=subprocess_env(**env),
                        check=False)


def run_ranks_script(script: str, out_dir, timeout_s: float) -> None:
  """Runs `python script PORT OUT_DIR` on a free PORT, which must succeed.

  For a test file whose `__main__` spawns its own gloo ranks: they meet on
  PORT and leave what they saw under OUT_DIR for the tests to read.
  """
  (port,) = processes.free_ports(1)
  subprocess.run([sys.executable, script, str(port), str(out_dir)],
                 check=True, cwd=REPO_ROOT, env=subprocess_env(),
                 timeout=timeout_s)


def run_error_line(result: subprocess.CompletedProcess, program: str) -> str:
  """The last line of a command that must have failed at run time (exit 1).

  A failure after the flags were accepted (an unwritable directory, say)
  ends with "<program>: error: ..." and no traceback.
  """
  assert result.returncode == 1, result.stderr
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"{program}: error:"), result.stderr
  return last


def one_line_error(call, *args, error=ValueError, **kwargs) -> str:
  """The message of the `error` that `call(*args, **kwargs)` must raise.

  Asserted to be one line: a refusal is read where it is printed.
  """
  try:
    call(*args, **kwargs)
  except error as raised:
    message = str(raised)
  else:
    raise AssertionError(f"{call.__name__} raised no {error.__name__}")
  assert "\n" not in message, message
  return message


def wait_for_line(stream, needle: str, timeout: float) -> str:
  """The first line of `stream` containing `needle`, within `timeout` s.

  Reads on a daemon thread so a process that never prints the line fails
  the test instead of hanging it.
  """
  found = queue.Queue()

  def read():
    for line in stream:
      if needle in line:
        found.put(line)
        return
    found.put(None)

  threading.Thread(target=read, daemon=True).start()
  try:
    line = found.get(timeout=timeout)
  except queue.Empty:
    line = None
  if line is None:
    raise AssertionError(f"no line with {needle!r} within {timeout} s")
  return line


# Bounds a wait for work that a correct implementation does at once; it is
# reached only when the behaviour under test is broken, so it can be long.
PROGRESS_WAIT_S = 60.0


def wait_until(predicate, what: str, timeout_s: float = PROGRESS_WAIT_S):
  """Polls until `predicate()` holds (progress, not a timer, ends the wait);
  fails the test after `timeout_s`.

  Returns:
    The value of `predicate()` that ended the wait (e.g. a pid it found).
  """
  deadline = time.monotonic() + timeout_s
  while not (value := predicate()):
    if time.monotonic() > deadline:
      raise AssertionError(f"{what}: not within {timeout_s} s")
    time.sleep(0.01)
  return value


_CHECKPOINT_FIELDS = ("every_steps", "keep", "max_overhead_frac", "on_error",
                      "if_busy")


def checkpoint_config(kwargs: dict):
  """The CheckpointConfig a test's engine takes, built from the checkpoint
  settings among `kwargs` (taken out of it): async, every auto, 3 kept,
  unless told."""
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime.config import CHECKPOINT_AUTO, CheckpointConfig
  fields = {"mode": "async", "every_steps": CHECKPOINT_AUTO, "keep": 3}
  fields.update({k: kwargs.pop(k) for k in _CHECKPOINT_FIELDS if k in kwargs})
  return CheckpointConfig(**fields)
