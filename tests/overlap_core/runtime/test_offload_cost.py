"""The offload phase derived from the step timed with and without it."""

import pytest

from overlap_core.runtime import contention, offload_cost
from overlap_core.runtime.offload_stats import OFFLOAD


def _cost(with_ms, without_ms):
  return offload_cost.OffloadCost(
      with_offload=contention.ReferenceStep(
          step_s=tuple(ms / 1e3 for ms in with_ms), cost_s=0.0),
      without_offload=contention.ReferenceStep(
          step_s=tuple(ms / 1e3 for ms in without_ms), cost_s=0.0))


def test_the_cost_is_the_difference_of_medians_never_below_zero():
  assert _cost([5, 6, 30], [2, 3, 1]).offload_s == pytest.approx(0.004)
  assert _cost([2, 2, 2], [3, 3, 3]).offload_s == 0.0


def test_a_step_is_offload_then_contention_then_compute():
  # Offload costs 3 ms; the step alone with it took 6 ms. A 10 ms compute
  # span holds 3 of offload, 4 beyond the reference and 3 of compute.
  split = _cost([6, 6, 6], [3, 3, 3]).split_compute()
  spans = split(1.000, 1.010)
  assert [name for name, _, _ in spans] == [OFFLOAD, contention.CONTENTION,
                                            contention.COMPUTE]
  durations = [end - start for _, start, end in spans]
  assert durations == pytest.approx([0.003, 0.004, 0.003])
  # The spans tile the compute span.
  assert spans[0][1] == 1.000 and spans[-1][2] == 1.010
  assert all(a[2] == b[1] for a, b in zip(spans, spans[1:]))


def test_a_step_shorter_than_the_cost_is_all_offload():
  spans = _cost([6, 6, 6], [1, 1, 1]).split_compute()(0.0, 0.002)
  assert [(n, round(e - s, 9)) for n, s, e in spans] == [
      (OFFLOAD, 0.002), (contention.CONTENTION, 0.0),
      (contention.COMPUTE, 0.0)]


def test_an_inner_split_follows_the_offload():

  def one_ms_of_all_reduce(start_s, end_s):
    return [("exposed_comm", start_s, start_s + 0.001),
            (contention.COMPUTE, start_s + 0.001, end_s)]

  spans = _cost([20, 20], [17, 17]).split_compute(
      inner=one_ms_of_all_reduce)(0.0, 0.010)
  assert [n for n, _, _ in spans] == [OFFLOAD, "exposed_comm",
                                      contention.CONTENTION,
                                      contention.COMPUTE]


def test_the_two_ways_are_timed_interleaved_and_restored():
  calls = []
  restored = []
  cost = offload_cost.time_with_and_without(
      lambda: calls.append("with"), lambda: calls.append("without"),
      num_steps=3, restore=lambda: restored.append(True))
  # Timed once, each way takes twice the run's calls per timing.
  timed = offload_cost.TIMED_ONCE_CALLS * 3
  assert calls == ["with", "without"] * (contention.WARMUP_CALLS + timed)
  assert len(cost.with_offload.step_s) == len(
      cost.without_offload.step_s) == timed
  assert restored == [True]
  with pytest.raises(ValueError, match="num_steps"):
    offload_cost.time_with_and_without(lambda: None, lambda: None,
                                       num_steps=0, restore=lambda: None)


def test_run_json_says_where_the_phase_came_from():
  assert offload_cost.phase_from(["compute"], [OFFLOAD, "contention"]) == (
      offload_cost.DERIVED)
  assert offload_cost.phase_from(["compute", OFFLOAD], []) == (
      offload_cost.COPIES_TIMED)
  assert offload_cost.phase_from(["compute"], []) is None
