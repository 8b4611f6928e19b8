"""--background_job in the TensorFlow trainer: both sides' numbers in
run.json, and its refusal on GPU hosts."""

import json
import os

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime.config import ConfigError
from tfoverlap import trainer

from tests.helpers import run_module
from tests.record_checks import assert_background_beside_foreground

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()


def test_a_gpu_host_is_refused_with_the_reason():
  with flagsaver.as_parsed(background_job="small_mlp"):
    config = tfo_flags.to_config()
  trainer.check_supported(config, num_gpus=0)  # the idle-class process
  with pytest.raises(ConfigError) as raised:
    trainer.check_supported(config, num_gpus=1)
  message = str(raised.value)
  assert message.startswith("--background_job=small_mlp: ")
  assert "no CUDA stream priority" in message and "\n" not in message


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")
def test_background_job_beside_the_tf_trainer(tmp_path):
  model_dir = tmp_path / "run"
  result = run_module(
      "tfoverlap.train", "--strategy=default", "--model=small_cnn",
      "--background_job=small_mlp", "--train_steps=24", "--batch_size=16",
      "--evaluate=false", "--progress=false", "--intra_op_threads=1",
      f"--model_dir={model_dir}", timeout=600)
  assert result.returncode == 0, result.stderr
  assert "background job small_mlp started" in result.stdout
  with open(model_dir / "run.json", encoding="utf-8") as f:
    bg = json.load(f)["background"]
  assert bg["policy_seen_by_foreground"] == "SCHED_IDLE"
  assert_background_beside_foreground(bg)
