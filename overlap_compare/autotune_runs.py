"""`python -m overlap_compare --autotune`: the search, run as subprocesses.

For every framework and workload of the plan, successive halving
(`overlap_compare.autotune`) over the matrix's cells, each trial being
`--repeats` trainer runs of that many steps. It writes
`best_<framework>[_<workload>].flags` (an absl flagfile: the common trainer
flags, the workload's and the winning cell's), autotune.md and autotune.csv.
"""

import os
import time
from typing import Callable, Dict, List, Sequence

from overlap_compare import autotune
from overlap_compare import autotune_report
from overlap_compare import metrics as overlap_metrics
from overlap_compare import trainer_runs
from overlap_compare.comparison import OK, UNSUPPORTED
from overlap_compare.matrix import Cell, MatrixSpecError

AUTOTUNE_DIR = "autotune"
MARKDOWN_NAME = "autotune.md"
CSV_NAME = "autotune.csv"


def runs_root(output_dir: str) -> str:
  """Where the search's trainer runs go, one directory each."""
  return os.path.join(output_dir, AUTOTUNE_DIR, "runs")


def check_plan(plan, *, min_steps: int, max_steps: int) -> None:
  """Refuses a plan the search cannot run.

  Raises:
    MatrixSpecError: naming what is wrong.
  """
  if "train_steps" in plan.matrix.flag_names() + plan.workloads.flag_names():
    raise MatrixSpecError("--autotune sets train_steps per rung; it cannot "
                          "be an axis")
  if min_steps > max_steps:
    raise MatrixSpecError(
        f"--autotune_min_steps={min_steps} is above the full budget, the "
        f"trainers' --train_steps={max_steps}; allowed: at most {max_steps}")


def flagfile_name(plan, framework: str, workload: Cell) -> str:
  if not plan.workloads.axes:
    return f"best_{framework}.flags"
  return f"best_{framework}_{plan.workloads.slug(workload)}.flags"


def make_evaluate(plan, trainer: trainer_runs.Trainer, workload: Cell,
                  root: str, *, timeout_s: float,
                  log: Callable[[str], None]):
  """(cell, steps) -> CellStats over --repeats runs; raises TrialFailed."""

  framework = trainer.framework

  def evaluate(cell: Cell, steps: int) -> overlap_metrics.CellStats:
    records, errors = [], []
    for repeat in range(1, plan.repeats + 1):
      run_dir = os.path.join(root, framework, plan.workloads.slug(workload),
                             f"steps-{steps}", plan.matrix.slug(cell),
                             f"r{repeat}")
      args = plan.run_args(workload, cell) + [f"--train_steps={steps}"]
      result = trainer_runs.run_trainer(
          trainer_runs.build_command(trainer, args, run_dir), run_dir,
          timeout_s=timeout_s)
      if result.status == UNSUPPORTED:
        raise autotune.TrialFailed(
            f"not supported by {framework}: {result.error}")
      if result.status == OK:
        records.append(result.record)
      else:
        errors.append(result.error)
      log(f"{framework} | {plan.matrix.label(cell)} | {steps} steps | "
          f"repeat {repeat}: " + (
              f"{result.record['samples_per_second']:.0f} samples/s"
              if result.status == OK else f"FAILED: {result.error}"))
    if not records:
      raise autotune.TrialFailed(errors[0])
    return overlap_metrics.summarize_records(records)

  return evaluate


def run(plan, output_dir: str, *, trainers: Dict[str, trainer_runs.Trainer],
        constraints: autotune.Constraints,
        min_steps: int, max_steps: int, eta: int, timeout_s: float,
        header: Sequence, log: Callable[[str], None]) -> int:
  """Searches every framework x workload; returns the exit status.

  Returns:
    0 when every group found a winner, else 1.
  """
  root = runs_root(output_dir)
  searches = []
  status = 0
  for workload in plan.workloads.cells():
    for framework in plan.frameworks:
      group = framework
      if plan.workloads.axes:
        group += ", " + plan.workloads.full_label(workload)
      log(f"auto-tune {group}: {len(plan.matrix.cells())} cells, budgets "
          f"{autotune.rung_budgets(min_steps, max_steps, eta)} steps")
      result = autotune.successive_halving(
          plan.matrix.cells(),
          make_evaluate(plan, trainers[framework], workload, root,
                        timeout_s=timeout_s, log=log),
          min_steps=min_steps, max_steps=max_steps, eta=eta,
          constraints=constraints)
      flagfile = ""
      if result.winner is None:
        status = 1
        log(f"auto-tune {group}: no cell met {constraints.describe()}")
      else:
        flagfile = flagfile_name(plan, framework, workload)
        write_flagfile(os.path.join(output_dir, flagfile),
                       plan.run_args(workload, result.winner),
                       _flagfile_comments(plan, trainers[framework], group,
                                          result, constraints))
        log(f"auto-tune {group}: {plan.matrix.label(result.winner)}, "
            f"{result.winner_stats.samples_per_second:.0f} samples/s -> "
            f"{os.path.join(output_dir, flagfile)}")
      searches.append((group, result, flagfile))
  with open(os.path.join(output_dir, MARKDOWN_NAME), "w",
            encoding="utf-8") as f:
    f.write(autotune_report.format_markdown(
        searches, plan.matrix.label, constraints, header=header))
  with open(os.path.join(output_dir, CSV_NAME), "w", encoding="utf-8",
            newline="") as f:
    f.write(autotune_report.format_csv(searches, plan.matrix.label))
  return status


def _flagfile_comments(plan, trainer: trainer_runs.Trainer, group: str,
                       result: autotune.SearchResult,
                       constraints: autotune.Constraints) -> List[str]:
  return [
      f"Fastest cell for {group}, found by python -m overlap_compare "
      f"--autotune on {time.strftime('%Y-%m-%d')}.",
      f"Matrix: {plan.matrix_spec}",
      f"Constraints: {constraints.describe()}",
      f"Measured: {result.winner_stats.samples_per_second:.0f} samples/s "
      f"at {result.budgets[-1]} steps (median of {plan.repeats} run(s)).",
      f"Use: python -m {trainer.train_module} "
      "--flagfile=<this file>",
  ]


def write_flagfile(path: str, flag_args: Sequence[str],
                   comments: Sequence[str]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(autotune.format_flagfile(flag_args, comments))
