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
"""

import os

from tests.helpers import subprocess_env

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
