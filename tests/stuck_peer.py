"""A launched job whose worker 1 stays alive but stops taking part.

The fault a launcher cannot see: worker (or rank) 1 keeps running (and, in
TensorFlow, keeps sending the coordination service its heartbeats) but
never reaches the next collective, as with a hung input pipeline. Its
loop's iterator stops handing out batches after a number of steps, so the
others wait in the next all-reduce until the collective timeout ends them.

It reaches the trainers through Python's `sitecustomize` hook: a directory
put first on PYTHONPATH, so that it works through any launcher (both
launchers, torchrun, horovodrun) without a trainer knowing.

  env = stuck_peer_env(tmp_path, package="tfoverlap", after_steps=6,
                       timeout_s=20)
  subprocess.Popen([... "tfoverlap.launch" ...], env=env)

`run_stuck_job` runs such a job through a package's launcher and checks
what both launchers promise of it.
"""

import os
import subprocess
import sys

from overlap_core.runtime import processes
from overlap_core.runtime import run_record

from tests.helpers import REPO_ROOT, subprocess_env

STOPPED_LINE = "stuck_peer: worker 1 stops taking batches"

_SITECUSTOMIZE = '''\
import importlib, json, os, threading


def _worker_index():
  if os.environ.get("TF_CONFIG"):
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  for name in ("HOROVOD_RANK", "RANK"):
    if name in os.environ:
      return int(os.environ[name])
  return None


def _install(package, after_steps):
  loops = importlib.import_module(package + ".loops")
  run_custom_loop = loops.run_custom_loop

  def stalls(iterator):
    for _ in range(after_steps):
      yield next(iterator)
    print({line!r}, flush=True)
    threading.Event().wait()

  def stuck_after(ctx, *, iterator, **kwargs):
    return run_custom_loop(ctx, iterator=stalls(iterator), **kwargs)

  loops.run_custom_loop = stuck_after


if _worker_index() == 1 and os.environ.get("STUCK_PEER_PACKAGE"):
  _install(os.environ["STUCK_PEER_PACKAGE"],
           int(os.environ["STUCK_PEER_AFTER_STEPS"]))
'''.format(line=STOPPED_LINE)


def stuck_peer_env(directory, *, package: str, after_steps: int,
                   timeout_s: int) -> dict:
  """The environment of a job whose worker 1 gets stuck after `after_steps`.

  Args:
    directory: where the hook is written (a test's tmp_path).
    package: "tfoverlap" or "torch_parity": whose `loops` to hook.
    after_steps: the batches worker 1 takes before it stops.
    timeout_s: the collective timeout of the job
      (TFOVERLAP_COLLECTIVE_TIMEOUT_S).
  """
  hook_dir = os.path.join(str(directory), "stuck_peer_hook")
  os.makedirs(hook_dir, exist_ok=True)
  with open(os.path.join(hook_dir, "sitecustomize.py"), "w",
            encoding="utf-8") as f:
    f.write(_SITECUSTOMIZE)
  env = subprocess_env(STUCK_PEER_PACKAGE=package,
                       STUCK_PEER_AFTER_STEPS=str(after_steps),
                       TFOVERLAP_COLLECTIVE_TIMEOUT_S=str(timeout_s))
  env["PYTHONPATH"] = hook_dir + os.pathsep + env["PYTHONPATH"]
  return env


# Long enough that no healthy collective comes near it on a loaded 2-core
# machine (the slowest is the first, while the other worker still starts
# and traces its step: seconds, but a cold start of TensorFlow here has
# taken 20 s and more), short enough for a test. A healthy collective that
# timed out would fail the test, not pass it: the job would end before the
# stuck worker printed that it stopped.
STUCK_TIMEOUT_S = 30
# Start-up of two workers on a loaded host, plus the timeout, plus the
# launcher's grace for stopping the other worker; without the timeout the
# job never ends and this bound fails the test.
STUCK_JOB_BOUND_S = 240 + STUCK_TIMEOUT_S + processes.STOP_GRACE_S


def run_stuck_job(package: str, trainer_args: list, tmp_path, *,
                  unit: str) -> tuple:
  """Runs a two-worker job of `package` whose worker 1 gets stuck, and
  checks that the collective timeout ended it with one line per fact.

  Args:
    package: "tfoverlap" or "torch_parity".
    trainer_args: the trainer's flags, after the launcher's "--".
    tmp_path: the test's directory.
    unit: what the launcher calls a process: "worker" or "rank".

  Returns:
    (the launcher's CompletedProcess, the chief's run record).
  """
  model_dir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "-m", f"{package}.launch", "--num_workers=2", "--",
       *trainer_args, "--train_steps=100000", f"--model_dir={model_dir}"],
      capture_output=True, text=True, timeout=STUCK_JOB_BOUND_S,
      cwd=REPO_ROOT, check=False,
      env=stuck_peer_env(tmp_path, package=package, after_steps=6,
                         timeout_s=STUCK_TIMEOUT_S))
  assert STOPPED_LINE in result.stdout, result.stderr[-3000:]
  assert result.returncode == 1
  said = f"timed out after {STUCK_TIMEOUT_S} s waiting for a peer"
  assert (f"{package}.train: error: CollectiveTimeoutError: {said}"
          in result.stderr)
  # The stuck worker may log its own lost connection after the summary.
  summary = [line for line in result.stderr.splitlines()
             if line.startswith(f"{package}.launch: {unit} ")]
  assert summary == [f"{package}.launch: {unit} 0 exited with status 1 "
                     f"({said}); stopping the other 1 {unit}(s)"], summary
  record = run_record.load_run_record(str(model_dir))
  assert record["status"] == "failed"
  assert record["worker"] == {"index": 0, "num_workers": 2}
  assert record["timeout"]["kind"] == "collective_timeout"
  assert record["timeout"]["timeout_s"] == STUCK_TIMEOUT_S
  return result, record
