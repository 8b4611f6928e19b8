"""--background_job in the TensorFlow trainer: both sides' numbers in
run.json, and its refusal on GPU hosts."""

import os

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime.config import ConfigError
from tfoverlap import trainer

from tests.record_checks import check_background_job_beside_trainer

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
  check_background_job_beside_trainer("tfoverlap.train", tmp_path / "run")
