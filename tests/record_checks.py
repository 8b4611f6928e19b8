"""Checks of a trainer's run.json that both frameworks' tests share."""

import json
import statistics

import pytest

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import offload_cost, paired_removal, run_record
from overlap_core.runtime import trace
from overlap_core.runtime.paired_removal import WITH, WITHOUT, PairedRemoval

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


def trace_phase_us_by_step(record: dict, phase: str) -> dict:
  """{step: microseconds} of `phase` in the run's trace, its spans summed
  per step.

  A step can hold more than one span of a phase: where the loop's end
  settles contention back to compute (`ContentionSplit.settle`), the
  settled part is a compute span of its own before the rest.
  """
  events = trace.load_trace(record["outputs"]["trace"])["traceEvents"]
  by_step = {}
  for event in events:
    if event.get("name") == phase:
      step = event["args"]["step"]
      by_step[step] = by_step.get(step, 0.0) + event["dur"]
  return by_step


def check_trace_median_is_the_records(record: dict, phase: str) -> None:
  """The trace's per-step median of `phase` over the measured steps is the
  record's p50: both come from one ledger. Every step holds the phase."""
  by_step = trace_phase_us_by_step(record, phase)
  assert sorted(by_step) == list(range(1, record["steps"] + 1))
  median_us = statistics.median(
      us for step, us in by_step.items() if step > record["warmup_steps"])
  # The trace rounds each span to a nanosecond; 1e-3 relative is far above.
  assert record["phases"][phase]["p50"] * 1e6 == pytest.approx(median_us,
                                                               rel=1e-3)


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
          == offload_cost.TIMED_ONCE_CALLS
          * record["flags"]["run"]["reference_steps"])
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


# The paired removal tests' job, the same in both trainers: a tiny MLP,
# nothing written but run.json.
PAIRED_JOB = ["--progress=false", "--evaluate=false", "--trace=false",
              "--tensorboard=false", "--model=mlp", "--image_size=8",
              "--batch_size=8", "--strategy=default", "--dataset=synthetic"]
# 3 ms of real CPU work per sample, in series with the step (no prefetch,
# one call at a time): a step with input waits about 24 ms for its batch.
SLOW_INPUT = ["--prefetch=0", "--map_parallelism=1",
              "--preprocess_cost_ms=3"]


def train_paired_job(module: str, model_dir, *args) -> dict:
  """Runs `PAIRED_JOB` with `args` in the trainer `module`; its run.json."""
  result = run_module(module, *PAIRED_JOB, *args,
                      f"--model_dir={model_dir}", timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  return run_record.load_run_record(str(model_dir))


def paired_phase_ms(record: dict, phase: str) -> dict:
  """A phase's mean per counted step in each half of a paired removal."""
  return {arm: half["phases_ms"].get(phase, 0.0)
          for arm, half in record["paired_removal"]["halves"].items()}


def check_paired_input(record: dict, *, steps: int, block_steps: int):
  """A run that removed its slow input (about 24 ms a batch) in alternate
  blocks: each half counted the steps its blocks hold, the half without
  took a resident batch of its own each step and waited for next to none
  of it, and the saving is the halves' step means apart."""
  halves = record["paired_removal"]["halves"]
  pairing = PairedRemoval(paired_removal.INPUT, block_steps)
  assert {arm: h["steps"] for arm, h in halves.items()} == (
      pairing.counted_steps(steps, ledger_lib.default_warmup_steps(steps)))
  # A batch of its own for every step without input, read ahead.
  assert record["paired_removal"]["resident_batches"] == (
      pairing.steps_by_arm(1, steps)[WITHOUT])
  wait_ms = paired_phase_ms(record, ledger_lib.DATA_WAIT)
  # A step without input is handed a batch it holds (microseconds of
  # Python); one with input waits for 24 ms of preprocessing, more on a
  # loaded host. Only preemption could bring the first near the second
  # over 3 counted steps each: a quarter leaves it 6 ms a step.
  assert wait_ms[WITHOUT] < wait_ms[WITH] / 4, wait_ms
  # The saving is the difference of the halves' step means, whatever the
  # host did to them (their values are timings, not asserted here).
  step_ms = paired_phase_ms(record, "step")
  assert record["paired_removal"]["saving_ms"] == pytest.approx(
      step_ms[WITH] - step_ms[WITHOUT])


def check_paired_all_reduce(record: dict) -> dict:
  """A run that removed its gradient all-reduce in alternate blocks: the
  steps without it carry no exposed_comm, those with it some (each DDP
  step waits for its last bucket; TensorFlow's carry the derived cost,
  which a model whose all-reduce costs more than the timing's noise
  keeps above zero). Returns the record."""
  comm_ms = paired_phase_ms(record, ledger_lib.EXPOSED_COMM)
  assert comm_ms[WITHOUT] == 0.0 < comm_ms[WITH], comm_ms
  assert record["paired_removal"]["cause"] == paired_removal.ALL_REDUCE
  return record


def check_paired_offload(record: dict):
  """A run that paused offload in alternate blocks: a step with offload
  carries the derived cost, capped at its compute span (a step faster
  than the cost, on a loaded host, carries less); one without, none."""
  offload_ms = paired_phase_ms(record, ledger_lib.OFFLOAD)
  derived_ms = record["strategy"]["reference_step"]["offload_ms"]
  assert offload_ms[WITHOUT] == 0.0
  # A step's span is (start + cost) - start on perf_counter, which counts
  # from boot: one rounding of a clock reading is up to half its ulp,
  # 1.8e-12 s after 4 hours, 2.4e-10 s after a year, so a mean of such
  # spans exceeds the cost by at most about 5e-10 s. A relative slack
  # (1e-9 of a cost near 1 ms, 1e-12 s) failed once on a host up 4 hours.
  assert offload_ms[WITH] <= derived_ms + 1e-6
  assert (offload_ms[WITH] > 0.0) == (derived_ms > 0.0)
