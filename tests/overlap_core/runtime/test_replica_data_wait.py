"""A data-parallel step's data wait over its replicas: the exchange's
arithmetic, on ledgers driven by a fake clock."""

import pytest

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import replica_data_wait
from overlap_core.runtime.comm_stats import EXPOSED_COMM

from tests.overlap_core.runtime.test_runtime import FakeClock

DATA_WAIT, COMPUTE = ledger_lib.DATA_WAIT, ledger_lib.COMPUTE


def _replica(steps):
  """A ledger of steps given as (data wait, compute, exposed_comm) ms."""
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  for number, (wait_ms, compute_ms, comm_ms) in enumerate(steps, 1):
    start = clock.now
    ledger.add(DATA_WAIT, start, start + wait_ms / 1e3)
    split = start + wait_ms / 1e3
    for name, at, end in ledger_lib.carve_compute(
        split, split + (compute_ms + comm_ms) / 1e3, EXPOSED_COMM,
        comm_ms / 1e3):
      ledger.add(name, at, end)
    clock.advance((wait_ms + compute_ms + comm_ms) / 1e3)
    ledger.end_step(number, num_samples=8)
  return ledger


def _max_with(peer):
  """The element-wise maximum over this replica and `peer`: its step
  count, then its lists in ms, in the order the exchange asks for them."""
  count, *lists_ms = peer
  answers = iter([count] + [[ms / 1e3 for ms in values]
                            for values in lists_ms])
  return lambda values: [max(a, b) for a, b in zip(values, next(answers))]


def _phases_ms(ledger, index):
  return {n: pytest.approx(1e3 * s)
          for n, s in ledger.steps[index].phases_s.items()}


def test_the_replicas_wait_is_what_the_last_arrival_would_save():
  # Step: [max arrival 10+5, max compute 5] -> 10 ms; own wait 0 (the
  # peer's input was what the all-reduce waited for).
  assert replica_data_wait.data_wait_over_replicas([0.015], [0.005]) == [
      pytest.approx(0.010)]
  # A wait that a slower peer's compute would have filled anyway: none.
  assert replica_data_wait.data_wait_over_replicas([0.012], [0.012]) == [0.0]


def test_a_peers_input_wait_moves_from_exposed_comm_to_data_wait():
  # This replica: no wait, 5 ms compute, 10.5 ms at the all-reduce. Its
  # peer waited 10 ms for its batch and computed 5.
  ledger = _replica([(0.0, 5.0, 10.5)] * 3)
  peer = [[3.0], [10.0 + 5.0] * 3, [5.0] * 3]  # length, arrivals, compute
  moved = replica_data_wait.count_data_wait_over_replicas(
      ledger, _max_with(peer))
  assert _phases_ms(ledger, 0) == {DATA_WAIT: 10.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 0.5}
  assert moved["into_data_wait_ms_mean"] == pytest.approx(10.0)
  assert moved["out_of_data_wait_ms_mean"] == 0.0
  # The step is as long as it was; the trace's spans moved with it.
  assert ledger.steps[0].duration_s == pytest.approx(0.0155)
  names = [s.name for s in ledger.spans if s.step == 1]
  assert names == [DATA_WAIT, DATA_WAIT, EXPOSED_COMM, COMPUTE, "step"]


def test_an_own_wait_a_slower_peer_would_have_hidden_moves_out():
  # This replica waited 4 ms for its batch, but its peer computed 6 ms
  # longer: the all-reduce would have waited for the peer anyway.
  ledger = _replica([(4.0, 5.0, 2.5)] * 2)
  peer = [[2.0], [11.0] * 2, [11.0] * 2]
  moved = replica_data_wait.count_data_wait_over_replicas(
      ledger, _max_with(peer))
  assert _phases_ms(ledger, 1) == {DATA_WAIT: 0.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 6.5}
  assert moved["out_of_data_wait_ms_mean"] == pytest.approx(4.0)


def test_no_more_moves_in_than_the_step_waited_at_the_all_reduce():
  ledger = _replica([(0.0, 5.0, 1.0)])
  peer = [[1.0], [20.0], [5.0]]
  replica_data_wait.count_data_wait_over_replicas(ledger, _max_with(peer))
  assert _phases_ms(ledger, 0) == {DATA_WAIT: 1.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 0.0}


def test_a_replica_with_fewer_steps_still_matches_its_peers_shapes():
  ledger = _replica([(0.0, 5.0, 1.0)])
  seen = []

  def max_over_processes(values):
    seen.append(len(values))
    return [max(v, 2.0) for v in values]

  replica_data_wait.count_data_wait_over_replicas(ledger, max_over_processes)
  assert seen == [1, 2, 2]  # the lengths, then two lists of the longest


def test_a_step_without_the_gradient_all_reduce_keeps_its_own_wait():
  # As in the case above, this replica's 4 ms wait a slower peer would
  # have hidden, but step 2 all-reduced no gradient: it met its peer only
  # at the loss's average, and nothing moves into exposed_comm there.
  ledger = _replica([(4.0, 5.0, 2.5), (4.0, 5.0, 0.0)])
  peer = [[2.0], [11.0] * 2, [11.0] * 2]
  replica_data_wait.count_data_wait_over_replicas(
      ledger, _max_with(peer), gradients_apart=lambda step: step == 2)
  assert _phases_ms(ledger, 0) == {DATA_WAIT: 0.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 6.5}
  assert _phases_ms(ledger, 1) == {DATA_WAIT: 4.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 0.0}
