"""--background_job in the PyTorch trainer: both sides' numbers in run.json."""

import json
import os

import pytest

from tests.helpers import run_module


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")
def test_background_job_beside_the_trainer(tmp_path):
  model_dir = tmp_path / "run"
  result = run_module(
      "torch_parity.train", "--strategy=default", "--model=small_cnn",
      "--background_job=small_mlp", "--train_steps=24", "--batch_size=16",
      "--evaluate=false", "--progress=false", "--intra_op_threads=1",
      f"--model_dir={model_dir}", timeout=600)
  assert result.returncode == 0, result.stderr
  assert "background job small_mlp started" in result.stdout
  with open(model_dir / "run.json", encoding="utf-8") as f:
    bg = json.load(f)["background"]
  assert bg["policy_seen_by_foreground"] == "SCHED_IDLE"
  assert bg["finished"] is True
  assert bg["steps"] >= 1 and bg["samples_per_second"] > 0
  fg = bg["foreground"]
  # 24 steps: warm-up 2, the job starts after step 12, step 13 left out.
  assert (fg["started_after_step"], fg["steps_before"], fg["steps_with"]) == (
      12, 10, 11)
  assert fg["slowdown_frac"] is not None
  # The foreground's own throughput over the steps the job overlapped:
  # 16 samples a step.
  assert fg["samples_per_second_with"] == pytest.approx(
      16 / fg["step_s_with"])
