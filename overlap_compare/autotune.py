"""Auto-tune: the fastest matrix cell that meets the user's constraints.

Successive halving (Jamieson and Talwalkar, 2016) over the cells of a
matrix, with training steps as the budget: every candidate trains a short
run; the candidates that break a constraint are dropped and the fastest
1/eta of the rest go on to a run eta times longer, until the full budget.
The winner is always measured at the full budget.

  constraints = Constraints(max_data_wait_frac=0.05)
  result = successive_halving(matrix.cells(), evaluate, min_steps=30,
                              max_steps=120, eta=2, constraints=constraints)
  result.winner  # a Cell, or None when no candidate met the constraints

`evaluate(cell, steps)` runs the cell (the caller decides how: here, trainer
subprocesses) and returns its `CellStats`, or raises `TrialFailed`.
"""

import dataclasses
import math
from typing import Callable, List, Optional, Sequence, Tuple

from overlap_core.runtime.ledger import CHECKPOINT_STALL, DATA_WAIT
from overlap_compare.matrix import Cell
from overlap_compare.metrics import CellStats


class TrialFailed(RuntimeError):
  """A candidate could not be measured; the message says why."""


@dataclasses.dataclass(frozen=True)
class Constraints:
  """What the winner must satisfy, read from its run.json numbers.

  Attributes:
    max_data_wait_frac: the step's share spent waiting for input, at most.
    max_checkpoint_interval_s: a checkpoint at least every this many
      seconds (a cell without checkpoints fails it).
    max_checkpoint_stall_frac: the step's share stalled by checkpoints, at
      most.
  """
  max_data_wait_frac: Optional[float] = None
  max_checkpoint_interval_s: Optional[float] = None
  max_checkpoint_stall_frac: Optional[float] = None

  def __post_init__(self):
    for name in ("max_data_wait_frac", "max_checkpoint_stall_frac"):
      value = getattr(self, name)
      if value is not None and not 0 <= value <= 1:
        raise ValueError(f"Invalid value for argument `{name}`. Received: "
                         f"{name}={value}; allowed: a fraction in [0, 1]")
    interval = self.max_checkpoint_interval_s
    if interval is not None and interval <= 0:
      raise ValueError("Invalid value for argument `max_checkpoint_interval_s`"
                       f". Received: max_checkpoint_interval_s={interval}; "
                       "allowed: seconds > 0")

  def describe(self) -> str:
    parts = []
    if self.max_data_wait_frac is not None:
      parts.append(f"data wait <= {100 * self.max_data_wait_frac:g}% of the "
                   "step")
    if self.max_checkpoint_interval_s is not None:
      parts.append("a checkpoint at least every "
                   f"{self.max_checkpoint_interval_s:g} s")
    if self.max_checkpoint_stall_frac is not None:
      parts.append("checkpoint stall <= "
                   f"{100 * self.max_checkpoint_stall_frac:g}% of the step")
    return "; ".join(parts) or "none"

  def violations(self, stats: CellStats) -> Tuple[str, ...]:
    """What `stats` breaks, one readable line per constraint; () if none."""
    found = []
    fractions = stats.phase_fractions
    if (self.max_data_wait_frac is not None and
        fractions[DATA_WAIT] > self.max_data_wait_frac):
      found.append(f"data wait {100 * fractions[DATA_WAIT]:.1f}% > "
                   f"{100 * self.max_data_wait_frac:g}%")
    if self.max_checkpoint_interval_s is not None:
      interval = stats.checkpoint_interval_s
      if interval is None:
        found.append("no checkpoints")
      elif interval > self.max_checkpoint_interval_s:
        found.append(f"a checkpoint every {interval:.2f} s > "
                     f"{self.max_checkpoint_interval_s:g} s")
    if (self.max_checkpoint_stall_frac is not None and
        fractions[CHECKPOINT_STALL] > self.max_checkpoint_stall_frac):
      found.append(f"checkpoint stall {100 * fractions[CHECKPOINT_STALL]:.1f}%"
                   f" > {100 * self.max_checkpoint_stall_frac:g}%")
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class Trial:
  """One candidate measured at one rung."""
  rung: int
  steps: int
  cell: Cell
  stats: Optional[CellStats]
  error: str = ""
  violations: Tuple[str, ...] = ()

  @property
  def feasible(self) -> bool:
    return self.stats is not None and not self.violations


@dataclasses.dataclass(frozen=True)
class SearchResult:
  winner: Optional[Cell]
  winner_stats: Optional[CellStats]
  trials: Tuple[Trial, ...]
  budgets: Tuple[int, ...]


def rung_budgets(min_steps: int, max_steps: int, eta: int) -> List[int]:
  """min, min*eta, min*eta^2, ... below max, then max itself.

  Raises:
    ValueError: naming the argument out of range.
  """
  if min_steps < 1:
    raise ValueError(f"Invalid value for argument `min_steps`. Received: "
                     f"min_steps={min_steps}; allowed: >= 1")
  if max_steps < min_steps:
    raise ValueError(f"Invalid value for argument `max_steps`. Received: "
                     f"max_steps={max_steps}; allowed: >= min_steps "
                     f"({min_steps})")
  if eta < 2:
    raise ValueError(f"Invalid value for argument `eta`. Received: eta={eta}"
                     "; allowed: >= 2")
  budgets = []
  steps = min_steps
  while steps < max_steps:
    budgets.append(steps)
    steps *= eta
  return budgets + [max_steps]


def successive_halving(candidates: Sequence[Cell],
                       evaluate: Callable[[Cell, int], CellStats], *,
                       min_steps: int, max_steps: int, eta: int,
                       constraints: Constraints,
                       on_trial: Optional[Callable[[Trial], None]] = None
                       ) -> SearchResult:
  """Keeps the fastest feasible 1/eta of the candidates per rung.

  Args:
    candidates: the cells to search, in a fixed order (ties go to the
      earlier one).
    evaluate: (cell, train_steps) -> CellStats; raises TrialFailed.
    min_steps, max_steps, eta: see `rung_budgets`.
    constraints: a candidate breaking one is dropped at that rung.
    on_trial: called with every trial as it finishes (progress).

  Returns:
    The winner (the fastest feasible candidate at the full budget) and
    every trial; winner None when no candidate stayed feasible.
  """
  budgets = rung_budgets(min_steps, max_steps, eta)
  order = {cell: i for i, cell in enumerate(candidates)}
  survivors = list(candidates)
  trials: List[Trial] = []
  last_rung: List[Trial] = []
  rung = 0
  while survivors:
    final = rung == len(budgets) - 1
    steps = budgets[rung]
    last_rung = []
    for cell in survivors:
      try:
        stats = evaluate(cell, steps)
        trial = Trial(rung, steps, cell, stats,
                      violations=constraints.violations(stats))
      except TrialFailed as e:
        trial = Trial(rung, steps, cell, None, error=str(e))
      trials.append(trial)
      last_rung.append(trial)
      if on_trial is not None:
        on_trial(trial)
    ranked = sorted((t for t in last_rung if t.feasible),
                    key=lambda t: (-t.stats.samples_per_second,
                                   order[t.cell]))
    if final or not ranked:
      break
    keep = max(1, math.ceil(len(survivors) / eta))
    survivors = [t.cell for t in ranked[:keep]]
    # One survivor left early goes straight to the full budget: the winner
    # is always judged on a run as long as the user asked for.
    rung = len(budgets) - 1 if len(survivors) == 1 else rung + 1
  best = min((t for t in last_rung if t.feasible and
              t.steps == budgets[-1]),
             key=lambda t: (-t.stats.samples_per_second, order[t.cell]),
             default=None)
  return SearchResult(winner=best.cell if best else None,
                      winner_stats=best.stats if best else None,
                      trials=tuple(trials), budgets=tuple(budgets))


def format_flagfile(flag_args: Sequence[str], comments: Sequence[str]) -> str:
  """An absl --flagfile: `#` comment lines, then one flag per line."""
  lines = [f"# {c}" for c in comments] + list(flag_args)
  return "\n".join(lines) + "\n"
