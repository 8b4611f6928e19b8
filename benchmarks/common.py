"""What every benchmark shares: running trainers, reading run.json, reporting.

Trainer runs are separate processes (`python -m tfoverlap.train`), started
and read back by the comparison's runner (`overlap_compare.trainer_runs`),
so both tools run a trainer one way. They run as a user runs them, so
each one pays its own start-up and none inherits another's thread pools or
tf.data autotuning state. Results are medians over repeats
whose variants were interleaved, because these machines are shared and noisy:
a slow minute then hits every variant alike instead of one.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from overlap_compare import comparison
from overlap_compare import trainer_runs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results")

# The trainers and how their runs are started and read back: one place,
# shared with the comparison (see overlap_compare.trainer_runs). The quiet
# flags turn off outputs that are not being measured: each would add work to
# the steps or to the process, and the plain Keras baseline has none of them.
QUIET_TRAINER_FLAGS = trainer_runs.QUIET_FLAGS
TRAINER_MODULES = {name: trainer.train_module
                   for name, trainer in trainer_runs.TRAINERS.items()}
LAUNCHER_MODULES = {name: trainer.launch_module
                    for name, trainer in trainer_runs.TRAINERS.items()}
PROCESS_TIMEOUT_S = 900
_STDERR_TAIL_CHARS = 3000

T = TypeVar("T")


class BenchmarkError(RuntimeError):
  """A benchmark process failed; the message carries its command and stderr."""


def subprocess_env() -> Dict[str, str]:
  env = dict(os.environ)
  # TensorFlow's INFO lines are noise in captured output; errors still show.
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return env


def children_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def children_minor_faults() -> int:
  """Page faults served without I/O, over the reaped children: a fresh
  page of memory costs one."""
  return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt


def own_cpu_s() -> float:
  """This process's CPU and its reaped children's."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime + children_cpu_s()


def own_minor_faults() -> int:
  """`children_minor_faults`, with this process's own."""
  return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt
          + children_minor_faults())


def live_children_cpu_s() -> float:
  """CPU of this process's children that still run, with what the
  children they reaped used: a long-lived helper (`in_process_sides`)
  that RUSAGE_CHILDREN counts only once it is waited for. From
  /proc/<pid>/stat (utime, stime, cutime, cstime); 0 without /proc."""
  me = os.getpid()
  total_ticks = 0
  try:
    pids = [name for name in os.listdir("/proc") if name.isdigit()]
  except OSError:
    return 0.0
  for pid in pids:
    try:
      with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    except OSError:
      continue  # exited since the listing
    # The command name (field 2) may hold spaces; fields resume after ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    if int(fields[1]) == me:  # ppid
      total_ticks += sum(int(v) for v in fields[11:15])
  return total_ticks / os.sysconf("SC_CLK_TCK")


def read_host_cpu_s() -> Tuple[Optional[float], Optional[float]]:
  """Seconds since boot the host's CPUs spent busy, and lost to steal,
  from /proc/stat; (None, None) where it cannot be read."""
  try:
    with open("/proc/stat", encoding="utf-8") as f:
      fields = [int(v) for v in f.readline().split()[1:]]
  except (OSError, ValueError):
    return None, None
  user, nice, system, _, _, irq, softirq, steal = (fields + [0] * 8)[:8]
  ticks = os.sysconf("SC_CLK_TCK")
  return (user + nice + system + irq + softirq) / ticks, steal / ticks


def host_cpu_s() -> Dict[str, float]:
  """`read_host_cpu_s` as {"busy", "steal"}, NaN where it cannot be read."""
  busy_s, steal_s = read_host_cpu_s()
  return {"busy": float("nan") if busy_s is None else busy_s,
          "steal": float("nan") if steal_s is None else steal_s}


def _measured(run: Callable[[], T], *,
              cpu_s: Callable[[], float] = children_cpu_s,
              minor_faults: Callable[[], int] = children_minor_faults
              ) -> Tuple[T, dict]:
  """Calls `run`, which starts one process and waits for it, and returns
  its result with that process's costs (`cpu_s` and `minor_faults` read
  whose: by default the reaped children's).

  Returns:
    (what `run` returned, {"process_wall_s", "process_cpu_s",
    "process_minor_faults", "foreign_cpu_s", "steal_s"}): process cpu is
    user + system time of the process and minor faults its page faults
    served without I/O (children run one at a time, so the change in
    RUSAGE_CHILDREN is exactly this one's). foreign cpu is what the rest of
    the host burned meanwhile (other users' work: these machines are
    shared) and steal what the hypervisor took; both say how much a run was
    disturbed.
  """
  cpu_before = cpu_s()
  faults_before = minor_faults()
  host_before = host_cpu_s()
  start = time.perf_counter()
  result = run()
  wall_s = time.perf_counter() - start
  host_after = host_cpu_s()
  process_cpu_s = cpu_s() - cpu_before
  return result, {
      "process_wall_s": wall_s, "process_cpu_s": process_cpu_s,
      "process_minor_faults": minor_faults() - faults_before,
      "foreign_cpu_s": max(0.0, host_after["busy"] - host_before["busy"]
                           - process_cpu_s),
      "steal_s": host_after["steal"] - host_before["steal"]}


def measure_in_this_process(run: Callable[[], T]) -> Tuple[T, dict]:
  """`_measured` for work that runs in this process (and children it
  reaps before returning, such as a loader's workers): the same costs
  under the same names, as if `run` had been a process of its own."""
  return _measured(run, cpu_s=own_cpu_s, minor_faults=own_minor_faults)


def run_process(args: Sequence[str], timeout_s: float = PROCESS_TIMEOUT_S
                ) -> dict:
  """Runs a Python module that is not a trainer (a probe, a plain
  baseline) from the repository root and waits; trainers go through
  `run_trainer_record`.

  Returns:
    {"stdout"} and the process's costs (see `_measured`).

  Raises:
    BenchmarkError: non-zero exit or time-out, with the end of stderr.
  """
  def run():
    try:
      return subprocess.run([sys.executable, *args], cwd=REPO_ROOT,
                            env=subprocess_env(), capture_output=True,
                            text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
      raise BenchmarkError(f"timed out after {timeout_s:.0f}s: "
                           f"{' '.join(args)}") from e

  done, stats = _measured(run)
  if done.returncode != 0:
    raise BenchmarkError(
        f"exit {done.returncode}: {' '.join(args)}\n"
        f"{done.stderr[-_STDERR_TAIL_CHARS:]}")
  return {"stdout": done.stdout, **stats}


def run_process_json(args: Sequence[str], result_json: str,
                     timeout_s: float = PROCESS_TIMEOUT_S) -> Tuple[dict, dict]:
  """`run_process` for a module that writes its results to `result_json`;
  (what it wrote, the process's costs).

  Raises:
    BenchmarkError: as `run_process`, and when the process exited 0 but
      wrote nothing (a flag that only prints help, say), with its output's
      end rather than a missing-file traceback.
  """
  process = run_process(args, timeout_s)
  if not os.path.exists(result_json):
    raise BenchmarkError(
        f"exit 0 but no {os.path.basename(result_json)} written: "
        f"{' '.join(args)}\n{process['stdout'][-_STDERR_TAIL_CHARS:]}")
  with open(result_json, encoding="utf-8") as f:
    return json.load(f), process


def run_plain_baseline(result_json: Optional[str],
                       run: Callable[[object], dict]) -> dict:
  """The main of a plain baseline (`plain_keras_fit`, `plain_torch_loop`):
  the parsed trainer flags' config through `run`, whose result is written
  to `result_json` as the trainers write run.json, so that the drivers
  read both sides' results the same way. A refusal (`ConfigError`) exits
  2 with its one line, as the trainers' does; a missing --result_json
  too.

  Returns:
    What `run` returned.
  """
  # pylint: disable=g-import-not-at-top
  from absl import logging
  import flags as tfo_flags
  from overlap_core.runtime import run_record
  from overlap_core.runtime.config import ConfigError
  # pylint: enable=g-import-not-at-top
  if not result_json:
    tfo_flags.exit_with_usage_error("--result_json is required")
  config = tfo_flags.to_config(tfo_flags.FLAGS)
  logging.set_verbosity(logging.WARNING)
  try:
    result = run(config)
  except ConfigError as e:
    tfo_flags.exit_with_config_error(e)
  run_record.write_json_atomically(result_json, result)
  return result


def run_trainer_record(trainer_flags: Sequence[str], model_dir: str, *,
                       module: str = TRAINER_MODULES["tensorflow"],
                       launcher_flags: Optional[Sequence[str]] = None
                       ) -> Tuple[dict, dict]:
  """One trainer run, by `trainer_runs.run_trainer`; (its run.json, its
  process's costs as `_measured` gives them).

  Args:
    trainer_flags: the trainer's flags; QUIET_TRAINER_FLAGS and
      `--model_dir` are added.
    model_dir: where the run writes, its stdout.log and stderr.log too;
      run.json is read from its top (the chief's, or rank 0's, in a
      launched job).
    module: the trainer (`tfoverlap.train`, `torch_parity.train`) or, with
      `launcher_flags`, a launcher (`tfoverlap.launch`,
      `torch_parity.launch`). Both trainers write the same run.json schema.
    launcher_flags: the launcher's own flags, which go before `--`; the
      trainer flags follow it and reach every worker.

  Raises:
    BenchmarkError: the run failed, was refused (exit 2) or timed out; with
      the command and the end of its stderr. A benchmark compares runs
      that all completed, so any other outcome ends it.
  """
  trainer_args = [*QUIET_TRAINER_FLAGS, *trainer_flags,
                  f"--model_dir={model_dir}"]
  if launcher_flags is None:
    args = ["-m", module, *trainer_args]
  else:
    args = ["-m", module, *launcher_flags, "--", *trainer_args]
  run, stats = _measured(lambda: trainer_runs.run_trainer(
      [sys.executable, *args], model_dir, timeout_s=PROCESS_TIMEOUT_S,
      env=subprocess_env(), cwd=REPO_ROOT))
  if run.status != comparison.OK:
    with open(os.path.join(model_dir, trainer_runs.STDERR_NAME),
              encoding="utf-8", errors="replace") as f:
      stderr_tail = f.read()[-_STDERR_TAIL_CHARS:]
    # "unsupported" (exit 2, a flag value the trainer refuses) or "failed"
    # (a crash, a time-out), then the comparison's one-line cause.
    raise BenchmarkError(f"{run.status} ({run.error}): {' '.join(args)}\n"
                         f"{stderr_tail}")
  return run.record, stats


def run_trainer(trainer_flags: Sequence[str], model_dir: str, *,
                module: str = TRAINER_MODULES["tensorflow"],
                launcher_flags: Optional[Sequence[str]] = None) -> dict:
  """One trainer run (see `run_trainer_record`); returns
  `summarize_record` of its run.json with the process's costs added."""
  record, stats = run_trainer_record(trainer_flags, model_dir, module=module,
                                     launcher_flags=launcher_flags)
  summary = summarize_record(record)
  summary.update(stats)
  return summary


def make_run_dir(scratch_root: str, name: str) -> str:
  """A new directory under `scratch_root` for one run, named from `name`.

  Never one that exists: a busy repeat that the harness runs again must
  not find the discarded run's files (a trainer would resume from its
  checkpoints).
  """
  return tempfile.mkdtemp(prefix=f"{name}-", dir=scratch_root)


def process_stats(process: dict) -> dict:
  return {k: v for k, v in process.items() if k != "stdout"}


def summarize_record(record: dict) -> dict:
  """The fields of a run.json that the benchmarks compare."""
  phases = record["phases"]

  def phase(name):
    stats = phases.get(name, {})
    return {"p50_ms": 1e3 * stats.get("p50", 0.0),
            "mean_ms": 1e3 * stats.get("mean", 0.0),
            "fraction": stats.get("fraction", 0.0)}

  return {
      "framework": record.get("framework"),
      "num_params": record.get("model", {}).get("num_params"),
      "samples_per_second": record["samples_per_second"],
      "warmup_steps": record["warmup_steps"],
      "measured_steps": record["measured_steps"],
      "wall_s": record["wall_s"],
      "step": phase("step"),
      "data_wait": phase("data_wait"),
      "compute": phase("compute"),
      "checkpoint_stall": phase("checkpoint_stall"),
      "other": phase("other"),
      # The process tree's CPU work per step and the bound it sets.
      "cpu": record.get("cpu"),
      "final": record.get("final", {}),
      # A pipelined run's stages, bubble and its parts; None otherwise.
      "pipeline": record.get("pipeline"),
  }


def median(values: Sequence[float]) -> float:
  return statistics.median(values) if values else float("nan")


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def ram_gib() -> float:
  try:
    with open("/proc/meminfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return int(line.split()[1]) / (1024 * 1024)
  except OSError:
    pass
  return float("nan")


def _version(package: str) -> Optional[str]:
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return None


# Where a copy of the library has no .git (a working tree carried to a GPU
# machine), the commit it was made from can be given here.
COMMIT_ENV = "TFOVERLAP_COMMIT"


def library_commit() -> str:
  """The library's commit: from git, else from $TFOVERLAP_COMMIT, else
  "unknown"; "+dirty" marks a working tree that differs from it."""
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=10,
                          check=False)
    if head.returncode == 0 and head.stdout.strip():
      status = subprocess.run(
          ["git", "status", "--porcelain", "--untracked-files=no"],
          cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
          check=False)
      dirty = "+dirty" if status.stdout.strip() else ""
      return head.stdout.strip() + dirty
  except (OSError, subprocess.TimeoutExpired):
    pass  # no git on this machine
  return os.environ.get(COMMIT_ENV) or "unknown"


def describe_machine() -> dict:
  """Read without importing TensorFlow: this driver process stays light."""
  return {
      "commit": library_commit(),
      "date": datetime.date.today().isoformat(),
      "cpu_model": cpu_model(),
      "cpu_count": os.cpu_count(),
      "ram_gib": round(ram_gib(), 1),
      "python": platform.python_version(),
      "tensorflow": _version("tensorflow") or _version("tensorflow-cpu"),
      "keras": _version("keras"),
      "torch": _version("torch"),
      "horovod": _version("horovod"),
      "gpu": "none detected" if not os.path.exists("/dev/nvidia0") else
             "present",
      "load_average_at_start": os.getloadavg(),
  }


# Busy repeats run again, at most this many per group: on the 2-core VM
# these results come from, about one run in six had the hypervisor take
# more than 10% of the cores (checkpoint_overhead_quiet.json), so a few
# redos replace the disturbed repeats of a 5-repeat run at a bounded cost.
REDO_BUSY_REPEATS = 2


def make_parser(doc: str, *, repeats: int,
                resummarize: bool = False) -> argparse.ArgumentParser:
  """A driver's parser: its module docstring as help, and the common flags."""
  parser = argparse.ArgumentParser(
      description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  add_common_args(parser, repeats=repeats, resummarize=resummarize)
  return parser


def add_list_arg(parser: argparse.ArgumentParser, name: str, *, default,
                 allowed, what: str) -> None:
  """A comma-separated --name whose help lists what is `allowed`."""
  parser.add_argument(f"--{name}", default=",".join(default),
                      help=f"Comma-separated {what}: " + ", ".join(allowed))


def add_synthetic_job_args(parser: argparse.ArgumentParser) -> None:
  """--model, --image_size and --batch_size of a job on synthetic images,
  whose input costs next to nothing (see `synthetic_job_flags`)."""
  parser.add_argument("--model", default="small_cnn")
  parser.add_argument("--image_size", type=int, default=16)
  parser.add_argument("--batch_size", type=int, default=64)


def synthetic_job_flags(args) -> List[str]:
  """The trainer flags of `add_synthetic_job_args`'s job.

  Synthetic data: its decode is a few random numbers per pixel, so the
  pipeline costs next to nothing and what a benchmark adds or removes is
  what it studies.
  """
  return [f"--model={args.model}", "--dataset=synthetic",
          f"--image_size={args.image_size}", f"--batch_size={args.batch_size}"]


def add_common_args(parser: argparse.ArgumentParser, *, repeats: int,
                    resummarize: bool = False) -> None:
  """The flags every driver takes; with `resummarize`, --resummarize too
  (see `harness.main`)."""
  parser.add_argument("--quick", action="store_true",
                      help="A smoke run of about a minute: fewer steps and "
                      "repeats; its numbers are not for reporting.")
  parser.add_argument("--repeats", type=int, default=None,
                      help=f"Interleaved repeats (default {repeats}, 1 with "
                      "--quick).")
  parser.add_argument("--redo_busy", type=int, default=REDO_BUSY_REPEATS,
                      help="How many repeats of each interleaved group (a "
                      "preset, a section) to run again when the host was "
                      "busy during them (see harness.py); 0 keeps "
                      f"every repeat (default {REDO_BUSY_REPEATS}).")
  parser.add_argument("--output", default=None,
                      help="Result JSON path (default "
                      "benchmarks/results/<name>.json; --quick writes "
                      "<name>.quick.json so a smoke run never replaces a full "
                      "result).")
  if resummarize:
    parser.add_argument("--resummarize", metavar="RESULT_JSON",
                        help="Recompute the summary of an existing result "
                        "file from its runs, rewrite it and print the "
                        "tables; runs nothing.")


def resolve_repeats(args, default: int) -> int:
  if args.repeats is not None:
    if args.repeats < 1:
      raise SystemExit(f"--repeats={args.repeats}: allowed: >= 1")
    return args.repeats
  return 1 if args.quick else default


def result_path(name: str, args) -> str:
  if args.output:
    return args.output
  suffix = ".quick.json" if args.quick else ".json"
  return os.path.join(RESULTS_DIR, name + suffix)


def write_results(path: str, payload: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(payload, f, indent=2, sort_keys=True)
    f.write("\n")


def command_line() -> str:
  """How this benchmark was started, as one would retype it."""
  module = sys.modules["__main__"].__spec__
  name = module.name if module else os.path.basename(sys.argv[0])
  return " ".join(["python -m", name, *sys.argv[1:]])


def format_table(headers: List[str], rows: List[List]) -> str:
  """A fixed-width text table; floats get 3 significant decimals."""
  def cell(value):
    if isinstance(value, float):
      return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)

  text_rows = [[cell(v) for v in row] for row in rows]
  widths = [max(len(h), *(len(r[i]) for r in text_rows)) if text_rows
            else len(h) for i, h in enumerate(headers)]
  lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)),
           "  ".join("-" * w for w in widths)]
  lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths))
            for r in text_rows]
  return "\n".join(lines)


def log(message: str) -> None:
  """Progress on stderr, flushed: full runs take minutes."""
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr,
        flush=True)


# The workloads both framework benchmarks run, so their numbers line up.
TRAINER_PRESETS = {
    "small_cnn_digits_default": {
        "flags": ["--model=small_cnn", "--dataset=digits", "--image_size=16",
                  "--batch_size=64", "--strategy=default"],
        "train_steps": 150, "quick_train_steps": 30,
    },
    "resnet18_synthetic32_resident_default": {
        "flags": ["--model=resnet18", "--dataset=synthetic",
                  "--image_size=32", "--batch_size=32",
                  "--synthetic_on_device", "--strategy=default"],
        "train_steps": 40, "quick_train_steps": 12,
    },
}


def parse_with_trainer_flags(parser: argparse.ArgumentParser):
  """(args, trainer flags): what the parser does not know passes through."""
  args, passthrough = parser.parse_known_args()
  bad = [a for a in passthrough if not a.startswith("--")]
  if bad:
    parser.error(f"unexpected arguments {bad}; trainer flags take the form "
                 "--name=value")
  return args, passthrough


# Workloads sized for one large GPU, which runs only when named (the GPU
# campaign names them): on a CPU host a step of them takes seconds.
GPU_TRAINER_PRESETS = {
    "resnet50_synthetic224_resident_default": {
        "flags": ["--model=resnet50", "--dataset=synthetic",
                  "--image_size=224", "--batch_size=128",
                  "--synthetic_on_device", "--strategy=default"],
        "train_steps": 120, "quick_train_steps": 30,
    },
}


def build_preset_configs(names: str, passthrough, *, quick: bool) -> dict:
  """Preset name -> {"flags", "train_steps"}, for comma-separated `names`.

  A flag in `passthrough` follows the preset's, so it replaces the preset's
  value of the same flag (absl keeps the last).
  """
  presets = {**TRAINER_PRESETS, **GPU_TRAINER_PRESETS}
  configs = {}
  for name in [c for c in names.split(",") if c]:
    if name not in presets:
      raise SystemExit(f"--configs: unknown {name!r}; allowed: "
                       f"{', '.join(presets)}")
    preset = presets[name]
    configs[name] = {
        "flags": preset["flags"] + list(passthrough),
        "train_steps": (preset["quick_train_steps"] if quick
                        else preset["train_steps"]),
    }
  return configs
