"""A data-parallel step's data wait and contention over its replicas: the
exchange's arithmetic, on ledgers driven by a fake clock."""

import pytest

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import replica_phases, verdict
from overlap_core.runtime.comm_stats import EXPOSED_COMM

from tests.overlap_core.runtime.test_runtime import FakeClock

DATA_WAIT, COMPUTE = ledger_lib.DATA_WAIT, ledger_lib.COMPUTE
CONTENTION = ledger_lib.CONTENTION


def _replica(steps):
  """A ledger of steps given as (data wait, compute, exposed_comm) ms, or
  (data wait, compute, exposed_comm, contention) ms, contention timed
  after compute (the step alone's share) and before the all-reduce."""
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  for number, (wait_ms, compute_ms, comm_ms, *contention) in enumerate(
      steps, 1):
    contention_ms = contention[0] if contention else 0.0
    at = clock.now
    for name, ms in ((DATA_WAIT, wait_ms), (COMPUTE, compute_ms),
                     (CONTENTION, contention_ms), (EXPOSED_COMM, comm_ms)):
      if ms or name != CONTENTION:
        ledger.add(name, at, at + ms / 1e3)
      at += ms / 1e3
    clock.advance(at - clock.now)
    ledger.end_step(number, num_samples=8)
  return ledger


def _max_with(peer):
  """The element-wise maximum over this replica and `peer`, given as its
  step count and its lists in ms: arrivals (wait + compute), compute,
  and compute less contention, which the exchange asks for as one."""
  count, arrivals, compute, alone = peer
  answers = iter([count, [ms / 1e3 for ms in arrivals + compute + alone]])
  return lambda values: [max(a, b) for a, b in zip(values, next(answers))]


def _phases_ms(ledger, index):
  # A step without contention has none, or none left after a move.
  return {n: pytest.approx(1e3 * s)
          for n, s in ledger.steps[index].phases_s.items()
          if s or n != CONTENTION}


def test_a_phase_over_the_replicas_is_what_the_last_arrival_would_save():
  # Step: [max arrival 10+5, max compute 5] -> 10 ms; own wait 0 (the
  # peer's input was what the all-reduce waited for).
  assert replica_phases.slowest_replica_gap([0.015], [0.005]) == [
      pytest.approx(0.010)]
  # A wait that a slower peer's compute would have filled anyway: none.
  assert replica_phases.slowest_replica_gap([0.012], [0.012]) == [0.0]


def test_a_peers_input_wait_moves_from_exposed_comm_to_data_wait():
  # This replica: no wait, 5 ms compute, 10.5 ms at the all-reduce. Its
  # peer waited 10 ms for its batch and computed 5.
  ledger = _replica([(0.0, 5.0, 10.5)] * 3)
  peer = [[3.0], [10.0 + 5.0] * 3, [5.0] * 3, [5.0] * 3]
  moved = replica_phases.count_over_replicas(ledger, _max_with(peer))
  assert _phases_ms(ledger, 0) == {DATA_WAIT: 10.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 0.5}
  assert moved[DATA_WAIT]["into_ms_mean"] == pytest.approx(10.0)
  assert moved[DATA_WAIT]["out_of_ms_mean"] == 0.0
  assert moved[CONTENTION] == {"into_ms_mean": 0.0, "out_of_ms_mean": 0.0}
  # The step is as long as it was; the trace's spans moved with it.
  assert ledger.steps[0].duration_s == pytest.approx(0.0155)
  names = [s.name for s in ledger.spans if s.step == 1]
  assert names == [DATA_WAIT, COMPUTE, DATA_WAIT, EXPOSED_COMM, "step"]


def test_an_own_wait_a_slower_peer_would_have_hidden_moves_out():
  # This replica waited 4 ms for its batch, but its peer computed 6 ms
  # longer: the all-reduce would have waited for the peer anyway.
  ledger = _replica([(4.0, 5.0, 2.5)] * 2)
  peer = [[2.0], [11.0] * 2, [11.0] * 2, [11.0] * 2]
  moved = replica_phases.count_over_replicas(ledger, _max_with(peer))
  assert _phases_ms(ledger, 1) == {DATA_WAIT: 0.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 6.5}
  assert moved[DATA_WAIT]["out_of_ms_mean"] == pytest.approx(4.0)


def test_own_contention_a_slower_peer_would_have_hidden_moves_out():
  # This replica's compute: 5 ms alone and 2 ms of contention; its peer's
  # step alone takes 7 ms and nothing slows it. Without contention this
  # replica would only wait 2 ms longer at the all-reduce.
  ledger = _replica([(0.0, 5.0, 1.0, 2.0)] * 2)
  peer = [[2.0], [7.0] * 2, [7.0] * 2, [7.0] * 2]
  moved = replica_phases.count_over_replicas(ledger, _max_with(peer))
  assert _phases_ms(ledger, 1) == {DATA_WAIT: 0.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 3.0}
  assert moved[CONTENTION]["out_of_ms_mean"] == pytest.approx(2.0)
  assert moved[DATA_WAIT] == {"into_ms_mean": 0.0, "out_of_ms_mean": 0.0}


def test_a_peers_contention_moves_from_exposed_comm_to_contention():
  # This replica: 5 ms alone, 1 ms of contention, 3.5 ms at the
  # all-reduce. Its peer: 5 ms alone slowed to 9 by the work beside it.
  # Without contention anywhere the last arrival would come 4 ms sooner.
  ledger = _replica([(0.0, 5.0, 3.5, 1.0)])
  peer = [[1.0], [9.0], [9.0], [5.0]]
  moved = replica_phases.count_over_replicas(ledger, _max_with(peer))
  assert _phases_ms(ledger, 0) == {DATA_WAIT: 0.0, COMPUTE: 5.0,
                                   CONTENTION: 4.0, EXPOSED_COMM: 0.5}
  assert moved[CONTENTION]["into_ms_mean"] == pytest.approx(3.0)


def test_data_wait_and_contention_over_replicas_sum_to_the_arrivals_gap():
  # This replica waited 1 ms for its batch and ran 5 ms alone plus 3 of
  # contention; its peer waited 4 and ran 6 alone plus 1. Removing both
  # causes on both would bring the last arrival from 11 ms to 6: the two
  # phases say 3 and 2, and exposed_comm keeps the all-reduce and the wait
  # for the peer's longer step alone.
  ledger = _replica([(1.0, 5.0, 2.5, 3.0)])
  peer = [[1.0], [11.0], [7.0], [6.0]]
  replica_phases.count_over_replicas(ledger, _max_with(peer))
  phases = _phases_ms(ledger, 0)
  assert phases[DATA_WAIT] == 3.0  # 11 - max(8, 7)
  assert phases[CONTENTION] == 2.0  # max(8, 7) - max(5, 6)
  assert phases[EXPOSED_COMM] == 1.5  # the 11.5 ms step's remainder


def test_no_more_moves_in_than_the_step_waited_at_the_all_reduce():
  ledger = _replica([(0.0, 5.0, 1.0)])
  peer = [[1.0], [20.0], [5.0], [5.0]]
  replica_phases.count_over_replicas(ledger, _max_with(peer))
  assert _phases_ms(ledger, 0) == {DATA_WAIT: 1.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 0.0}


def test_a_replica_with_fewer_steps_still_matches_its_peers_shapes():
  ledger = _replica([(0.0, 5.0, 1.0)])
  seen = []

  def max_over_processes(values):
    seen.append(len(values))
    return [max(v, 2.0) for v in values]

  replica_phases.count_over_replicas(ledger, max_over_processes)
  assert seen == [1, 6]  # the lengths, then three lists of the longest


def test_a_step_without_the_gradient_all_reduce_keeps_its_own_phases():
  # As in the cases above, this replica's 4 ms wait and 2 ms of
  # contention a slower peer would have hidden, but step 2 all-reduced no
  # gradient: it met its peer only at the loss's average, and nothing
  # moves into exposed_comm there.
  ledger = _replica([(4.0, 5.0, 2.5, 2.0), (4.0, 5.0, 0.0, 2.0)])
  peer = [[2.0], [13.0] * 2, [13.0] * 2, [13.0] * 2]
  replica_phases.count_over_replicas(
      ledger, _max_with(peer), gradients_apart=lambda step: step == 2)
  assert _phases_ms(ledger, 0) == {DATA_WAIT: 0.0, COMPUTE: 5.0,
                                   EXPOSED_COMM: 8.5}
  assert _phases_ms(ledger, 1) == {DATA_WAIT: 4.0, COMPUTE: 5.0,
                                   CONTENTION: 2.0, EXPOSED_COMM: 0.0}


def _phases(**fractions):
  return {name: {"fraction": f} for name, f in fractions.items()}


OVER_REPLICAS = {replica_phases.OVER_REPLICAS_KEY: {}}


def test_a_wait_that_can_bound_the_run_says_what_removal_may_not_save():
  bound = verdict.BOUND_FRAC
  [note] = replica_phases.hidden_all_reduce_notes(
      _phases(data_wait=bound, checkpoint_stall=bound / 2), OVER_REPLICAS)
  assert note.startswith(f"data_wait is {100 * bound:.1f}% of the step")
  assert "--paired_removal=input" in note
  [note] = replica_phases.hidden_all_reduce_notes(
      _phases(data_wait=0.0, checkpoint_stall=0.3), OVER_REPLICAS)
  assert note.startswith("checkpoint_stall is 30.0%")
  assert "--paired_removal=checkpoint" in note
  assert len(replica_phases.hidden_all_reduce_notes(
      _phases(data_wait=0.3, checkpoint_stall=0.3), OVER_REPLICAS)) == 2


def test_waits_not_taken_over_replicas_or_below_the_cut_have_no_note():
  # One process, or TensorFlow's replicas: no exchange, no such note.
  assert not replica_phases.hidden_all_reduce_notes(
      _phases(data_wait=0.5), {"name": "mirrored"})
  assert not replica_phases.hidden_all_reduce_notes(
      _phases(data_wait=verdict.BOUND_FRAC * 0.99), OVER_REPLICAS)
  assert not replica_phases.hidden_all_reduce_notes({}, OVER_REPLICAS)
