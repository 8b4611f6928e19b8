"""A stage's idle time in parts: the closed forms against hand-worked steps."""

import pytest

from overlap_core.runtime import bubble_parts as bp
from overlap_core.runtime import pipeline_stats as ps


def _row(stage, *, compute, bubble, transfer=0.0, update=0.0, loss=None):
  return ps.stage_entry(stage, layers=[], device="cpu", medians_ms={
      "compute_ms": compute, "bubble_ms": bubble, "transfer_ms": transfer,
      "update_ms": update, "loss_ms": loss})


def test_balanced_stages_idle_the_theory_and_nothing_else():
  # S = 2, M = 4, w = 10 ms per micro-batch: step (M + S - 1) w = 50,
  # each stage idles (S - 1) w = 10, theory's 1/5 of the step.
  rows = [_row(0, compute=40.0, bubble=10.0), _row(1, compute=40.0,
                                                   bubble=10.0)]
  parts = bp.split_idle(rows, schedule="gpipe", micro_batches=4)
  for part in parts:
    assert part["fill_drain_ms"] == pytest.approx(10.0)
    assert part["imbalance_ms"] == part["loss_and_update_ms"] == 0.0
    assert part["residual_ms"] == pytest.approx(0.0)
  summary = bp.summarize(parts)
  assert summary["fill_drain_fraction"] == pytest.approx(
      ps.bubble_fraction_theory("gpipe", 2, 4))
  assert summary["explained"]


def test_a_fast_stage_waits_on_the_slow_one_every_micro_batch():
  # w0 = 30, w1 = 5 (loss 1 of it), M = 4, updates 2 and 6 ms. Step of the
  # max-plus recurrence: w0 + w1 + 3 w0 = 125, then the longer update.
  rows = [_row(0, compute=122.0, bubble=7.0 + 1.0, transfer=2.0, update=2.0),
          _row(1, compute=26.0, bubble=100.0, transfer=5.0, update=6.0,
               loss=4.0)]
  fast = bp.split_idle(rows, schedule="1f1b", micro_batches=4)[1]
  assert fast["fill_drain_ms"] == pytest.approx(30.0)
  assert fast["imbalance_ms"] == pytest.approx(3 * (30.0 - 5.0))
  assert fast["loss_and_update_ms"] == pytest.approx(0.0)
  assert fast["transfer_ms"] == 5.0
  assert fast["residual_ms"] == pytest.approx(105.0 - 110.0)
  slow = bp.split_idle(rows, schedule="1f1b", micro_batches=4)[0]
  # It waits one micro-batch's trip through stage 1 (its loss apart) and
  # for stage 1's longer update.
  assert slow["fill_drain_ms"] == pytest.approx(4.0)
  assert slow["loss_and_update_ms"] == pytest.approx(1.0 + 4.0)
  assert slow["imbalance_ms"] == 0.0
  assert slow["residual_ms"] == pytest.approx(10.0 - 4.0 - 5.0 - 2.0)


def test_a_slow_last_stage_makes_its_loss_a_cause_every_micro_batch():
  # w0 = 4, w1 = 4 + loss 2: stage 0 waits 3 x 2 ms in steady state, all
  # of it the loss, none imbalance.
  rows = [_row(0, compute=16.0, bubble=12.0), _row(1, compute=24.0,
                                                   bubble=4.0, loss=8.0)]
  first, last = bp.split_idle(rows, schedule="gpipe", micro_batches=4)
  assert first["imbalance_ms"] == 0.0
  assert first["loss_and_update_ms"] == pytest.approx(2.0 + 3 * 2.0)
  assert first["fill_drain_ms"] == pytest.approx(4.0)
  assert first["residual_ms"] == pytest.approx(0.0)
  assert last["fill_drain_ms"] == pytest.approx(4.0)
  assert last["imbalance_ms"] == last["loss_and_update_ms"] == 0.0


def test_a_neighbours_posting_is_on_the_path_its_own_is_transfer():
  # M = 4. Stage 0 computes 8 ms and posts 2 ms per micro-batch: its pace
  # is 10 ms. Stage 1 computes 2 ms. Stage 1 waits one trip (10) and
  # 3 x (10 - 2) in steady state; stage 0's posting is its own transfer.
  rows = [_row(0, compute=32.0, bubble=2.0, transfer=8.0),
          _row(1, compute=8.0, bubble=34.0)]
  rows[0]["posting_ms"] = 8.0
  slow, fast = bp.split_idle(rows, schedule="gpipe", micro_batches=4)
  assert fast["fill_drain_ms"] == pytest.approx(10.0)
  assert fast["imbalance_ms"] == pytest.approx(24.0)
  assert fast["residual_ms"] == pytest.approx(0.0)
  assert slow["transfer_ms"] == 8.0
  assert slow["fill_drain_ms"] == pytest.approx(2.0)
  assert slow["residual_ms"] == pytest.approx(0.0)


def test_interleaving_shrinks_fill_and_drain_and_unknowns_give_none():
  rows = [_row(0, compute=40.0, bubble=5.0), _row(1, compute=40.0,
                                                  bubble=5.0)]
  parts = bp.split_idle(rows, schedule="interleaved_1f1b", micro_batches=4,
                        virtual_stages=2)
  assert parts[0]["fill_drain_ms"] == pytest.approx(5.0)
  assert bp.split_idle(rows, schedule="zero_bubble", micro_batches=4) is None
  unmeasured = [ps.stage_entry(0, layers=[], device="cpu", medians_ms={})]
  assert bp.split_idle(unmeasured, schedule="gpipe", micro_batches=4) is None
  assert bp.summarize(None) is None
  section = ps.pipeline_section(schedule="gpipe", stages=2, micro_batches=4,
                                per_stage=rows)
  assert section["bubble_parts"]["per_stage"][1]["fill_drain_ms"] == (
      pytest.approx(10.0))
  # A residual over the tolerance says the parts do not explain the run.
  assert not bp.summarize(bp.split_idle(
      [_row(0, compute=10.0, bubble=40.0), _row(1, compute=10.0,
                                                bubble=1.0)],
      schedule="gpipe", micro_batches=4))["explained"]
