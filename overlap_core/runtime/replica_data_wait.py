"""A data-parallel step's data wait over all its replicas, not one.

In synchronous data parallelism every replica's step ends at the same
gradient all-reduce, which finishes when the last replica reaches it. So
what a replica's step waits for is not its own batch alone:

- when a peer waits longer for its batch, this replica reaches the
  all-reduce first and waits there for it. Its ledger timed that wait as
  `exposed_comm` (`overlap_core.runtime.comm_stats`), but it is input's:
  with the input free, it goes;
- when this replica's own wait only delays it to where a peer's slower
  compute would have kept the all-reduce anyway, that much of its data
  wait would not go with the input: it would wait at the all-reduce
  instead.

The fidelity benchmark saw the first (BENCHMARKS page 17): in PyTorch's
DDP cell, the step that resident batches saved beyond the data wait
followed the change in `exposed_comm`, run by run. What this does not
see: with the input free every step, the `exposed_comm` that stays grew
(in 18 of 21 runs of that cell), which no exchange of waits can tell.

So after training the replicas exchange, per step, the time each took to
reach the all-reduce (its data wait and its compute but the all-reduce's
wait) and its compute alone: two collectives, each the element-wise
maximum over processes. A step's data wait becomes what removing every
replica's input would save it, their compute unchanged:

  data_wait = max over replicas (wait + compute) - max over replicas compute

and the difference from its own wait moves from `exposed_comm` or to it,
so the phases still add up to the step. What stays `exposed_comm` is the
all-reduce itself and the waits for peers' compute.

Only where the all-reduce's wait is timed step by step (PyTorch's DDP and
Horovod around the whole model). TensorFlow derives its `exposed_comm`
from a step timed before training (`tfoverlap.exposed_comm`), so there is
no per-step wait to move; its replicas on one host share one input
pipeline. The progress lines, printed while training, show each
replica's own wait: the exchange happens once, at the end, to add no
collective to the steps.
"""

from typing import Callable, List, Optional, Sequence

from overlap_core.runtime import comm_stats
from overlap_core.runtime import ledger as ledger_lib

__all__ = ["data_wait_over_replicas", "count_data_wait_over_replicas"]

# The phases of a step that are not its compute before the all-reduce.
_NOT_COMPUTE = (ledger_lib.DATA_WAIT, comm_stats.EXPOSED_COMM,
                ledger_lib.CHECKPOINT_STALL)


def data_wait_over_replicas(slowest_arrival_s: Sequence[float],
                            slowest_compute_s: Sequence[float]
                            ) -> List[float]:
  """Each step's wait for input over the replicas: how much sooner the
  last replica would reach the all-reduce with no replica's input to wait
  for, their compute unchanged.

  Args:
    slowest_arrival_s: per step, the maximum over replicas of data wait
      plus compute.
    slowest_compute_s: per step, the maximum over replicas of compute.
  """
  return [max(arrival - compute, 0.0)
          for arrival, compute in zip(slowest_arrival_s, slowest_compute_s)]


def count_data_wait_over_replicas(
    ledger: ledger_lib.StepLedger,
    max_over_processes: Callable[[list], list], *,
    gradients_apart: Optional[Callable[[int], bool]] = None) -> dict:
  """Makes each step's data wait the replicas' (see the module
  docstring), moving the difference between data_wait and exposed_comm.
  A collective: every replica calls it once, after its last step.

  Args:
    ledger: this replica's steps.
    max_over_processes: the strategy's element-wise maximum of a list of
      floats over every process.
    gradients_apart: step number -> whether that step all-reduced no
      gradient (--all_reduce=off, or a block of --paired_removal=
      all_reduce), or None for none such. Such a step meets its peers
      only at the loss's average, after its update, and has no
      exposed_comm to move from or to, so its data wait stays its own.

  Returns:
    What run.json records, over the ledger's measured steps: the mean per
    step moved into data_wait and out of it, in ms.
  """
  steps = ledger.steps
  # Every replica runs the same steps; the lengths are exchanged first so
  # that a replica with fewer (an error elsewhere) still matches shapes.
  (longest,) = max_over_processes([float(len(steps))])
  padding = [0.0] * (int(longest) - len(steps))
  own_wait = [r.phases_s.get(ledger_lib.DATA_WAIT, 0.0) for r in steps]
  compute = [sum(s for name, s in r.phases_s.items()
                 if name not in _NOT_COMPUTE) for r in steps]
  wait = data_wait_over_replicas(
      max_over_processes([w + c for w, c in zip(own_wait, compute)]
                         + padding),
      max_over_processes(compute + padding))
  # Never more than the step's exposed_comm moves into data_wait: the
  # phases must still add up to the step.
  change = [0.0 if gradients_apart and gradients_apart(r.step) else
            min(new - own, r.phases_s.get(comm_stats.EXPOSED_COMM, 0.0))
            for new, own, r in zip(wait, own_wait, steps)]
  ledger.relabel({i: s for i, s in enumerate(change) if s > 0},
                 comm_stats.EXPOSED_COMM, ledger_lib.DATA_WAIT)
  ledger.relabel({i: -s for i, s in enumerate(change) if s < 0},
                 ledger_lib.DATA_WAIT, comm_stats.EXPOSED_COMM)
  measured = change[ledger_lib.default_warmup_steps(len(steps)):] or change
  count = len(measured) or 1
  return {
      "into_data_wait_ms_mean": 1e3 * sum(max(s, 0.0) for s in measured)
                                / count,
      "out_of_data_wait_ms_mean": 1e3 * sum(max(-s, 0.0) for s in measured)
                                  / count,
  }
