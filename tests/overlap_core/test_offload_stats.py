"""The offload copy statistics: counts, bytes and per-copy times."""

import pytest

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
