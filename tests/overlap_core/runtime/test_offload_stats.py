"""The offload copy statistics: counts, bytes and per-copy times, and the
ledger phase the copies in series with compute become."""

import pytest

from overlap_core.runtime.ledger import (COMPUTE, DATA_WAIT, OFFLOAD,
                                         StepLedger, carve_compute,
                                         summarize_window)
from overlap_core.runtime.offload_stats import (TO_DEVICE, TO_HOST,
                                                CopyStats)


def test_counts_bytes_and_times_per_direction():
  stats = CopyStats()
  for duration_s in (0.001, 0.003, 0.002):
    stats.add(TO_HOST, num_bytes=100, duration_s=duration_s)
  stats.add(TO_DEVICE, num_bytes=300)  # timed later, as CUDA events are
  stats.add_duration(TO_DEVICE, 0.004)
  stats.count_prefetched(2)
  summary = stats.summary(num_steps=2)
  assert summary[TO_HOST]["tensors"] == 3
  assert summary[TO_HOST]["bytes"] == 300
  assert summary[TO_HOST]["tensors_per_step"] == 1.5
  assert summary[TO_HOST]["copy_ms"] == pytest.approx(
      {"mean": 2.0, "max": 3.0, "min": 1.0, "median": 2.0, "total": 6.0})
  assert summary[TO_DEVICE]["copy_ms"]["median"] == pytest.approx(4.0)
  assert summary["prefetched_tensors"] == 2


def test_untimed_copies_have_no_times_and_reset_forgets():
  stats = CopyStats()
  stats.add(TO_DEVICE, num_bytes=8)
  assert stats.summary(num_steps=1)[TO_DEVICE]["copy_ms"] is None
  stats.reset()
  assert stats.summary(num_steps=1)[TO_DEVICE]["tensors"] == 0


def test_unknown_direction_is_refused():
  with pytest.raises(ValueError, match="direction='sideways'"):
    CopyStats().add("sideways", num_bytes=1)


def test_copies_are_carved_out_of_compute_and_capped_at_its_span():
  assert carve_compute(1.0, 4.0, OFFLOAD, 0.5) == [
      (OFFLOAD, 1.0, 1.5), (COMPUTE, 1.5, 4.0)]
  # More copy time than the span (clocks read apart): all of it, no more.
  assert carve_compute(1.0, 4.0, OFFLOAD, 7.0) == [
      (OFFLOAD, 1.0, 4.0), (COMPUTE, 4.0, 4.0)]
  # No copies in series: the phase is still there, at zero.
  assert carve_compute(1.0, 4.0, OFFLOAD, 0.0)[0] == (
      OFFLOAD, 1.0, 1.0)


def test_the_ledger_records_copies_as_a_phase_and_shares_them_as_compute():
  clock = [0.0]
  ledger = StepLedger(clock=lambda: clock[0])
  with ledger.phase(DATA_WAIT):
    clock[0] = 1.0
  for phase, begin, end in carve_compute(1.0, 4.0, OFFLOAD, 0.75):
    ledger.add(phase, begin, end)
  clock[0] = 4.0
  ledger.end_step(1, num_samples=8)
  phases = ledger.summary(warmup_steps=0)["phases"]
  assert phases[OFFLOAD]["mean"] == pytest.approx(0.75)
  assert phases[COMPUTE]["mean"] == pytest.approx(2.25)
  assert phases["other"]["mean"] == pytest.approx(0.0)
  # Progress lines and TensorBoard show compute whole, as without offload.
  assert summarize_window(ledger.steps)["compute_fraction"] == (
      pytest.approx(0.75))
