"""The background job: a real process in the idle class, and its numbers."""

import os

import pytest

from overlap_core.runtime import background

from tests.helpers import wait_until


def _wait_for_steps(path, steps):
  def done():
    stats = background.read_stats(path)
    return bool(stats) and stats["steps"] >= steps
  wait_until(done, f"{steps} steps in {path}")


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")
def test_the_job_runs_in_the_idle_class_and_reports_throughput(tmp_path):
  stats_path = str(tmp_path / "bg.json")
  runner = background.BackgroundRunner("small_mlp", stats_path,
                                       start_after_step=2, warmup_steps=0,
                                       global_batch_size=16)
  try:
    runner.on_step_end(1, 0.010)
    assert runner.pid is None  # not before its step
    runner.on_step_end(2, 0.010)
    assert runner.pid is not None
    # Asked of the kernel from outside the job, while it trains.
    assert os.sched_getscheduler(runner.pid) == os.SCHED_IDLE
    _wait_for_steps(stats_path, 20)
    for step in range(3, 7):
      runner.on_step_end(step, 0.020)
  finally:
    runner.stop()
  stats = runner.stats()
  assert stats["policy"] == "SCHED_IDLE"
  assert stats["policy_seen_by_foreground"] == "SCHED_IDLE"
  assert stats["finished"] is True  # it ended on SIGTERM and said so
  assert stats["steps"] >= 20 and stats["samples_per_second"] > 0
  fg = stats["foreground"]
  # Steps 1-2 before; step 3 holds the start-up wait and is left out.
  assert (fg["steps_before"], fg["steps_with"]) == (2, 3)
  assert fg["slowdown_frac"] == pytest.approx(1.0)  # 20 ms over 10 ms
  # 16 samples a step, over the same steps: 10 ms before, 20 ms with.
  assert fg["samples_per_second_before"] == pytest.approx(1600.0)
  assert fg["samples_per_second_with"] == pytest.approx(800.0)


def test_a_run_too_short_to_split_gets_no_runner(tmp_path):
  assert background.make_runner("small_mlp", str(tmp_path), first_step=1,
                                last_step=3, global_batch_size=8) is None
  runner = background.make_runner("small_mlp", str(tmp_path), first_step=1,
                                  last_step=40, global_batch_size=8)
  assert runner is not None and runner.pid is None


def test_steps_split_halfway_after_the_warmup():
  # 40 steps: 4 warm-up (a tenth), the job after step 20; a resumed run
  # splits what is left of it the same way.
  assert background.split_steps(first_step=1, last_step=40) == (20, 4)
  assert background.split_steps(first_step=21, last_step=40) == (30, 22)
  assert background.split_steps(first_step=38, last_step=40) is None


def test_a_runner_needs_a_positive_batch(tmp_path):
  with pytest.raises(ValueError, match="global_batch_size.*Received: 0"):
    background.BackgroundRunner("small_mlp", str(tmp_path / "bg.json"),
                                start_after_step=2, global_batch_size=0)
