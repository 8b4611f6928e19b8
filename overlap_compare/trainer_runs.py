"""One trainer run as a subprocess, classified the way a comparison needs.

Each run is its own process, as a user would start it: `python -m
<framework>.train <flags>`, or `python -m <framework>.launch
--num_workers=N -- <flags>` when the flags ask for more than one worker. Its
output goes to files in its model_dir; its run.json is read back. A run
that exits with status 2 was refused by that trainer (a flag value it does
not support), which is not a crash.

This is the one place that knows how a trainer is started and its run read
back, for the comparison and for the benchmarks (`benchmarks.common`) alike:
`TRAINERS` is the one map from framework to trainer and launcher module, and
`run_trainer` the one way to run a trainer process. It lives here, not in
`overlap_core.runtime`, because it is tooling around trainers, not part of
one: its outcomes are the comparison's statuses (OK, FAILED, UNSUPPORTED),
it starts runs through the comparison's `--launcher` templates, and the
trainers' own launchers start their workers another way
(`overlap_core.runtime.processes`). `benchmarks/` is no library and may
import it from here.

  outcome = run_trainer(
      build_command(TRAINERS["pytorch"], ["--prefetch=2"], run_dir),
      run_dir, timeout_s=900)
  outcome.status, outcome.error, outcome.record
"""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from overlap_core.runtime import processes
from overlap_compare.comparison import FAILED, OK, UNSUPPORTED
from overlap_compare.launcher import LauncherTemplate
from overlap_core.runtime.config import USAGE_ERROR_EXIT_CODE
from overlap_core.runtime.run_record import RUN_RECORD_NAME, load_run_record

# The trainers a comparison can run, as `python -m overlap_compare
# --trainers` takes them: framework=trainer module:launcher module. The
# comparison knows them only by these command lines.
DEFAULT_TRAINERS = ("tensorflow=tfoverlap.train:tfoverlap.launch,"
                    "pytorch=torch_parity.train:torch_parity.launch")
# Outputs that are not being compared: each adds work to the steps or the
# process. They come first, so the user's own flags override them.
QUIET_FLAGS = ("--progress=false", "--trace=false", "--tensorboard=false",
               "--evaluate=false")
STOP_GRACE_S = 10.0
STDOUT_NAME = "stdout.log"
STDERR_NAME = "stderr.log"
_ERROR_CHARS = 400


@dataclasses.dataclass(frozen=True)
class Trainer:
  """How to start one framework's trainer.

  Attributes:
    framework: its name in the report, e.g. "pytorch".
    train_module: `python -m <it> <flags>` runs one worker's training.
    launch_module: `python -m <it> --num_workers=N -- <flags>` runs N.
    launcher: when set, every run goes through this command template
      (`overlap_compare.launcher`), which starts the workers itself.
  """
  framework: str
  train_module: str
  launch_module: str
  launcher: Optional[LauncherTemplate] = None


def parse_trainers(spec: str) -> Dict[str, Trainer]:
  """{framework: Trainer} from "name=train.module:launch.module,...".

  Raises:
    ValueError: naming the entry that is not of that form.
  """
  trainers = {}
  for entry in filter(None, (e.strip() for e in spec.split(","))):
    name, _, modules = entry.partition("=")
    train_module, _, launch_module = modules.partition(":")
    if not (name and train_module and launch_module):
      raise ValueError(f"Invalid value for argument `trainers`. Received: "
                       f"{entry!r}; allowed: framework=train.module:"
                       "launch.module")
    if name in trainers:
      raise ValueError(f"Invalid value for argument `trainers`. Received: "
                       f"{name!r} twice; allowed: each framework once")
    trainers[name] = Trainer(name, train_module, launch_module)
  return trainers


# The built-in trainers by framework, for the benchmarks and wherever no
# --trainers was given.
TRAINERS = parse_trainers(DEFAULT_TRAINERS)


@dataclasses.dataclass(frozen=True)
class TrainerRun:
  """How one run ended: status (comparison.OK, FAILED or UNSUPPORTED)."""
  status: str
  error: str
  wall_s: float
  record: Optional[dict]


def _last_value(args: Sequence[str], name: str) -> Optional[str]:
  values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
  return values[-1] if values else None


def build_command(trainer: Trainer, flag_args: Sequence[str],
                  model_dir: str) -> List[str]:
  """The argv that runs `flag_args` with `trainer`, writing to model_dir:
  its launcher when the flags ask for more than one worker, or the
  trainer's launcher template (which then starts every worker) if set."""
  num_workers = _last_value(flag_args, "num_workers")
  args = list(QUIET_FLAGS) + list(flag_args) + [f"--model_dir={model_dir}"]
  if trainer.launcher is not None:
    return trainer.launcher.expand(
        python=sys.executable, module=trainer.train_module,
        framework=trainer.framework, flags=args, model_dir=model_dir)
  if num_workers and num_workers.isdigit() and int(num_workers) > 1:
    args = [a for a in args if not processes.has_flag([a], "num_workers")]
    return [sys.executable, "-m", trainer.launch_module,
            f"--num_workers={num_workers}", "--", *args]
  return [sys.executable, "-m", trainer.train_module, *args]


def _error_line(stderr_text: str) -> str:
  """The line of a trainer's stderr that says what went wrong."""
  lines = [l.strip() for l in stderr_text.splitlines() if l.strip()]
  # The trainers and launchers print "<program>: error: ..." for what they
  # catch; an uncaught exception ends with its own "Type: message" line.
  marked = [l for l in lines if ": error: " in l]
  line = (marked or lines or [""])[-1]
  return line[:_ERROR_CHARS]


def _stop_group(process: subprocess.Popen) -> None:
  """SIGTERM the run's whole process group, SIGKILL after a grace period.

  The group holds the trainer and whatever it started (DDP replicas,
  launched workers), so nothing of a stopped run keeps using the cores.
  """
  for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
    try:
      os.killpg(process.pid, sig)
    except ProcessLookupError:
      return
    try:
      process.wait(timeout=wait_s)
      return
    except subprocess.TimeoutExpired:
      continue


def run_trainer(command: Sequence[str], model_dir: str, *,
                timeout_s: float, env: Optional[dict] = None,
                cwd: Optional[str] = None) -> TrainerRun:
  """Runs one trainer command to completion and reads its run.json.

  Args:
    command: from `build_command`.
    model_dir: where it writes; stdout.log and stderr.log go there too.
    timeout_s: the run is stopped and FAILED after this long.
    env: the environment (default: this process's).
    cwd: the directory it runs in (default: this process's).

  Returns:
    OK with the record, UNSUPPORTED (exit 2) or FAILED with one error line.
  """
  os.makedirs(model_dir, exist_ok=True)
  env = dict(os.environ if env is None else env)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  start = time.perf_counter()
  with open(os.path.join(model_dir, STDOUT_NAME), "w") as out, \
       open(os.path.join(model_dir, STDERR_NAME), "w+") as err:
    process = subprocess.Popen(list(command), stdout=out, stderr=err,
                               env=env, cwd=cwd, start_new_session=True)
    try:
      code = process.wait(timeout=timeout_s)
      timed_out = False
    except subprocess.TimeoutExpired:
      _stop_group(process)
      code, timed_out = process.returncode, True
    except BaseException:
      # Interrupted (Ctrl-C): stop the run rather than orphan it.
      _stop_group(process)
      raise
    wall_s = time.perf_counter() - start
    err.seek(0)
    stderr_text = err.read()
  record_path = os.path.join(model_dir, RUN_RECORD_NAME)
  if timed_out:
    return TrainerRun(FAILED, f"timed out after {timeout_s:.0f} s", wall_s,
                      None)
  if code == USAGE_ERROR_EXIT_CODE:
    return TrainerRun(UNSUPPORTED, _error_line(stderr_text), wall_s, None)
  if code != 0:
    line = _error_line(stderr_text)
    how = processes.describe_exit(code)
    return TrainerRun(FAILED, f"{how}: {line}" if line else how, wall_s,
                      None)
  if not os.path.exists(record_path):
    return TrainerRun(FAILED, f"exited 0 but wrote no {RUN_RECORD_NAME}",
                      wall_s, None)
  return TrainerRun(OK, "", wall_s, load_run_record(record_path))
