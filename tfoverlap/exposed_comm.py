"""TensorFlow's exposed all-reduce, derived from a step without it.

The gradient all-reduce runs inside the compiled step (Keras sums the
replicas' gradients in `apply_gradients`), where no host clock reaches, so
its unhidden part cannot be timed as PyTorch's is. It is derived instead:
the same step is run with and without the all-reduce (`steps.
make_local_train_step`), and what the step loses to the all-reduce is the
median of their paired differences. Each training step's compute span is
then split into that much `exposed_comm` and the rest (`ledger.
carve_compute`), and run.json lists the phase in `phases_derived`, not in
`phases_measured`, with the pairs it came from in `strategy.exposed_comm`.

Why a calibration before training, and not local steps interleaved with
the run's own: a local step updates each replica with its own gradients,
so the replicas part; interleaved, every one would have to be undone and
would consume a batch, changing what the run trains on. Before training
it costs one snapshot and restore of the variables, on a resident copy
of the run's first batch, before its input pipeline exists (as the step
alone is timed, `reference_step`), and the run then
trains exactly as it would without it. The price is that the phase is
measured once, at the start, not through the run; the pairs, their spread
and the seconds they cost are recorded so a reader can judge it, and
--paired_removal=all_reduce checks it through a run: a diagnostic run,
whose replicas part, trains blocks of steps with this local step, and
its saving is held against the derived phase (BENCHMARKS §17).

  derivation = derive_exposed_comm(model, optimizer, strategy, batch,
                                   task=spec.task, global_batch_size=64)
  split = derivation.split_compute  # for the loops' split_compute
"""

import dataclasses
import statistics
import time
from typing import Tuple

from overlap_core.runtime import ledger as ledger_lib
from tfoverlap import reference_step, steps

# Pairs of (step, local step), after one warm-up call of each (its trace):
# enough for a median on a busy host, and a bounded cost (about a dozen
# steps and two traces) at the start of every replicated run.
NUM_PAIRS = 5


@dataclasses.dataclass(frozen=True)
class CommDerivation:
  """The step with and without its all-reduce, timed in pairs.

  Attributes:
    step_s: each pair's step with the all-reduce.
    local_step_s: each pair's step without it.
    cost_s: the seconds the calibration took, traces and restore included.
  """
  step_s: Tuple[float, ...]
  local_step_s: Tuple[float, ...]
  cost_s: float

  @property
  def exposed_comm_s(self) -> float:
    """The median paired difference; a local step that was slower (noise,
    or an all-reduce wholly hidden) counts as zero."""
    diffs = [a - b for a, b in zip(self.step_s, self.local_step_s)]
    return max(statistics.median(diffs), 0.0) if diffs else 0.0

  def split_compute(self, start_s: float, end_s: float) -> list:
    """A step's compute span as its derived exposed_comm, then compute."""
    return ledger_lib.carve_compute(start_s, end_s, ledger_lib.EXPOSED_COMM,
                                    self.exposed_comm_s)

  def to_dict(self) -> dict:
    return {"derived_from": "the same step without the gradient all-reduce, "
                            "timed in pairs before training",
            "exposed_comm_ms": 1e3 * self.exposed_comm_s,
            "step_ms": [1e3 * s for s in self.step_s],
            "local_step_ms": [1e3 * s for s in self.local_step_s],
            "num_pairs": len(self.step_s), "cost_s": self.cost_s}


def _timed(step_fn, batch) -> float:
  start = time.perf_counter()
  float(step_fn(batch))  # reading the loss waits for the step's end
  return time.perf_counter() - start


def derive_exposed_comm(model, optimizer, strategy, batch, *, task: str,
                        global_batch_size: int,
                        num_pairs: int = NUM_PAIRS) -> CommDerivation:
  """Times the step with and without its all-reduce on `batch`, a
  distributed batch held resident (`data.make_resident_iterator`),
  then restores the variables, so training goes on as if it had not run.

  Args:
    model, optimizer, strategy: the run's, built; the optimizer's
      variables exist (a step or `optimizer.build` created them).
    task, global_batch_size: as `steps.make_train_step` takes them.
    num_pairs: pairs timed after one warm-up call of each.
  """
  start = time.perf_counter()
  restore = reference_step.snapshot(model, optimizer)
  full = steps.make_train_step(model, optimizer, strategy, task=task,
                               global_batch_size=global_batch_size)
  local = steps.make_local_train_step(model, optimizer, strategy, task=task,
                                      global_batch_size=global_batch_size)
  _timed(full, batch)
  _timed(local, batch)
  step_s, local_step_s = [], []
  for i in range(num_pairs):
    # Each goes first in every other pair, so a drift of the host's load
    # within a pair falls on both alike.
    if i % 2:
      local_step_s.append(_timed(local, batch))
      step_s.append(_timed(full, batch))
    else:
      step_s.append(_timed(full, batch))
      local_step_s.append(_timed(local, batch))
  # The replicas the local steps parted are one again.
  restore()
  return CommDerivation(step_s=tuple(step_s),
                        local_step_s=tuple(local_step_s),
                        cost_s=time.perf_counter() - start)
