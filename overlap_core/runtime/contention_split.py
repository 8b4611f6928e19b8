"""Carving contention out of each step's compute span: the balance that
lets steps below the step alone pay for the excess of the steps after,
the split the loops call once per step, and what the run says at its end.

`contention` times the step alone (the reference); this module holds the
steps against it, and `ContentionSplit.settle` closes the books at the
loop's end (`overlap_core.runtime.loop_context.settle_split`).
"""

from typing import Callable, List, Optional

CONTENTION = "contention"  # the ledger phase: compute beyond the step alone
# The ledger's name for compute, repeated here because the ledger imports
# this module (as it does comm_stats) and not the other way round.
COMPUTE = "compute"
# What `ContentionSplit.settle` gives back, as the ledger's summary names it
# among its moves between phases (`StepLedger.relabel`).
SETTLED_BALANCE = "contention_settled"
# What `ContentionSplit.settle` carves once more where the step alone, timed
# again after the loop, came out lower than before it (`lower_by_s`).
RETIMED_REFERENCE = "contention_retimed"


class ExcessBalance:
  """The excess over the reference to carve, step by step, with the time
  steps ran below it banked and paid back first.

  A step `d` below the reference adds `d` to the bank; a step `e` above it
  pays the bank first and carves what is left. So the carve summed over a
  run is the steps' signed excess summed, plus what the bank holds at the
  end: where the steps only jitter around the reference, at most the
  bank's cap over the whole run. The cap is one reference step, so that a
  run the host made faster than the calibration (every step below the
  reference) hides at most that much of the contention that comes after.
  """

  def __init__(self, reference_s: float):
    self._cap_s = reference_s
    self._bank_s = 0.0
    # Each step's signed excess, in order: what `ContentionSplit.settle`
    # gives the ledger to check the reference against.
    self._excess_s: List[float] = []

  def carve(self, signed_excess_s: float) -> float:
    """The excess to carve from a step `signed_excess_s` beyond the
    reference (negative: below it)."""
    self._excess_s.append(signed_excess_s)
    carved_s = max(signed_excess_s - self._bank_s, 0.0)
    self._bank_s = min(max(self._bank_s - signed_excess_s, 0.0),
                       self._cap_s)
    return carved_s

  def lower(self, by_s: float) -> List[float]:
    """Carves the steps so far once more, against a reference `by_s`
    lower, as if it had been the reference from the first step; returns
    each step's carve beyond the one it had, in order, and holds what the
    new carve leaves (the bank, the record of excess, the cap).

    A lower reference carves no step less: every excess is `by_s` larger,
    so the bank holds no more after any step, and each carve is at least
    what it was.
    """
    carved = ExcessBalance(self._cap_s)
    lowered = ExcessBalance(self._cap_s - by_s)
    extra_s = [lowered.carve(excess_s + by_s) - carved.carve(excess_s)
               for excess_s in self._excess_s]
    self._cap_s, self._bank_s = lowered._cap_s, lowered._bank_s
    self._excess_s = lowered._excess_s
    return extra_s

  def take_excess(self) -> List[float]:
    """Empties the record of each step's signed excess; returns it, in the
    order the steps were carved."""
    excess_s, self._excess_s = self._excess_s, []
    return excess_s

  def take_banked(self) -> float:
    """Empties the bank; returns what it held: time steps ran below the
    reference that no later excess paid back."""
    banked_s, self._bank_s = self._bank_s, 0.0
    return banked_s


class ContentionSplit:
  """A split of each step's compute span that carves contention against a
  reference (`ReferenceStep.split_compute`, `split_stage_compute`), called
  once per step as the loops call any split; at the loop's end, `settle`
  gives back to compute what its balance still holds.

  Args:
    split: (start_s, end_s) -> the step's spans, carving through `balance`.
    balance: the split's `ExcessBalance`.
    compute: the phase contention is carved out of, and given back to.
  """

  def __init__(self, split: Callable[[float, float], List[tuple]],
               balance: ExcessBalance, compute: str):
    self._split = split
    self._balance = balance
    self._compute = compute

  def __call__(self, start_s: float, end_s: float) -> List[tuple]:
    return self._split(start_s, end_s)

  def settle(self, ledger, owns_step: Callable[[int], bool] = lambda _: True,
             lower_by_s: float = 0.0) -> float:
    """Moves what the balance holds from the latest steps' contention back
    to compute in `ledger` (a `ledger.StepLedger`), latest step first;
    returns the seconds moved.

    With `lower_by_s`, the steps are first carved once more against a
    reference that much lower (`ExcessBalance.lower`: the step alone timed
    again after the loop, `RetimedSplit`), each step's further carve moved
    from compute to contention.

    The balance holds time steps ran below the reference after the last
    excess it paid: up to that much of the contention carved before them
    was jitter that the run's end left unpaid.

    Each step's signed excess over the reference goes to the ledger too
    (`StepLedger.record_excess`), which says whether the steps ran below
    the step alone (`understated_note`).

    Args:
      owns_step: step number -> whether this split split that step's span
        (False for the other arm's steps where a run alternates two
        splits: `paired_removal.AlternatingCalls.settle`).
    """
    steps = ledger.steps
    owned = [i for i, record in enumerate(steps) if owns_step(record.step)]
    if lower_by_s > 0.0:
      # One call per owned step, the latest calls the latest steps'.
      extra_s = self._balance.lower(lower_by_s)
      ledger.relabel(dict(zip(reversed(owned), reversed(extra_s))),
                     self._compute, CONTENTION, why=RETIMED_REFERENCE)
    # One call per owned step, the latest calls the latest steps'.
    ledger.record_excess(dict(zip(reversed(owned),
                                  reversed(self._balance.take_excess()))))
    left_s = self._balance.take_banked()
    moved = {}
    for index in reversed(owned):
      if left_s <= 0.0:
        break
      taken_s = min(steps[index].phases_s.get(CONTENTION, 0.0), left_s)
      if taken_s > 0.0:
        moved[index] = taken_s
        left_s -= taken_s
    ledger.relabel(moved, CONTENTION, self._compute, why=SETTLED_BALANCE)
    return sum(moved.values())


def split_stage_compute(reference_s: float, inner: Callable,
                        compute: str) -> ContentionSplit:
  """(start_s, end_s) -> a pipeline stage's spans, `inner`'s (its bubble,
  transfer and `compute` spans in the order they ran), with the stage's
  compute beyond `reference_s` carved out of its first `compute` spans as
  contention.

  The reference here is the stage's own work timed alone, with no
  neighbour to wait for, so the excess is taken over the step's `compute`
  spans only: the waits are the bubble's and transfer's. As in
  `ReferenceStep.split_compute`, the first compute span always starts
  with a contention span, empty where there is no excess, so every step
  of a run that derives the phase records it.
  """
  balance = ExcessBalance(reference_s)

  def split(start_s: float, end_s: float) -> List[tuple]:
    spans = inner(start_s, end_s)
    left_s = balance.carve(
        sum(e - b for name, b, e in spans if name == compute)
        - reference_s)
    carved = []
    first = True
    for name, begin, end in spans:
      if name != compute or (left_s <= 0.0 and not first):
        carved.append((name, begin, end))
        continue
      first = False
      cut_s = begin + min(left_s, end - begin)
      left_s -= cut_s - begin
      carved.append((CONTENTION, begin, cut_s))
      if cut_s < end:
        carved.append((name, cut_s, end))
    return carved

  return ContentionSplit(split, balance, compute)


def understated_note(check: Optional[dict]) -> Optional[str]:
  """The run's note where its steps' compute ran below the step timed
  alone at the median (`check`: the ledger summary's `against_step_alone`),
  or None.

  A step with work beside it is not faster than the same step alone, so
  such a reference was timed slower than the run's steps ran (a slow
  spell of the host during the calibration, say), and a step below it
  carves no contention: in the fidelity benchmark, the runs whose step
  alone was timed above their steps without the cause attributed less
  than the cause's removal saved, and the others met the goal
  (BENCHMARKS §17).
  """
  if not check or check["median_excess_ms"] >= 0.0:
    return None
  return (f"contention may be understated: the steps' compute ran "
          f"{-check['median_excess_ms']:.2f} ms below the step timed alone "
          f"at the median ({check['steps_below']} of {check['steps']} "
          f"measured steps below it); a step below it carves no "
          f"contention, so up to that much of a step's contention may be "
          f"in compute")
