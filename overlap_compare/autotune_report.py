"""autotune.md and autotune.csv: every trial of a successive-halving search.

One section per searched group (framework x workload): the constraints,
the rung budgets, the winner, and each trial with the verdict it got
(kept, dropped as slower, breaking a constraint, failed), so a reader can
check why a faster-looking cell lost.
"""

import csv
import io
from typing import Callable, Dict, List, Sequence, Tuple

from overlap_compare.autotune import Constraints, SearchResult, Trial
from overlap_core.runtime.ledger import CHECKPOINT_STALL, DATA_WAIT
from overlap_compare.matrix import Cell

CSV_HEADERS = ("group", "rung", "train_steps", "cell", "samples_per_second",
               "data_wait_frac", "checkpoint_stall_frac",
               "checkpoint_interval_s", "verdict")


def trial_verdicts(result: SearchResult) -> Dict[Tuple[int, Cell], str]:
  """What became of each trial: winner, kept, slower, broke ..., failed."""
  cells_by_rung = {}
  for trial in result.trials:
    cells_by_rung.setdefault(trial.rung, set()).add(trial.cell)
  rungs = sorted(cells_by_rung)
  verdicts = {}
  for trial in result.trials:
    key = (trial.rung, trial.cell)
    later = [r for r in rungs if r > trial.rung]
    if trial.stats is None:
      verdicts[key] = f"failed: {trial.error}"
    elif trial.violations:
      verdicts[key] = "breaks " + "; ".join(trial.violations)
    elif (trial.cell == result.winner and
          trial.steps == result.budgets[-1]):
      verdicts[key] = "winner"
    elif later and trial.cell in cells_by_rung[later[0]]:
      verdicts[key] = "kept"
    else:
      verdicts[key] = "dropped: slower"
  return verdicts


def _trial_numbers(trial: Trial) -> List[str]:
  if trial.stats is None:
    return ["", "", "", ""]
  fractions = trial.stats.phase_fractions
  interval = trial.stats.checkpoint_interval_s
  return [f"{trial.stats.samples_per_second:.0f}",
          f"{100 * fractions[DATA_WAIT]:.1f}%",
          f"{100 * fractions[CHECKPOINT_STALL]:.1f}%",
          "" if interval is None else f"{interval:.2f}"]


def format_markdown(searches: Sequence[Tuple[str, SearchResult, str]],
                    label: Callable[[Cell], str], constraints: Constraints,
                    *, header: Sequence[Tuple[str, str]]) -> str:
  """The autotune.md text.

  Args:
    searches: (group name, result, flagfile path or "") per group.
    label: cell -> its readable label.
    constraints: what was required.
    header: (name, value) rows for the top table (command, date, ...).
  """
  out = io.StringIO()
  out.write("# Auto-tune: successive halving\n\n")
  rows = list(header) + [("constraints", constraints.describe())]
  out.write("| | |\n|---|---|\n")
  out.write("".join(f"| {k} | {v} |\n" for k, v in rows))
  out.write("\nEach rung trains every surviving cell for the rung's steps; "
            "cells that break a constraint are dropped, and the fastest "
            "1/eta of the rest go on. The winner is measured at the full "
            "budget.\n")
  for group, result, flagfile in searches:
    out.write(f"\n## {group}\n\n")
    if result.winner is None:
      out.write("**No cell met the constraints.**\n\n")
    else:
      out.write(f"**Winner: {label(result.winner)}**, "
                f"{result.winner_stats.samples_per_second:.0f} samples/s at "
                f"{result.budgets[-1]} steps"
                + (f"; flagfile `{flagfile}`" if flagfile else "") + ".\n\n")
    spent = sum(t.steps for t in result.trials)
    exhaustive = result.budgets[-1] * len(
        {t.cell for t in result.trials if t.rung == 0})
    out.write(f"Rung budgets (train steps): "
              f"{', '.join(map(str, result.budgets))}. Steps trained: "
              f"{spent} per repeat, against {exhaustive} for every cell at "
              "the full budget.\n\n")
    out.write("| rung | steps | cell | samples/s | data wait | ckpt stall | "
              "ckpt every s | verdict |\n|---|---|---|---|---|---|---|---|\n")
    verdicts = trial_verdicts(result)
    for trial in result.trials:
      cells = [str(trial.rung), str(trial.steps), label(trial.cell)]
      cells += _trial_numbers(trial)
      cells.append(verdicts[(trial.rung, trial.cell)].replace("|", "\\|"))
      out.write("| " + " | ".join(cells) + " |\n")
  return out.getvalue()


def format_csv(searches: Sequence[Tuple[str, SearchResult, str]],
               label: Callable[[Cell], str]) -> str:
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(CSV_HEADERS)
  for group, result, _ in searches:
    verdicts = trial_verdicts(result)
    for trial in result.trials:
      s = trial.stats
      writer.writerow([
          group, trial.rung, trial.steps, label(trial.cell),
          "" if s is None else f"{s.samples_per_second:.6g}",
          "" if s is None else f"{s.phase_fractions[DATA_WAIT]:.6g}",
          "" if s is None else f"{s.phase_fractions[CHECKPOINT_STALL]:.6g}",
          "" if s is None or s.checkpoint_interval_s is None else
          f"{s.checkpoint_interval_s:.6g}",
          verdicts[(trial.rung, trial.cell)]])
  return out.getvalue()
