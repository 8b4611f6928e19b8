"""--background_job in the PyTorch trainer: both sides' numbers in run.json."""

import json
import os

import pytest

from tests.helpers import run_module
from tests.record_checks import assert_background_beside_foreground


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
  assert_background_beside_foreground(bg)
