"""Contention: the compute beyond the step timed alone, carved out of a
step's compute span."""

import pytest

from overlap_core.runtime import contention, contention_split
from overlap_core.runtime import ledger as ledger_lib

from tests.helpers import one_line_error


def _reference(*step_s):
  return contention.ReferenceStep(step_s=tuple(step_s), cost_s=0.0)


def test_the_reference_is_the_median_of_the_timed_calls():
  assert _reference(0.009, 0.007, 0.030).reference_s == 0.009


def test_a_step_beyond_the_reference_carves_the_excess_as_contention():
  spans = _reference(0.007).split_compute()(1.0, 1.010)
  assert [name for name, _, _ in spans] == [ledger_lib.CONTENTION,
                                            ledger_lib.COMPUTE]
  (_, start, split), (_, split_again, end) = spans
  assert (start, end, split_again) == (1.0, 1.010, split)
  assert split - start == pytest.approx(0.003)


def test_a_step_faster_than_the_reference_has_no_contention():
  spans = _reference(0.020).split_compute()(1.0, 1.010)
  assert spans[0] == (ledger_lib.CONTENTION, 1.0, 1.0)
  assert spans[1] == (ledger_lib.COMPUTE, 1.0, 1.010)


def _carved_ms(split, durations_ms):
  """The contention each step of `durations_ms` is carved, in ms."""
  carved = []
  for duration_ms in durations_ms:
    spans = split(0.0, duration_ms / 1e3)
    carved.append(1e3 * sum(end - start for name, start, end in spans
                            if name == ledger_lib.CONTENTION))
  return carved


def test_a_step_below_the_reference_is_paid_back_by_the_next_excess():
  # Steps jittering 1 ms either side of a 10 ms reference: the fast one
  # banks its millisecond and the slow one after it pays it back, so the
  # run's contention is the steps' mean excess, 0, not the slow half.
  split = _reference(0.010).split_compute()
  assert _carved_ms(split, [9.0, 11.0] * 5) == pytest.approx([0.0] * 10)
  # A real excess beyond the bank is carved.
  assert _carved_ms(split, [9.0, 13.0]) == pytest.approx([0.0, 2.0])


def test_the_bank_holds_at_most_one_reference_step():
  # Ten steps 5 ms below a 7 ms reference bank 7 ms, not 50, so a later
  # 10 ms excess still shows 3 of them.
  split = _reference(0.007).split_compute()
  assert _carved_ms(split, [2.0] * 10 + [17.0])[-1] == pytest.approx(3.0)


def _run(split, durations_ms, *, first_step=1):
  """A ledger whose steps of `durations_ms` are each one compute span split
  by `split`, back to back from 0, as the loops record them."""
  ledger = ledger_lib.StepLedger(clock=lambda: 0.0)
  start_s = 0.0
  for step, duration_ms in enumerate(durations_ms, start=first_step):
    end_s = start_s + duration_ms / 1e3
    for name, begin, end in split(start_s, end_s):
      ledger.add(name, begin, end)
    ledger.end_step(step, 8, end_s=end_s)
    start_s = end_s
  return ledger


def _phase_ms(ledger, name):
  return [1e3 * r.phases_s.get(name, 0.0) for r in ledger.steps]


def test_settling_gives_the_unpaid_balance_back_to_the_latest_carves():
  # Against a 10 ms reference, two steps 2 ms over carve 4 ms; the two
  # after run 1 ms under, which no later excess pays back: the steps'
  # mean excess is 0.5 ms, not the 1 ms carved. Settling gives 2 ms back
  # to compute from the latest carve first.
  split = _reference(0.010).split_compute()
  ledger = _run(split, [12.0, 12.0, 9.0, 9.0])
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx(
      [2.0, 2.0, 0.0, 0.0])
  assert split.settle(ledger) == pytest.approx(0.002)
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx(
      [2.0, 0.0, 0.0, 0.0])
  assert _phase_ms(ledger, ledger_lib.COMPUTE) == pytest.approx(
      [10.0, 12.0, 9.0, 9.0])
  assert sum(_phase_ms(ledger, ledger_lib.CONTENTION)) / 4 == pytest.approx(
      (2 + 2 - 1 - 1) / 4)
  # Each step still adds up; the move is reported per measured step.
  assert ledger.summary(warmup_steps=0)["moved_ms"] == {
      contention_split.SETTLED_BALANCE: pytest.approx(0.5),
      contention_split.RETIMED_REFERENCE: 0.0}
  # How the steps stood against the reference goes to the summary.
  assert ledger.summary(warmup_steps=0)["against_step_alone"] == {
      "steps": 4, "steps_below": 2, "median_excess_ms": pytest.approx(0.5)}
  # Settled once: the balance is empty now.
  assert split.settle(ledger) == 0.0


def test_settling_moves_no_more_than_was_carved():
  # The bank (3 ms) exceeds every carve before it (1 ms): only that
  # moves, and no step's contention goes below zero.
  split = _reference(0.010).split_compute()
  ledger = _run(split, [11.0, 7.0])
  assert split.settle(ledger) == pytest.approx(0.001)
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx([0.0, 0.0])


def test_a_run_that_ends_on_its_excess_settles_nothing():
  split = _reference(0.010).split_compute()
  ledger = _run(split, [9.0, 12.0])
  assert split.settle(ledger) == 0.0
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx([0.0, 1.0])
  # The record keeps its keys: the move is there, at zero.
  assert ledger.summary(warmup_steps=0)["moved_ms"] == {
      contention_split.SETTLED_BALANCE: 0.0,
      contention_split.RETIMED_REFERENCE: 0.0}


def test_the_reference_is_the_lower_median_of_the_two_timings():
  timed_slow = _reference(0.014, 0.013, 0.015)
  assert timed_slow.lowered_by_s == 0.0  # not timed again yet
  retimed = timed_slow.with_later(_reference(0.010, 0.011, 0.009))
  assert retimed.reference_s == 0.010
  assert retimed.lowered_by_s == pytest.approx(0.004)
  # A later timing slower than the first (work still beside it) leaves
  # the reference where it was.
  assert timed_slow.with_later(_reference(0.020)).lowered_by_s == 0.0
  assert retimed.to_dict()["later_step_ms"] == pytest.approx(
      [10.0, 11.0, 9.0])


def test_a_lower_reference_found_after_the_loop_carves_every_step_again():
  # The loop split against a 12 ms step alone that a slow spell of the
  # host inflated; timed again after the loop it is 10 ms. Live, the
  # steps (11, 13, 10, 12 ms) carve nothing: the 11 ms step banks 1 ms,
  # which the 13 ms step's excess pays back, and the 10 ms step banks
  # what the last one's zero excess leaves. Carved again against 10 ms
  # they carve 1, 3, 0 and 2 ms, the steps' excess over the lower
  # reference, 1.5 ms a step.
  kept = []
  split = contention.retime_after_loop(
      _reference(0.012).split_compute(), _reference(0.012),
      retime=lambda: _reference(0.010), keep=kept.append)
  ledger = _run(split, [11.0, 13.0, 10.0, 12.0])
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx(
      [0.0, 0.0, 0.0, 0.0])
  split.settle(ledger)
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx(
      [1.0, 3.0, 0.0, 2.0])
  # Each step still adds up, what moved is named, and the record keeps
  # both timings.
  assert [1e3 * r.duration_s for r in ledger.steps] == pytest.approx(
      [11.0, 13.0, 10.0, 12.0])
  assert sum(_phase_ms(ledger, ledger_lib.COMPUTE)) == pytest.approx(40.0)
  assert ledger.summary(warmup_steps=0)["moved_ms"][
      contention_split.RETIMED_REFERENCE] == pytest.approx(1.5)
  (record,) = kept
  assert record.reference_s == 0.010 and record.step_s == (0.012,)
  assert ledger.summary(warmup_steps=0)["against_step_alone"][
      "median_excess_ms"] == pytest.approx(1.5)


def test_a_reference_no_lower_after_the_loop_leaves_the_carve_alone():
  kept = []
  split = contention.retime_after_loop(
      _reference(0.010).split_compute(), _reference(0.010),
      retime=lambda: _reference(0.011), keep=kept.append)
  ledger = _run(split, [12.0, 9.0, 12.0])
  before = _phase_ms(ledger, ledger_lib.CONTENTION)
  split.settle(ledger)
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx(before)
  assert kept[0].reference_s == 0.010


def test_only_a_plain_step_alone_is_timed_again():
  # An offload's cost and a pipeline's stages are timed once, before the
  # loop: their splits are left as they are.
  split = _reference(0.010).split_compute()
  stages = contention.StagesAlone(stages=(_reference(0.010),))
  assert contention.retime_after_loop(split, stages, retime=None,
                                      keep=None) is split


def test_lowering_the_balance_never_carves_a_step_less():
  balance = contention_split.ExcessBalance(0.010)
  excess_s = [0.001, -0.003, 0.002, -0.001, 0.004, -0.010, 0.0005]
  carved = [balance.carve(e) for e in excess_s]
  extra = balance.lower(0.0015)
  assert all(e >= 0.0 for e in extra)
  again = contention_split.ExcessBalance(0.0085)
  assert [c + e for c, e in zip(carved, extra)] == pytest.approx(
      [again.carve(e + 0.0015) for e in excess_s])


def test_a_move_the_record_does_not_list_is_refused():
  # The record lists every named move, so a new one must be listed too.
  ledger = _run(_reference(0.010).split_compute(), [12.0])
  message = one_line_error(ledger.relabel, {0: 0.001},
                           ledger_lib.CONTENTION, ledger_lib.COMPUTE,
                           why="tidied")
  assert "unknown move 'tidied'" in message


def test_steps_below_the_step_alone_at_the_median_say_it_was_timed_slow():
  # Steps with nothing beside them 1 ms under a reference timed 1 ms slow,
  # then 1.5 ms of input work beside the last two: no contention is carved,
  # and the note says by how much it may be understated.
  split = _reference(0.011).split_compute()
  ledger = _run(split, [10.0, 10.0, 10.0, 11.5, 11.5])
  split.settle(ledger)
  assert sum(_phase_ms(ledger, ledger_lib.CONTENTION)) == 0.0
  check = ledger.summary(warmup_steps=0)["against_step_alone"]
  assert check == {"steps": 5, "steps_below": 3,
                   "median_excess_ms": pytest.approx(-1.0)}
  note = contention_split.understated_note(check)
  assert note.startswith("contention may be understated: the steps' "
                         "compute ran 1.00 ms below the step timed alone "
                         "at the median (3 of 5 measured steps below it)")
  # At or above the step alone at the median: nothing to say.
  assert contention_split.understated_note(
      {"steps": 2, "steps_below": 1, "median_excess_ms": 0.0}) is None
  assert contention_split.understated_note(None) is None


def test_a_run_split_against_no_step_alone_has_no_check():
  ledger = ledger_lib.StepLedger(clock=lambda: 0.0)
  ledger.add(ledger_lib.COMPUTE, 0.0, 0.01)
  ledger.end_step(1, 8, end_s=0.01)
  assert ledger.summary(warmup_steps=0)["against_step_alone"] is None


def test_a_stage_settles_back_into_its_own_compute_phase():
  def inner(start_s, end_s):
    return [("stage_compute", start_s, end_s)]

  split = _reference(0.010).split_stage_compute(inner, "stage_compute")
  ledger = _run(split, [12.0, 9.0])
  split.settle(ledger)
  assert _phase_ms(ledger, ledger_lib.CONTENTION) == pytest.approx([1.0, 0.0])
  assert _phase_ms(ledger, "stage_compute") == pytest.approx([11.0, 9.0])


def test_a_stage_banks_its_time_below_the_reference_too():
  def inner(start_s, end_s):
    return [("stage_compute", start_s, end_s)]

  split = _reference(0.010).split_stage_compute(inner, "stage_compute")
  assert _carved_ms(split, [9.0, 11.0, 12.0]) == pytest.approx(
      [0.0, 0.0, 2.0])


def test_an_inner_split_keeps_its_parts_first_and_bounds_the_carve():
  # An exposed all-reduce of 4 ms first; the reference (a whole step, its
  # all-reduce included) is 5 ms of a 10 ms span, so 5 ms are contention,
  # but only 6 ms of compute are left to take them from.
  def inner(start_s, end_s):
    return ledger_lib.carve_compute(start_s, end_s, ledger_lib.EXPOSED_COMM,
                                    0.004)

  spans = _reference(0.005).split_compute(inner=inner)(0.0, 0.010)
  names = [name for name, _, _ in spans]
  assert names == [ledger_lib.EXPOSED_COMM, ledger_lib.CONTENTION,
                   ledger_lib.COMPUTE]
  durations = {name: end - start for name, start, end in spans}
  assert durations[ledger_lib.EXPOSED_COMM] == pytest.approx(0.004)
  assert durations[ledger_lib.CONTENTION] == pytest.approx(0.005)
  assert durations[ledger_lib.COMPUTE] == pytest.approx(0.001)
  # The spans tile the step's compute span.
  assert spans[0][1] == 0.0 and spans[-1][2] == 0.010
  assert all(a[2] == b[1] for a, b in zip(spans, spans[1:]))


def test_a_reference_without_the_parts_leaves_them_out_of_the_excess():
  # The same 10 ms step, its reference of 5 ms timed without the 4 ms
  # all-reduce (DDP's paused): only 1 ms of compute is beyond it.
  def inner(start_s, end_s):
    return ledger_lib.carve_compute(start_s, end_s, ledger_lib.EXPOSED_COMM,
                                    0.004)

  reference = contention.ReferenceStep(step_s=(0.005,), cost_s=0.0,
                                       holds_parts=False)
  spans = reference.split_compute(inner=inner)(0.0, 0.010)
  durations = {name: end - start for name, start, end in spans}
  assert durations[ledger_lib.EXPOSED_COMM] == pytest.approx(0.004)
  assert durations[ledger_lib.CONTENTION] == pytest.approx(0.001)
  assert durations[ledger_lib.COMPUTE] == pytest.approx(0.005)
  assert reference.to_dict()["with_all_reduce"] is False


def test_a_stage_carves_contention_from_its_compute_spans_only():
  # A stage's 10 ms step: 2 ms of compute, a 3 ms bubble, 5 ms of
  # compute; alone, its work took 5 ms, so 2 ms of the 7 of compute are
  # contention, carved from the first compute spans; the bubble stays.
  def inner(start_s, end_s):
    return [("stage_compute", 0.0, 0.002), ("bubble", 0.002, 0.005),
            ("stage_compute", 0.005, 0.010)]

  spans = _reference(0.005).split_stage_compute(inner, "stage_compute")(
      0.0, 0.010)
  assert spans == [(ledger_lib.CONTENTION, 0.0, 0.002),
                   ("bubble", 0.002, 0.005),
                   ("stage_compute", 0.005, 0.010)]
  # A step at the reference has none, recorded as an empty span, so every
  # step of the run has the phase.
  assert _reference(0.007).split_stage_compute(inner, "stage_compute")(
      0.0, 0.010) == [(ledger_lib.CONTENTION, 0.0, 0.0), *inner(0.0, 0.010)]


def test_an_inner_split_must_end_with_compute():
  with pytest.raises(ValueError, match="not compute"):
    _reference(0.005).split_compute(
        inner=lambda s, e: [(ledger_lib.EXPOSED_COMM, s, e)])(0.0, 0.01)


def test_time_reference_times_only_the_calls_after_the_warm_up():
  calls = []
  restored = []
  reference = contention.time_reference(
      lambda: calls.append(1), num_steps=3,
      restore=lambda: restored.append(len(calls)))
  assert len(calls) == contention.WARMUP_CALLS + 3
  assert len(reference.step_s) == 3
  assert restored == [len(calls)]  # put back once, after every call
  described = reference.to_dict()
  assert described["warmup_calls"] == contention.WARMUP_CALLS
  assert len(described["step_ms"]) == 3


def test_time_reference_restores_even_when_a_step_fails():
  restored = []

  def failing_step():
    raise RuntimeError("out of memory")

  with pytest.raises(RuntimeError, match="out of memory"):
    contention.time_reference(failing_step, num_steps=2,
                              restore=lambda: restored.append(True))
  assert restored == [True]


def test_time_reference_needs_a_timed_call():
  with pytest.raises(ValueError, match="num_steps"):
    contention.time_reference(lambda: None, num_steps=0, restore=lambda: None)


def test_contention_is_a_share_of_its_own_in_progress_windows():
  clock = iter(float(t) for t in range(100))
  ledger = ledger_lib.StepLedger(clock=lambda: next(clock))
  for name, start, end in _reference(6.0).split_compute()(0.0, 8.0):
    ledger.add(name, start, end)
  ledger.end_step(1, num_samples=1, end_s=8.0)
  shares = ledger_lib.summarize_window(ledger.steps)
  assert shares["compute_fraction"] == pytest.approx(0.75)
  assert shares["contention_fraction"] == pytest.approx(0.25)


def test_a_run_times_its_reference_unless_off_or_split_its_own_way():
  plain = dict(pipelined=False, burst=False, fixed_offload=False)
  assert contention.times_reference(5, **plain)
  assert not contention.times_reference(0, **plain)
  for own_split in plain:
    assert not contention.times_reference(5, **{**plain, own_split: True})


def test_time_reference_runs_before_call_untimed_before_every_call():
  clock = [0.0]
  order = []

  def before_call():
    order.append("barrier")
    clock[0] += 5.0  # a wait for the slower replica: never timed

  def run_step():
    order.append("step")

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(contention.time, "perf_counter", lambda: clock[0])
    reference = contention.time_reference(
        run_step, num_steps=2, restore=lambda: None, before_call=before_call)
  calls = contention.WARMUP_CALLS + 2
  assert order == ["barrier", "step"] * calls
  assert reference.step_s == (0.0, 0.0)


def test_a_reference_less_its_part_splits_the_step_without_it():
  # TensorFlow's step alone took 10 ms with an all-reduce derived to cost
  # 4 ms: a step without the all-reduce that takes 7 ms ran 1 ms beyond
  # what the ledger claims it costs (6 ms), and carves that as contention.
  full = contention.ReferenceStep(step_s=(0.009, 0.010, 0.011), cost_s=0.0)
  without = full.less(0.004)
  assert without.reference_s == pytest.approx(0.006)
  assert without.holds_parts is False and full.reference_s == 0.010
  spans = without.split_compute()(0.0, 0.007)
  durations = {name: end - start for name, start, end in spans}
  assert durations == {ledger_lib.CONTENTION: pytest.approx(0.001),
                       ledger_lib.COMPUTE: pytest.approx(0.006)}
