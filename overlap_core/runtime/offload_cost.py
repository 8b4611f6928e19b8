"""What offload adds to a step: the step timed alone with and without it.

Offload's cost is not only its copies. The fidelity benchmark (BENCHMARKS
§17) turned offload off and saved 3.4 ms a step in PyTorch, whose copies
took 1.55 ms of it (the saved-tensor hooks' own work is the rest), and
3.8 ms in TensorFlow, whose host-to-host copies took 0.02 ms (each
offloaded layer's forward runs again in backward). So a ledger phase of
the copies alone told a user offload was nearly free.

Where a run can take offload off for a moment, it times its step alone
before training both ways, interleaved, on the same resident batch
(`overlap_core.runtime.contention`): the difference of the two medians,
never below zero, is the `offload` phase of every step, derived, not
timed (run.json lists it in `phases_derived`; both timings are under
`strategy.reference_step`). The span beyond the step timed with offload
is `contention`, as in any run that times its step alone.

Where it cannot (PyTorch's parameter offload keeps the weights on the
host, so no step runs without it; TensorFlow's several steps per call and
`model.fit`, which time no step alone), the phase is the copies timed in
series with compute (`offload_stats`), a lower bound of what offload
costs. run.json's `offload.phase_from` says which.

  cost = offload_cost.time_with_and_without(
      run_step, run_step_without_offload, num_steps=5, restore=restore)
  split = cost.split_compute()
"""

import dataclasses
from typing import Callable, List, Optional

from overlap_core.runtime import contention
from overlap_core.runtime.offload_stats import OFFLOAD

DERIVED = "the step timed alone with and without offload, before training"
COPIES_TIMED = "the copies timed in series with compute"


def phase_from(phases_measured: List[str],
               phases_derived: List[str]) -> Optional[str]:
  """run.json's `offload.phase_from`: what the run's `offload` phase is,
  or None where it has none (TensorFlow under op determinism, which
  neither times the copies nor the step alone)."""
  if OFFLOAD in phases_derived:
    return DERIVED
  return COPIES_TIMED if OFFLOAD in phases_measured else None


@dataclasses.dataclass(frozen=True)
class OffloadCost:
  """The step timed alone with offload and without it."""
  with_offload: contention.ReferenceStep
  without_offload: contention.ReferenceStep

  @property
  def offload_s(self) -> float:
    return max(self.with_offload.reference_s -
               self.without_offload.reference_s, 0.0)

  @property
  def phases_derived(self) -> List[str]:
    return [OFFLOAD, contention.CONTENTION]

  def split_compute(self, inner: Optional[Callable] = None) -> Callable:
    """(start_s, end_s) -> `offload` (the derived cost, capped at the
    span), `inner`'s parts, `contention` (beyond the step timed with
    offload), `compute`: `ReferenceStep.split_compute`'s spans with the
    offload first.

    Args:
      inner: the run's own split of what follows the offload, ending with
        its compute span, or None. Not the copies' timed split: the
        derived cost holds the copies.
    """

    offload_s = self.offload_s  # two medians: taken once, not per step

    def carve_offload(start_s: float, end_s: float) -> List[tuple]:
      split_s = start_s + min(offload_s, max(end_s - start_s, 0.0))
      rest = (inner(split_s, end_s) if inner else
              [(contention.COMPUTE, split_s, end_s)])
      return [(OFFLOAD, start_s, split_s), *rest]

    return self.with_offload.split_compute(inner=carve_offload)

  def to_dict(self) -> dict:
    return {"derived_from": DERIVED,
            "offload_ms": 1e3 * self.offload_s,
            "with_offload": self.with_offload.to_dict(),
            "without_offload": self.without_offload.to_dict()}


# The offload's cost is timed once, before the loop, and is the difference
# of two medians. At 15 calls a way, both offload cells of the fidelity
# benchmark were noisy at 15 repeats (signed miss over tolerance 0.29
# [-0.39, 1.33] and -0.09 [-0.63, 1.73]), where at 31 both had met at 21
# (0.12 [-0.14, 0.52] and -0.04 [-0.16, 0.07]; BENCHMARKS §17). So each
# way takes twice the calls of one timing of the plain step alone, which
# is timed twice (`contention.RetimedSplit`).
TIMED_ONCE_CALLS = 2


def time_with_and_without(with_offload: Callable[[], None],
                          without_offload: Callable[[], None], *,
                          num_steps: int,
                          restore: Callable[[], None]) -> OffloadCost:
  """Times the step alone with offload and without, interleaved
  (`contention.time_interleaved`); then `restore()`.

  Args:
    with_offload: runs one step on the resident batch and returns once it
      is done (the device waited for).
    without_offload: the same step with offload taken off.
    num_steps: the run's --reference_steps, at least 1; each way is timed
      over `TIMED_ONCE_CALLS` times that many calls.
    restore: puts back what the calls changed.
  """
  timed_with, timed_without = contention.time_interleaved(
      [with_offload, without_offload],
      num_steps=TIMED_ONCE_CALLS * num_steps, restore=restore)
  return OffloadCost(with_offload=timed_with, without_offload=timed_without)
