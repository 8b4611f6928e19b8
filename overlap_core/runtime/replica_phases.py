"""A data-parallel step's data wait and contention over all its replicas,
not one.

In synchronous data parallelism every replica's step ends at the same
gradient all-reduce, which finishes when the last replica reaches it. So
what delays a replica's step is not its own input or its own slowed
compute alone:

- when a peer waits longer for its batch, or its compute is slowed more
  by the work beside it, this replica reaches the all-reduce first and
  waits there for it. Its ledger timed that wait as `exposed_comm`
  (`overlap_core.runtime.comm_stats`), but it is the peer's input's or
  contention's: with the input free or nothing beside the steps, it goes;
- when this replica's own wait or contention only delays it to where a
  peer's slower compute would have kept the all-reduce anyway, that much
  would not go with its cause: the replica would wait at the all-reduce
  instead.

The fidelity benchmark saw both (BENCHMARKS page 17): in PyTorch's DDP
cell, the step that resident batches saved beyond the data wait followed
the change in `exposed_comm`, run by run. Taking contention over the
replicas too brought that cell's median within its goal. What this does
not see: rank 0's `exposed_comm` that stays is still shorter in the half
with the input (in 14 to 18 of 21 runs of the full runs on page 17), a
change that does not follow contention's: the all-reduce's own tail,
which no exchange of phases can tell. A run whose waits can bound it
says so in its notes (`hidden_all_reduce_notes`).

So after training the replicas exchange, per step, the time each took to
reach the all-reduce (its data wait and its compute but the all-reduce's
wait), its compute, and its compute less contention (the step alone's
share): one collective, the element-wise maximum over processes. A
step's data wait and contention become what removing every replica's
input, then every replica's contention, would save it:

  data_wait  = max over replicas (wait + compute) - max over replicas compute
  contention = max over replicas compute - max over replicas (compute - contention)

Both sum, with the rest, to how much sooner the last replica would reach
the all-reduce without either cause. The difference from the replica's
own phase moves from `exposed_comm` or to it, so the phases still add up
to the step. What stays `exposed_comm` is the all-reduce itself and the
waits for peers' compute as the step alone makes it.

Only where the all-reduce's wait is timed step by step (PyTorch's DDP and
Horovod around the whole model). TensorFlow derives its `exposed_comm`
from a step timed before training (`tfoverlap.exposed_comm`), so there is
no per-step wait to move; its replicas on one host share one input
pipeline and one process. The progress lines, printed while training,
show each replica's own phases: the exchange happens once, at the end, to
add no collective to the steps.
"""

from typing import Callable, Dict, List, Optional, Sequence

from overlap_core.runtime import comm_stats
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import paired_removal
from overlap_core.runtime import verdict

__all__ = ["slowest_replica_gap", "count_over_replicas",
           "hidden_all_reduce_notes"]

# The phases of a step that are not its compute before the all-reduce.
_NOT_COMPUTE = (ledger_lib.DATA_WAIT, comm_stats.EXPOSED_COMM,
                ledger_lib.CHECKPOINT_STALL)
# The phases taken over the replicas, in the order they are moved: the
# data wait's formula holds contention inside compute.
PHASES = (ledger_lib.DATA_WAIT, ledger_lib.CONTENTION)
# run.json's strategy section holds what `count_over_replicas` moved under
# this key, where the phases were so taken.
OVER_REPLICAS_KEY = "phases_over_replicas"


def slowest_replica_gap(slowest_with_s: Sequence[float],
                        slowest_without_s: Sequence[float]) -> List[float]:
  """Per step, how much sooner the last replica would reach the
  all-reduce without a cause: the maximum over replicas of the time with
  it, less the maximum of the time without it (never below zero).

  Args:
    slowest_with_s: per step, the maximum over replicas of the time to
      reach the all-reduce with the cause (data wait plus compute; or
      compute, for contention).
    slowest_without_s: per step, the same maximum without it (compute;
      or compute less contention).
  """
  return [max(with_s - without_s, 0.0)
          for with_s, without_s in zip(slowest_with_s, slowest_without_s)]


def count_over_replicas(
    ledger: ledger_lib.StepLedger,
    max_over_processes: Callable[[list], list], *,
    gradients_apart: Optional[Callable[[int], bool]] = None
) -> Dict[str, dict]:
  """Makes each step's data wait and contention the replicas' (see the
  module docstring), moving each difference between its phase and
  exposed_comm. A collective: every replica calls it once, after its
  last step.

  Args:
    ledger: this replica's steps.
    max_over_processes: the strategy's element-wise maximum of a list of
      floats over every process.
    gradients_apart: step number -> whether that step all-reduced no
      gradient (--all_reduce=off, or a block of --paired_removal=
      all_reduce), or None for none such. Such a step meets its peers
      only at the loss's average, after its update, and has no
      exposed_comm to move from or to, so its phases stay its own.

  Returns:
    What run.json records, per phase of `PHASES`: over the ledger's
    measured steps, the mean per step moved into the phase and out of
    it, in ms ({"into_ms_mean", "out_of_ms_mean"}).
  """
  steps = ledger.steps
  # Every replica runs the same steps; the lengths are exchanged first so
  # that a replica with fewer (an error elsewhere) still matches shapes.
  (longest,) = max_over_processes([float(len(steps))])
  padding = [0.0] * (int(longest) - len(steps))
  own = {name: [r.phases_s.get(name, 0.0) for r in steps] for name in PHASES}
  compute = [sum(s for name, s in r.phases_s.items()
                 if name not in _NOT_COMPUTE) for r in steps]
  arrival = [w + c for w, c in zip(own[ledger_lib.DATA_WAIT], compute)]
  alone = [c - x for c, x in zip(compute, own[ledger_lib.CONTENTION])]
  # One collective for the three lists.
  slowest = max_over_processes(arrival + padding + compute + padding
                               + alone + padding)
  length = int(longest)
  slowest_arrival, slowest_compute, slowest_alone = (
      slowest[i * length:(i + 1) * length] for i in range(3))
  over_replicas = {
      ledger_lib.DATA_WAIT: slowest_replica_gap(slowest_arrival,
                                                slowest_compute),
      ledger_lib.CONTENTION: slowest_replica_gap(slowest_compute,
                                                 slowest_alone),
  }
  return {name: _move(ledger, name, over_replicas[name], own[name],
                      gradients_apart)
          for name in PHASES}


def _move(ledger: ledger_lib.StepLedger, phase: str,
          over_replicas: Sequence[float], own: Sequence[float],
          gradients_apart: Optional[Callable[[int], bool]]) -> dict:
  """Moves each step's difference between `phase` over the replicas and
  its own between `phase` and exposed_comm; returns the means moved."""
  steps = ledger.steps
  # Never more than the step's exposed_comm moves into the phase: the
  # phases must still add up to the step.
  change = [0.0 if gradients_apart and gradients_apart(r.step) else
            min(new - mine, r.phases_s.get(comm_stats.EXPOSED_COMM, 0.0))
            for new, mine, r in zip(over_replicas, own, steps)]
  ledger.relabel({i: s for i, s in enumerate(change) if s > 0},
                 comm_stats.EXPOSED_COMM, phase)
  ledger.relabel({i: -s for i, s in enumerate(change) if s < 0},
                 phase, comm_stats.EXPOSED_COMM)
  measured = change[ledger_lib.default_warmup_steps(len(steps)):] or change
  count = len(measured) or 1
  return {
      "into_ms_mean": 1e3 * sum(max(s, 0.0) for s in measured) / count,
      "out_of_ms_mean": 1e3 * sum(max(-s, 0.0) for s in measured) / count,
  }


# A replica's own waits, each with the --paired_removal cause that takes
# it away.
_OWN_WAITS = ((ledger_lib.DATA_WAIT, paired_removal.INPUT),
              (ledger_lib.CHECKPOINT_STALL, paired_removal.CHECKPOINT))


def hidden_all_reduce_notes(phases: Dict[str, dict],
                            strategy: dict) -> List[str]:
  """The run's notes on its waits taken over the replicas that can bound
  it (`verdict.BOUND_FRAC` of the step or more); none where the waits
  were not so taken.

  Such a wait is time the step stood still, but not all of it is what
  removing its cause saves. While a replica waits, the buckets its peers
  hand over meet no backward on its cores, so the all-reduce runs faster
  beside it; with the cause gone the replicas run backward together, and
  the all-reduce's tail after the last one is longer. In the fidelity
  benchmark's DDP input and checkpoint cells on 2 cores, rank 0's
  `exposed_comm` grew when the cause went in 18 and 20 of 21 runs, and
  the attribution ran past the saving by that much, run by run
  (correlation -0.95 and -0.84; BENCHMARKS page 17). No exchange of
  phases can tell the tail a step would have had without its cause; a
  paired run measures the saving itself.

  Args:
    phases: the ledger summary's phases, each with its `fraction`.
    strategy: run.json's strategy section.
  """
  if strategy.get(OVER_REPLICAS_KEY) is None:
    return []
  notes = []
  for phase, cause in _OWN_WAITS:
    fraction = phases.get(phase, {}).get("fraction", 0.0)
    if fraction >= verdict.BOUND_FRAC:
      notes.append(
          f"{phase} is {100 * fraction:.1f}% of the step, the slowest "
          f"replica's wait; removing its cause can save less, by the "
          f"all-reduce time the wait hid (while one replica waits, the "
          f"others' all-reduce has its cores); --paired_removal={cause} "
          f"measures the saving in one run")
  return notes
