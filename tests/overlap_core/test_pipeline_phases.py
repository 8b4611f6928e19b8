"""The shared pipeline measurement schema: phases, recorder, run.json section."""

import threading

import pytest

from overlap_core.runtime import pipeline_stats as ps


def test_phase_names_are_the_shared_schema():
  assert (ps.STAGE_COMPUTE, ps.BUBBLE, ps.TRANSFER) == (
      "stage_compute", "bubble", "transfer")


def test_recorder_keeps_per_step_medians_per_stage():
  stats = ps.StageStats(num_stages=2)
  for step_ms in (10.0, 30.0, 20.0):
    stats.add(0, ps.STAGE_COMPUTE, step_ms / 1e3)
    stats.add(0, ps.BUBBLE, 5e-3)
    stats.add(1, ps.STAGE_COMPUTE, 4e-3)
    stats.add(1, ps.STAGE_COMPUTE, 4e-3)  # two calls in one step add up
    stats.add(1, ps.TRANSFER, 2e-3)
    stats.end_step()
  per_stage = stats.per_stage_ms()
  assert per_stage[0][ps.STAGE_COMPUTE] == pytest.approx(20.0)
  assert per_stage[1][ps.STAGE_COMPUTE] == pytest.approx(8.0)
  # bubble 5 over (20 + 5) + (8 + 2): the medians, summed over stages.
  assert stats.bubble_fraction() == pytest.approx(5 / 35)
  # The first step left out, as warm-up: medians of 30 and 20.
  assert stats.per_stage_ms(skip_steps=1)[0][ps.STAGE_COMPUTE] == (
      pytest.approx(25.0))
  with pytest.raises(ValueError, match="phase='compute'"):
    stats.add(0, "compute", 1.0)
  with pytest.raises(ValueError, match="stage=2"):
    stats.add(2, ps.BUBBLE, 1.0)


def test_recorder_is_thread_safe():
  stats = ps.StageStats(num_stages=4)

  def record(stage):
    for _ in range(1000):
      stats.add(stage, ps.TRANSFER, 1e-3)

  threads = [threading.Thread(target=record, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  stats.end_step()
  # 1000 additions of 1 ms per stage, none lost to a race.
  assert [s[ps.TRANSFER] for s in stats.per_stage_ms()] == pytest.approx(
      [1000.0] * 4)


def test_bubble_theory_is_gpipes():
  assert ps.bubble_fraction_theory("gpipe", 4, 4) == pytest.approx(3 / 7)
  assert ps.bubble_fraction_theory("1f1b", 2, 8) == pytest.approx(1 / 9)
  assert ps.bubble_fraction_theory("zero_bubble", 2, 8) is None


def test_split_compute_span_partitions_the_span():
  parts = ps.split_compute_span(1.0, 2.0, stage_compute_s=0.5,
                                transfer_s=0.25)
  assert parts == [(ps.STAGE_COMPUTE, 1.0, 1.5), (ps.TRANSFER, 1.5, 1.75),
                   (ps.BUBBLE, 1.75, 2.0)]
  # Parts longer than the span are cut to it: phases never exceed a step.
  short = ps.split_compute_span(0.0, 1.0, stage_compute_s=2.0, transfer_s=1.0)
  assert [(p, b - a) for p, a, b in short] == [
      (ps.STAGE_COMPUTE, 1.0), (ps.TRANSFER, 0.0), (ps.BUBBLE, 0.0)]


def test_section_has_the_shared_keys():
  stats = ps.StageStats(num_stages=2)
  stats.add(0, ps.STAGE_COMPUTE, 0.01)
  stats.end_step()
  section = ps.pipeline_section(
      schedule="gpipe", stages=2, micro_batches=4, virtual_stages=1,
      replicas=1, split="even", cut_layers=["a"], stats=stats,
      stage_layers=[["a"], ["b"]], stage_devices=["/cpu:0", "/cpu:1"],
      predicted_ms=[1.0, 2.0], predicted_memory_mb=None,
      sources={ps.BUBBLE: "derived"})
  assert set(section) >= {
      "schedule", "stages", "micro_batches", "virtual_stages", "replicas",
      "split", "cut_layers", "bubble_fraction_theory", "bubble_fraction",
      "per_stage"}
  assert section["bubble_fraction_theory"] == pytest.approx(1 / 5)
  assert set(section["per_stage"][0]) == {
      "stage", "layers", "device", "predicted_ms", "predicted_memory_mb",
      "compute_ms", "bubble_ms", "transfer_ms"}
  assert section["per_stage"][1]["predicted_ms"] == 2.0
  assert section["per_stage"][0]["predicted_memory_mb"] is None
  assert section["per_stage"][0]["compute_ms"] == pytest.approx(10.0)
