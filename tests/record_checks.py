"""Checks of a trainer's run.json that both frameworks' tests share."""

import pytest

from overlap_core.runtime import trace


def offload_copy_spans_us(record: dict) -> list:
  """The run's offload_copy phase, after checking that the phases still
  partition each step: its trace spans, one per step, in microseconds."""
  assert "offload_copy" in record["phases_measured"]
  phases = record["phases"]
  assert phases["offload_copy"]["mean"] >= 0
  assert sum(phases[p]["mean"] for p in phases if p != "step") == (
      pytest.approx(phases["step"]["mean"]))
  events = trace.load_trace(record["outputs"]["trace"])["traceEvents"]
  spans_us = [e["dur"] for e in events if e.get("name") == "offload_copy"]
  assert len(spans_us) == record["steps"]
  return spans_us


def copied_ms(offload_section: dict) -> float:
  """The timed copies of both directions, in ms."""
  return sum(offload_section[d]["copy_ms"]["total"]
             for d in ("to_host", "to_device"))


def assert_background_beside_foreground(bg: dict) -> None:
  """run.json's `background` section of a 24-step run of 16-sample steps:
  the job ran and finished, and the foreground's steps are split around
  its start."""
  assert bg["finished"] is True
  assert bg["steps"] >= 1 and bg["samples_per_second"] > 0
  fg = bg["foreground"]
  # Warm-up 2, the job starts after step 12, step 13 left out.
  assert (fg["started_after_step"], fg["steps_before"], fg["steps_with"]) == (
      12, 10, 11)
  assert fg["slowdown_frac"] is not None
  # The foreground's own throughput over the steps the job overlapped.
  assert fg["samples_per_second_with"] == pytest.approx(
      16 / fg["step_s_with"])
