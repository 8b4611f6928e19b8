"""Running the project's entry points as real subprocesses in tests."""

import os
import subprocess
import sys

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
