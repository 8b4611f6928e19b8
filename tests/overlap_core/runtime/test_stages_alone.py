"""A pipeline's stages timed alone one at a time, where one ledger stands
for the mean stage (`contention.StagesAlone`, TensorFlow's stage servers),
and the pieces both sides share with it: the stage split against a
reference (`contention.split_stage_compute`), calls timed by the step's
own clock, and a stage's busy time (`pipeline_stats.busy_seconds`)."""

import pytest

from overlap_core.runtime import contention, pipeline_stats


def _reference(*step_s):
  return contention.ReferenceStep(step_s=tuple(step_s), cost_s=0.5)


def _mean_stage(start_s, end_s, idle_s):
  """The spans of the mean stage's step: stage_compute, then its idle
  time as bubble at the end (`ProcessPipelineRuntime.record_step`)."""
  return pipeline_stats.partition_span(
      start_s, end_s, [(pipeline_stats.BUBBLE, end_s - idle_s, end_s)])


def _phase_s(spans, phase):
  return sum(end - begin for name, begin, end in spans if name == phase)


def test_the_mean_stages_reference_is_the_mean_of_the_stages_medians():
  alone = contention.StagesAlone((_reference(0.010, 0.012, 0.030),
                                  _reference(0.004, 0.006, 0.005)))
  assert alone.reference_s == pytest.approx((0.012 + 0.005) / 2)
  assert alone.cost_s == pytest.approx(1.0)
  assert alone.phases_derived == [contention.CONTENTION]


def test_the_mean_stages_compute_beyond_it_is_contention_not_its_bubble():
  alone = contention.StagesAlone((_reference(0.012), _reference(0.004)))
  split = alone.split_stage_compute(
      lambda s, e: _mean_stage(s, e, idle_s=0.005),
      pipeline_stats.STAGE_COMPUTE)
  # A 20 ms step, 5 of it the mean stage's bubble: 15 ms of stage_compute
  # against 8 alone leaves 7 of contention, carved from compute only.
  spans = split(1.0, 1.020)
  assert [name for name, _, _ in spans] == [
      contention.CONTENTION, pipeline_stats.STAGE_COMPUTE,
      pipeline_stats.BUBBLE]
  assert _phase_s(spans, contention.CONTENTION) == pytest.approx(0.007)
  assert _phase_s(spans, pipeline_stats.STAGE_COMPUTE) == pytest.approx(
      0.008)
  assert _phase_s(spans, pipeline_stats.BUBBLE) == pytest.approx(0.005)
  # The split is the one rule a single stage's reference uses.
  single = _reference(0.008).split_stage_compute(
      lambda s, e: _mean_stage(s, e, idle_s=0.005),
      pipeline_stats.STAGE_COMPUTE)
  assert single(1.0, 1.020) == spans


def test_run_json_lists_every_stage_alone():
  record = contention.StagesAlone(
      (_reference(0.010, 0.012), _reference(0.004))).to_dict()
  assert record["reference_ms"] == pytest.approx((11.0 + 4.0) / 2)
  assert [row["stage"] for row in record["per_stage"]] == [0, 1]
  assert record["per_stage"][0]["step_ms"] == pytest.approx([10.0, 12.0])
  assert record["per_stage"][1]["reference_ms"] == pytest.approx(4.0)
  assert record["warmup_calls"] == contention.WARMUP_CALLS


def test_a_step_on_its_own_clock_is_timed_by_what_it_returns():
  calls, restored = [], []

  def run_step():
    calls.append(1)
    return 0.25  # far from the host's span of the call

  reference = contention.time_reference(
      run_step, num_steps=3, restore=lambda: restored.append(1),
      own_clock=True)
  assert reference.step_s == (0.25, 0.25, 0.25)
  assert len(calls) == contention.WARMUP_CALLS + 3 and restored == [1]


def test_a_stages_busy_time_is_the_union_of_its_intervals():
  # Overlapping intervals count once; the gap between them does not.
  assert pipeline_stats.busy_seconds(
      [(1.0, 2.0), (1.5, 3.0), (4.0, 4.5)]) == pytest.approx(2.5)
  assert pipeline_stats.busy_seconds([]) == 0.0
