"""python -m overlap_compare: overlap combinations x frameworks, side by side.

  python -m overlap_compare \\
      --matrix="prefetch=0,2;checkpoint=sync,async;strategy=default,mirrored" \\
      --workloads="preprocess_cost_ms=0,1" --frameworks=tensorflow,pytorch \\
      --repeats=3 --output_dir=report -- --model=small_cnn --train_steps=60

Every cell of the matrix (see `overlap_compare.matrix` for the grammar) runs
in every framework and workload, `--repeats` times, each run its own trainer
subprocess with the same flags: those after `--`, the workload's, the
cell's. Repeats are interleaved (a slow minute of a shared machine then
hits every cell alike) and reported as medians. A run that crashes or
times out is recorded as failed and the rest go on; one its trainer refuses
(exit status 2) is recorded as not supported by that framework. The output
directory gets report.md, results.csv, runs.csv and PNG plots, with every
run's directory under runs/.

`--autotune` searches the same matrix by successive halving for the fastest
cell that meets `--max_data_wait_frac`, `--max_checkpoint_interval_s` and
`--max_checkpoint_stall_frac`, and writes it as an absl flagfile
(`best_<framework>.flags`) for `python -m tfoverlap.train --flagfile=...`.

Exit status: 0 when every cell ran or was refused, 1 when a cell failed
(or auto-tune found no feasible cell), 2 for a bad flag or matrix.
"""

import copy
import dataclasses
import json
import os
import shlex
import sys
import time
from typing import Dict, List, Sequence

from absl import app
from absl import flags as absl_flags

import flags as tfo_flags
from overlap_compare import autotune_runs as compare_autotune
from overlap_compare import report as compare_report
from overlap_compare import comparison
from overlap_compare import launcher as launcher_lib
from overlap_compare import matrix as matrix_lib
from overlap_compare import autotune
from overlap_compare import metrics as overlap_metrics
from overlap_core.runtime import compat, compat_table, run_record
from overlap_compare import trainer_runs
from overlap_core.runtime.config import ConfigError
from overlap_compare import plan as compare_plan
from overlap_compare.plan import Plan
from overlap_compare.matrix import Cell, MatrixSpecError

tfo_flags.define_flags()

PROGRAM = "overlap_compare"
PLAN_NAME = "compare.json"
OUTCOMES_NAME = "outcomes.jsonl"

_MATRIX = absl_flags.DEFINE_string(
    "matrix", "",
    "Optimization axes: 'flag=v0,v1;flag2=w0,w1'. The first setting of each "
    "axis is its baseline (off). Several flags move together as "
    "'a+b=x0+y0,x1+y1'.")
_WORKLOADS = absl_flags.DEFINE_string(
    "workloads", "",
    "Workload axes, same grammar: conditions that are not optimizations "
    "(e.g. preprocess_cost_ms=0,2). Each workload point is its own group "
    "with its own baseline.")
_FRAMEWORKS = absl_flags.DEFINE_list(
    "frameworks", ["tensorflow", "pytorch"],
    "Frameworks to run every cell in: tensorflow, pytorch.")
_TRAINERS = absl_flags.DEFINE_string(
    "trainers", trainer_runs.DEFAULT_TRAINERS,
    "The trainer each framework name runs, as framework=train.module:"
    "launch.module, comma-separated; --frameworks picks among them.")
_LAUNCHER = absl_flags.DEFINE_string(
    "launcher", "",
    "Start every run through this command, e.g. 'srun -N2 {command}': "
    "{command} is the trainer's command line, {flags} its flags alone "
    "(see overlap_compare.launcher). Empty: local processes.")
_REPEATS = absl_flags.DEFINE_integer(
    "repeats", 3, "Runs of every cell; the report gives medians.",
    lower_bound=1)
_OUTPUT_DIR = absl_flags.DEFINE_string(
    "output_dir", "",
    "Report directory. Empty: runs/compare-<timestamp>.")
_RUN_TIMEOUT_S = absl_flags.DEFINE_float(
    "run_timeout_s", 900.0, "A run taking longer is stopped and failed.",
    lower_bound=1.0)
_NOISE_FLOOR = absl_flags.DEFINE_float(
    "noise_floor", overlap_metrics.DEFAULT_NOISE_FLOOR,
    "Smallest relative slow-down reported as one (0.05 = 5%); a cell's own "
    "spread across repeats raises it.", lower_bound=0.0)
_PLOTS = absl_flags.DEFINE_boolean("plots", True, "Draw the PNG plots.")
_TITLE = absl_flags.DEFINE_string("title", "Overlap comparison",
                                  "The report's title.")
_REPORT_ONLY = absl_flags.DEFINE_boolean(
    "report_only", False,
    "Run nothing: rewrite the report of --output_dir from its "
    f"{PLAN_NAME}, {OUTCOMES_NAME} and run.json files.")
_AUTOTUNE = absl_flags.DEFINE_boolean(
    "autotune", False,
    "Search the matrix by successive halving for the fastest cell meeting "
    "the --max_* constraints; write it as best_<framework>.flags.")
_AUTOTUNE_MIN_STEPS = absl_flags.DEFINE_integer(
    "autotune_min_steps", 30,
    "Train steps of the first rung; the last rung trains the trainers' "
    "--train_steps.", lower_bound=1)
_AUTOTUNE_ETA = absl_flags.DEFINE_integer(
    "autotune_eta", 2,
    "Each rung keeps the fastest 1/eta of the cells and trains eta times "
    "longer.", lower_bound=2)
_MAX_DATA_WAIT_FRAC = absl_flags.DEFINE_float(
    "max_data_wait_frac", None,
    "Constraint: data wait at most this share of the step (0.05 = 5%).",
    lower_bound=0.0, upper_bound=1.0)
_MAX_CHECKPOINT_INTERVAL_S = absl_flags.DEFINE_float(
    "max_checkpoint_interval_s", None,
    "Constraint: a checkpoint at least every this many seconds (cadence "
    "times the mean step).", lower_bound=0.0)
_MAX_CHECKPOINT_STALL_FRAC = absl_flags.DEFINE_float(
    "max_checkpoint_stall_frac", None,
    "Constraint: checkpoint stall at most this share of the step.",
    lower_bound=0.0, upper_bound=1.0)

COMPARE_FLAGS = ("matrix", "workloads", "frameworks", "trainers", "launcher",
                 "repeats",
                 "output_dir",
                 "run_timeout_s", "noise_floor", "plots", "title",
                 "report_only", "autotune", "autotune_min_steps",
                 "autotune_eta", "max_data_wait_frac",
                 "max_checkpoint_interval_s", "max_checkpoint_stall_frac")


def trainer_flag_names() -> List[str]:
  return sorted(n for names in tfo_flags.flag_names().values() for n in names)


def _fresh_trainer_flags() -> absl_flags.FlagValues:
  """The trainers' flags (and absl's own), apart from the global FLAGS.

  Every cell's command line is parsed here exactly as its trainer will
  parse it, without touching the values this command itself was given.
  """
  values = absl_flags.FlagValues()
  for name, flag in tfo_flags.FLAGS._flags().items():  # pylint: disable=protected-access
    if name == flag.name and name not in COMPARE_FLAGS:
      values[name] = copy.deepcopy(flag)
  return values


def check_trainer_args(args: Sequence[str]) -> absl_flags.FlagValues:
  """Parses and validates one run's trainer flags, as the trainer will.

  Raises:
    ConfigError or absl_flags.Error: what the shared flag surface refuses,
      or a combination every framework refuses (`check_shared_combinations`).
  """
  values = _fresh_trainer_flags()
  values(["trainer", *args])
  check_shared_combinations(tfo_flags.to_config(values))
  return values


def check_shared_combinations(config) -> None:
  """Refuses a run whose features every framework refuses together, by one
  shared row of the compatibility table (as the flags once did): no
  trainer could run it, so the matrix is wrong, not one framework. What
  only one framework refuses is its to refuse when the cell runs, and the
  report says "not supported by" it.

  Raises:
    ConfigError: the row's one line (`compat.refusal`).
  """
  shared = [row for row in compat.matching_rows(config, compat_table.TF)
            if set(row.frameworks) == set(compat_table.BOTH)]
  if shared:
    raise compat.refusal(shared[0], config)


def validate_plan(plan: Plan, trainers: Dict[str, trainer_runs.Trainer]
                  ) -> None:
  """Refuses what would fail in every framework, before anything runs.

  Raises:
    MatrixSpecError: naming the flag, the cell or the framework at fault.
  """
  known = trainer_flag_names()
  matrix_lib.check_flag_names(plan.matrix.axes, known)
  matrix_lib.check_flag_names(plan.workloads.axes, known,
                              what="--workloads")
  for framework in plan.frameworks:
    if plan.frameworks.count(framework) > 1:
      raise MatrixSpecError(f"--frameworks names {framework!r} twice")
    if framework not in trainers:
      raise MatrixSpecError(f"--frameworks: {framework!r} is not a framework"
                            f"; allowed: {', '.join(trainers)} (--trainers)")
  overlap = set(plan.matrix.flag_names()) & set(plan.workloads.flag_names())
  if overlap:
    raise MatrixSpecError(f"--workloads and --matrix both set "
                          f"{sorted(overlap)[0]!r}; allowed: one of them")
  varied = set(plan.matrix.flag_names()) | set(plan.workloads.flag_names())
  for arg in plan.trainer_args:
    name = arg.lstrip("-").split("=", 1)[0]
    if name == "model_dir":
      raise MatrixSpecError(f"{arg}: the comparison sets --model_dir for "
                            "every run; use --output_dir")
    if name in varied:
      raise MatrixSpecError(f"{arg} after '--' is also an axis; allowed: "
                            "a flag either varies or is fixed")
  for workload in plan.workloads.cells():
    for cell in plan.matrix.cells():
      try:
        check_trainer_args(plan.run_args(workload, cell))
      except (ConfigError, absl_flags.Error) as e:
        where = plan.matrix.full_label(cell)
        if plan.workloads.axes:
          where += ", " + plan.workloads.full_label(workload)
        raise MatrixSpecError(f"cell [{where}]: {e}") from e


def _log(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr,
        flush=True)


def _minutes(seconds: float) -> str:
  return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _outcome_line(outcome: comparison.RunOutcome, output_dir: str) -> str:
  return json.dumps({
      "framework": outcome.framework,
      "workload": list(outcome.workload.choices),
      "cell": list(outcome.cell.choices), "repeat": outcome.repeat,
      "status": outcome.status,
      "run_dir": os.path.relpath(outcome.run_dir, output_dir),
      "error": outcome.error, "wall_s": round(outcome.wall_s, 2)})


def run_plan(plan: Plan, output_dir: str, *,
             trainers: Dict[str, trainer_runs.Trainer], timeout_s: float
             ) -> List[comparison.RunOutcome]:
  """Runs the schedule, one trainer at a time, logging progress."""
  schedule = plan.schedule()
  outcomes = []
  refused = set()
  walls = []
  started = time.perf_counter()
  with open(os.path.join(output_dir, OUTCOMES_NAME), "w",
            encoding="utf-8") as log_file:
    for index, (repeat, framework, workload, cell) in enumerate(schedule, 1):
      where = " | ".join(filter(None, [
          framework, plan.workloads.full_label(workload),
          plan.matrix.label(cell)]))
      if (framework, workload, cell) in refused:
        _log(f"{index}/{len(schedule)} {where} | repeat {repeat}: skipped "
             f"(not supported by {framework})")
        continue
      run_dir = plan.run_dir(output_dir, framework, workload, cell, repeat)
      command = trainer_runs.build_command(
          trainers[framework], plan.run_args(workload, cell), run_dir)
      result = trainer_runs.run_trainer(command, run_dir, timeout_s=timeout_s)
      outcome = comparison.RunOutcome(
          framework, workload, cell, repeat, result.status, run_dir,
          result.error, result.wall_s, result.record)
      outcomes.append(outcome)
      log_file.write(_outcome_line(outcome, output_dir) + "\n")
      log_file.flush()
      walls.append(result.wall_s)
      if result.status == comparison.UNSUPPORTED:
        refused.add((framework, workload, cell))
        said = f"not supported by {framework}: {result.error}"
      elif result.status == comparison.OK:
        said = f"{result.record['samples_per_second']:.0f} samples/s"
      else:
        said = f"FAILED: {result.error}"
      left = (len(schedule) - index) * sum(walls) / len(walls)
      _log(f"{index}/{len(schedule)} {where} | repeat {repeat}/"
           f"{plan.repeats}: {said} ({result.wall_s:.0f} s; elapsed "
           f"{_minutes(time.perf_counter() - started)}, about "
           f"{_minutes(left)} left)")
  return outcomes


def load_outcomes(plan: Plan, output_dir: str
                  ) -> List[comparison.RunOutcome]:
  """The outcomes a previous run logged, with their run.json files."""
  outcomes = []
  with open(os.path.join(output_dir, OUTCOMES_NAME), encoding="utf-8") as f:
    for line in f:
      entry = json.loads(line)
      run_dir = os.path.join(output_dir, entry["run_dir"])
      record = None
      if entry["status"] == comparison.OK:
        record = run_record.load_run_record(run_dir)
      outcomes.append(comparison.RunOutcome(
          entry["framework"], Cell(tuple(entry["workload"])),
          Cell(tuple(entry["cell"])), entry["repeat"], entry["status"],
          run_dir, entry["error"], entry["wall_s"], record))
  return outcomes


def describe_machine() -> Dict[str, str]:
  cpu = "unknown"
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      cpu = next((l.split(":", 1)[1].strip() for l in f
                  if l.startswith("model name")), cpu)
  except OSError:
    pass
  return {"machine": f"{cpu}, {os.cpu_count()} cores"}


def write_report(plan: Plan, outcomes, output_dir: str, meta: dict,
                 *, noise_floor: float, plots: bool) -> dict:
  result = comparison.Comparison(
      matrix=plan.matrix, workloads=plan.workloads,
      frameworks=plan.frameworks, outcomes=outcomes, noise_floor=noise_floor,
      meta=meta)
  if plots:
    try:
      from overlap_compare import plots as compare_plots
    except ImportError as e:
      # Plotting is an extra: the tables and findings need no matplotlib.
      print(f"{PROGRAM}: plots skipped ({e.name or e} is not installed; "
            "pip install 'tfoverlap[compare]' draws them)", file=sys.stderr)
    else:
      compare_plots.write_plots(result, output_dir)
  compare_report.write_report_dir(result, output_dir)
  return result


def main(argv):
  trainer_args = argv[1:]
  output_dir = _OUTPUT_DIR.value or os.path.join(
      "runs", f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
  if _REPORT_ONLY.value:
    if not _OUTPUT_DIR.value:
      tfo_flags.exit_with_usage_error("--report_only needs --output_dir")
    with open(os.path.join(output_dir, PLAN_NAME), encoding="utf-8") as f:
      saved = json.load(f)
    plan = Plan.from_json(saved["plan"])
    write_report(plan, load_outcomes(plan, output_dir), output_dir,
                 saved["meta"], noise_floor=_NOISE_FLOOR.value,
                 plots=_PLOTS.value)
    print(os.path.join(output_dir, compare_report.REPORT_NAME))
    return
  try:
    trainers = trainer_runs.parse_trainers(_TRAINERS.value)
    if _LAUNCHER.value:
      template = launcher_lib.LauncherTemplate.parse(_LAUNCHER.value)
      trainers = {name: dataclasses.replace(t, launcher=template)
                  for name, t in trainers.items()}
  except ValueError as e:
    tfo_flags.exit_with_usage_error(str(e))
  try:
    plan = Plan(matrix_spec=_MATRIX.value, workloads_spec=_WORKLOADS.value,
                frameworks=_FRAMEWORKS.value, repeats=_REPEATS.value,
                trainer_args=trainer_args)
    validate_plan(plan, trainers)
    # Every cell passed above; the common flags alone are a one-stage run
    # when the stages are an axis, without the flags only stages take.
    max_steps = check_trainer_args(
        compare_plan.applicable_args(trainer_args)).train_steps
    if _AUTOTUNE.value:
      compare_autotune.check_plan(plan, min_steps=_AUTOTUNE_MIN_STEPS.value,
                                  max_steps=max_steps)
  except MatrixSpecError as e:
    tfo_flags.exit_with_usage_error(str(e))
  runs_root = (compare_autotune.runs_root(output_dir) if _AUTOTUNE.value
               else os.path.join(output_dir, compare_plan.RUNS_DIR))
  if os.path.isdir(runs_root) and os.listdir(runs_root):
    # A trainer restores the newest checkpoint in its model_dir: runs left
    # there would be resumed, not measured.
    tfo_flags.exit_with_usage_error(
        f"--output_dir={output_dir} already holds runs ({runs_root}); "
        "allowed: a new --output_dir, or --report_only to rewrite its report")
  os.makedirs(output_dir, exist_ok=True)
  header = {"command": "python -m overlap_compare " +
                       shlex.join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"),
            **describe_machine()}
  if _AUTOTUNE.value:
    try:
      constraints = autotune.Constraints(
          max_data_wait_frac=_MAX_DATA_WAIT_FRAC.value,
          max_checkpoint_interval_s=_MAX_CHECKPOINT_INTERVAL_S.value,
          max_checkpoint_stall_frac=_MAX_CHECKPOINT_STALL_FRAC.value)
    except ValueError as e:
      tfo_flags.exit_with_usage_error(str(e))
    sys.exit(compare_autotune.run(
        plan, output_dir, trainers=trainers, constraints=constraints,
        min_steps=_AUTOTUNE_MIN_STEPS.value, max_steps=max_steps,
        eta=_AUTOTUNE_ETA.value, timeout_s=_RUN_TIMEOUT_S.value,
        header=list(header.items()), log=_log))
  meta = {"title": _TITLE.value, **header,
          "load average at start": " ".join(f"{v:.1f}"
                                            for v in os.getloadavg()),
          "trainer flags": " ".join(trainer_args) or "(defaults)",
          "repeats": str(plan.repeats),
          "noise floor": f"{100 * _NOISE_FLOOR.value:g}%"}
  start = time.perf_counter()
  _log(f"{len(plan.schedule())} runs: {len(plan.matrix.cells())} cells x "
       f"{len(plan.workloads.cells())} workload(s) x {len(plan.frameworks)} "
       f"framework(s) x {plan.repeats} repeat(s) -> {output_dir}")
  outcomes = run_plan(plan, output_dir, trainers=trainers,
                      timeout_s=_RUN_TIMEOUT_S.value)
  meta["wall time"] = _minutes(time.perf_counter() - start)
  meta["load average at end"] = " ".join(f"{v:.1f}" for v in os.getloadavg())
  with open(os.path.join(output_dir, PLAN_NAME), "w", encoding="utf-8") as f:
    json.dump({"plan": plan.to_json(), "meta": meta}, f, indent=2)
    f.write("\n")
  write_report(plan, outcomes, output_dir, meta,
               noise_floor=_NOISE_FLOOR.value, plots=_PLOTS.value)
  print(os.path.join(output_dir, compare_report.REPORT_NAME))
  failed = [o for o in outcomes if o.status == comparison.FAILED]
  if failed:
    _log(f"{len(failed)} run(s) failed; see the report's failed cells")
  sys.exit(1 if failed else 0)


def parse_compare_argv(argv):
  """This command's flags before `--`; the trainers' after it.

  Returns:
    [program, *trainer_args]. A trainer flag given before `--` exits 2: it
    would be read by no one.
  """
  if "--" in argv:
    split = argv.index("--")
    own, trainer_args = argv[:split], argv[split + 1:]
  else:
    own, trainer_args = argv, []
  tfo_flags.parse_or_exit(own, validate=False)
  misplaced = [n for n in trainer_flag_names() if tfo_flags.FLAGS[n].present]
  if misplaced:
    tfo_flags.exit_with_usage_error(
        f"--{misplaced[0]} is a trainer flag; pass trainer flags after '--' "
        "(e.g. ... -- --model=mlp), or vary it with --matrix")
  return argv[:1] + trainer_args


def run_main():
  app.run(main, flags_parser=parse_compare_argv)


if __name__ == "__main__":
  run_main()
