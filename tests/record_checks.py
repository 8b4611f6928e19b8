"""Checks of a trainer's run.json that both frameworks' tests share."""

import json
import statistics

import pytest

from overlap_core.runtime import offload_cost, run_record
from overlap_core.runtime import trace

from tests.helpers import run_module


def run_small_cnn(module: str, model_dir, *args):
  """Trains small_cnn 4 deterministic steps; returns (result, run.json).

  Runs that differ only in `args` (an offload, say) must train the same
  weights, so both sides compare records of this one run.
  """
  result = run_module(module, f"--model_dir={model_dir}",
                      "--model=small_cnn", "--strategy=default",
                      "--batch_size=16", "--train_steps=4", "--seed=3",
                      "--deterministic", *args, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return result, run_record.load_run_record(str(model_dir))


def offload_copy_spans_us(record: dict) -> list:
  """The run's offload phase where it is the copies timed in series, after
  checking that the phases still partition each step: its trace spans,
  one per step, in microseconds."""
  assert record["offload"]["phase_from"] == offload_cost.COPIES_TIMED
  assert "offload" in record["phases_measured"]
  phases = record["phases"]
  assert phases["offload"]["mean"] >= 0
  assert sum(phases[p]["mean"] for p in phases if p != "step") == (
      pytest.approx(phases["step"]["mean"]))
  events = trace.load_trace(record["outputs"]["trace"])["traceEvents"]
  spans_us = [e["dur"] for e in events if e.get("name") == "offload"]
  assert len(spans_us) == record["steps"]
  return spans_us


def derived_offload_spans_us(record: dict) -> list:
  """The run's offload phase where it is derived from the step timed alone
  with and without offload (`overlap_core.runtime.offload_cost`), after
  checking that it is recorded as derived and partitions each step: its
  trace spans, one per step, in microseconds."""
  assert record["offload"]["phase_from"] == offload_cost.DERIVED
  assert "offload" in record["phases_derived"]
  assert "offload" not in record["phases_measured"]
  timings = record["strategy"]["reference_step"]
  with_ms = timings["with_offload"]["step_ms"]
  without_ms = timings["without_offload"]["step_ms"]
  assert (len(with_ms) == len(without_ms)
          == record["flags"]["run"]["reference_steps"])
  assert timings["offload_ms"] == pytest.approx(
      max(statistics.median(with_ms) - statistics.median(without_ms), 0.0))
  phases = record["phases"]
  assert sum(phases[p]["mean"] for p in phases if p != "step") == (
      pytest.approx(phases["step"]["mean"]))
  events = trace.load_trace(record["outputs"]["trace"])["traceEvents"]
  spans_us = [e["dur"] for e in events if e.get("name") == "offload"]
  assert len(spans_us) == record["steps"]
  # Each step's is the derived cost, or less where capped at its compute
  # span; the trace rounds each span to a nanosecond.
  assert max(spans_us) <= 1e3 * timings["offload_ms"] + 1e-3
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


def check_background_job_beside_trainer(module: str, model_dir) -> None:
  """Runs `python -m module` (a trainer) with --background_job=small_mlp
  and checks both jobs' numbers in its run.json."""
  result = run_module(
      module, "--strategy=default", "--model=small_cnn",
      "--background_job=small_mlp", "--train_steps=24", "--batch_size=16",
      "--evaluate=false", "--progress=false", "--intra_op_threads=1",
      f"--model_dir={model_dir}", timeout=600)
  assert result.returncode == 0, result.stderr
  assert "background job small_mlp started" in result.stdout
  with open(model_dir / "run.json", encoding="utf-8") as f:
    bg = json.load(f)["background"]
  assert bg["policy_seen_by_foreground"] == "SCHED_IDLE"
  assert_background_beside_foreground(bg)
