"""The pipeline measurement schema: phases that tile a step, per-stage
medians, the theoretical and measured bubble."""

import pytest

from overlap_core.runtime import pipeline_stats as ps
from overlap_core.runtime.ledger import DATA_WAIT, StepLedger, summarize_window


def test_theory_is_gpipes_fill_and_drain():
  assert ps.bubble_fraction_theory("gpipe", 2, 2) == pytest.approx(1 / 3)
  assert ps.bubble_fraction_theory("1f1b", 4, 8) == pytest.approx(3 / 11)
  # Interleaving V = 2 stages per rank halves the fill and drain.
  assert ps.bubble_fraction_theory("interleaved_1f1b", 2, 4, 2) == (
      pytest.approx(1 / 9))
  assert ps.bubble_fraction_theory("zero_bubble", 2, 4, 2) is None
  assert ps.bubble_fraction_theory("gpipe", 1, 8) == 0.0
  with pytest.raises(ValueError, match="stages"):
    ps.bubble_fraction_theory("gpipe", 0, 4)


def test_spans_tile_the_step_with_compute_in_the_gaps():
  spans = ps.partition_span(10.0, 20.0, [
      (ps.TRANSFER, 12.0, 13.0), (ps.BUBBLE, 15.0, 17.0),
      (ps.BUBBLE, 9.0, 10.5),   # began before the step: clipped
      (ps.TRANSFER, 16.5, 18.0)])  # overlaps the bubble: starts at its end
  assert spans == [(ps.BUBBLE, 10.0, 10.5), (ps.STAGE_COMPUTE, 10.5, 12.0),
                   (ps.TRANSFER, 12.0, 13.0), (ps.STAGE_COMPUTE, 13.0, 15.0),
                   (ps.BUBBLE, 15.0, 17.0), (ps.TRANSFER, 17.0, 18.0),
                   (ps.STAGE_COMPUTE, 18.0, 20.0)]
  for (_, _, end), (_, begin, _) in zip(spans, spans[1:]):
    assert end == begin
  assert ps.partition_span(0.0, 1.0, []) == [(ps.STAGE_COMPUTE, 0.0, 1.0)]


def test_recorder_totals_and_medians_per_step():
  recorder = ps.StageRecorder()
  for step, bubble_s in enumerate((0.5, 0.1, 0.2, 0.3)):
    start = 10.0 * step
    recorder.record(ps.BUBBLE, start + 1.0, start + 1.0 + bubble_s)
    recorder.record(ps.TRANSFER, start + 3.0, start + 3.25)
    spans = recorder.end_step(start, start + 4.0)
    assert sum(end - begin for _, begin, end in spans) == pytest.approx(4.0)
  assert recorder.steps[0] == pytest.approx(
      {ps.STAGE_COMPUTE: 3.25, ps.BUBBLE: 0.5, ps.TRANSFER: 0.25})
  medians = recorder.medians_ms(warmup_steps=1)  # steps 1..3: .1 .2 .3
  # No step timed its update, loss or all-reduce: None, not zero.
  for key in ("update_ms", "loss_ms", "posting_ms", "exposed_comm_ms"):
    assert medians.pop(key) is None
  assert medians == pytest.approx(
      {"compute_ms": 3550.0, "bubble_ms": 200.0, "transfer_ms": 250.0})
  assert ps.StageRecorder().medians_ms()["bubble_ms"] is None
  with pytest.raises(ValueError, match="stage_compute"):
    recorder.record(ps.STAGE_COMPUTE, 0.0, 1.0)


def test_the_update_is_kept_apart_inside_stage_compute():
  recorder = ps.StageRecorder()
  for step, update_s in enumerate((0.4, 0.5, 0.6)):
    start = 10.0 * step
    recorder.record(ps.BUBBLE, start + 1.0, start + 2.0)
    recorder.record_update(start + 3.0, start + 3.0 + update_s)
    spans = recorder.end_step(start, start + 4.0)
    # The update is no span of its own: the ledger's phases still tile
    # the step, with the update inside stage_compute.
    assert {phase for phase, _, _ in spans} == {ps.STAGE_COMPUTE, ps.BUBBLE}
  assert recorder.steps[0] == pytest.approx(
      {ps.STAGE_COMPUTE: 3.0, ps.BUBBLE: 1.0, ps.TRANSFER: 0.0,
       ps.UPDATE: 0.4})
  medians = recorder.medians_ms()
  assert medians["update_ms"] == pytest.approx(500.0)
  assert medians["compute_ms"] == pytest.approx(3000.0)


def test_section_sums_the_bubble_over_stages():
  rows = [ps.stage_entry(1, layers=["fc"], device="cpu",
                         medians_ms={"compute_ms": 6.0, "bubble_ms": 3.0,
                                     "transfer_ms": 1.0}),
          ps.stage_entry(0, layers=["conv", "relu"], device="cpu",
                         medians_ms={"compute_ms": 8.0, "bubble_ms": 1.0,
                                     "transfer_ms": 1.0},
                         predicted_ms=7.5, predicted_memory_mb=1.25)]
  section = ps.pipeline_section(schedule="gpipe", stages=2, micro_batches=2,
                                split="even", cut_layers=["relu"],
                                per_stage=rows)
  assert section["bubble_fraction"] == pytest.approx(4.0 / 20.0)
  assert section["bubble_fraction_theory"] == pytest.approx(1 / 3)
  assert [row["stage"] for row in section["per_stage"]] == [0, 1]
  assert section["per_stage"][0]["predicted_ms"] == 7.5
  assert section["per_stage"][1]["predicted_ms"] is None
  assert set(section["per_stage"][0]) == {
      "stage", "layers", "device", "predicted_ms", "predicted_update_ms",
      "predicted_memory_mb", "compute_ms", "update_ms", "bubble_ms",
      "transfer_ms", "posting_ms", "loss_ms", "exposed_comm_ms",
      "saved_activation_peak_bytes"}
  unmeasured = ps.stage_entry(0, layers=[], device="cpu", medians_ms={})
  assert ps.measured_bubble_fraction([unmeasured]) is None


def test_progress_shares_count_a_pipelined_steps_phases_as_compute():
  clock = [0.0]
  ledger = StepLedger(clock=lambda: clock[0])
  with ledger.phase(DATA_WAIT):
    clock[0] = 1.0
  for phase, begin, end in ps.partition_span(1.0, 4.0, [
      (ps.BUBBLE, 2.0, 2.5), (ps.TRANSFER, 3.0, 3.5)]):
    ledger.add(phase, begin, end)
  clock[0] = 4.0
  ledger.end_step(1, num_samples=8)
  shares = summarize_window(ledger.steps)
  assert shares["compute_fraction"] == pytest.approx(0.75)
  assert shares["data_wait_fraction"] == pytest.approx(0.25)
