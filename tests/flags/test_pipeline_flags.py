"""--pipeline_*: a validated PipelineConfig, or one line and exit 2."""

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime.config import ConfigError, PipelineConfig

from tests.helpers import run_module
from tests.refusals import trainer_refusal, usage_error_line

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()

# Defaults: batch 64 over --strategy=mirrored x 2 devices: 32 per replica
# unpipelined; with 2 stages the 2 devices are one pipeline, which splits
# the whole batch.


def test_defaults_are_not_pipelined():
  with flagsaver.as_parsed():
    assert tfo_flags.to_config().pipeline == PipelineConfig()


def test_a_valid_pipeline_becomes_a_frozen_config():
  with flagsaver.as_parsed(pipeline_stages="2", pipeline_microbatches="4",
                           pipeline_schedule="1f1b",
                           pipeline_split="layer1.1.relu_4"):
    cfg = tfo_flags.to_config().pipeline
  assert cfg == PipelineConfig(stages=2, microbatches=4, schedule="1f1b",
                               split="explicit",
                               cut_layers=("layer1.1.relu_4",))


@pytest.mark.parametrize("parsed, microbatch_size", [
    # A TensorFlow pipeline: its 2 stages are the 2 devices, one replica
    # that splits the whole batch of 8 into 8 micro-batches of 1.
    (dict(batch_size="8", num_devices="2", pipeline_stages="2",
          pipeline_microbatches="8"), 1),
    # A PyTorch world of 4 ranks in 2 stages: 2 replicas of 4 samples.
    (dict(batch_size="8", num_devices="4", pipeline_stages="2",
          pipeline_microbatches="4"), 1),
    (dict(batch_size="6", num_devices="2", pipeline_stages="2",
          pipeline_microbatches="3"), 2),
])
def test_micro_batches_divide_each_pipelines_batch(parsed, microbatch_size):
  with flagsaver.as_parsed(**parsed):
    config = tfo_flags.to_config()
  pipelines = config.distribute.num_devices // config.pipeline.stages
  assert (config.data.batch_size // pipelines //
          config.pipeline.microbatches) == microbatch_size


@pytest.mark.parametrize("parsed, message", [
    (dict(pipeline_stages="2", pipeline_microbatches="5"),
     "--pipeline_microbatches=5: must divide each pipeline's batch of 64"),
    # 4 ranks in 2 stages are 2 replicas of 4 samples each.
    (dict(pipeline_stages="2", pipeline_microbatches="8", batch_size="8",
          num_devices="4"),
     "--pipeline_microbatches=8: must divide each pipeline's batch of 4"),
    (dict(pipeline_stages="2", pipeline_microbatches="1", batch_size="5",
          num_devices="4"),
     "--batch_size=5: must divide evenly over 2 replicas"),
    (dict(pipeline_stages="4", pipeline_microbatches="2",
          pipeline_schedule="1f1b"),
     "--pipeline_schedule=1f1b needs at least as many micro-batches as "
     "stages (4)"),
    (dict(pipeline_stages="2", pipeline_microbatches="4",
          pipeline_schedule="interleaved_1f1b"),
     "--pipeline_virtual_stages=1: --pipeline_schedule=interleaved_1f1b "
     "runs 2 or more stages per rank"),
    (dict(pipeline_stages="4", pipeline_microbatches="8",
          pipeline_virtual_stages="2"),
     "--pipeline_virtual_stages=2: applies only to"),
    (dict(pipeline_stages="4", pipeline_microbatches="16",
          pipeline_schedule="zero_bubble", pipeline_virtual_stages="2",
          pipeline_split="a,b"),
     "--pipeline_split=a,b: 8 stages need 7 comma-separated cut layers"),
    (dict(pipeline_microbatches="4"),
     "--pipeline_microbatches=4: applies only with --pipeline_stages of 2"),
    (dict(pipeline_overlap_all_reduce="false"),
     "--pipeline_overlap_all_reduce=False: applies only with "
     "--pipeline_stages of 2"),
    (dict(pipeline_stages_apart="true"),
     "--pipeline_stages_apart=True: applies only with --pipeline_stages of 2"),
    (dict(pipeline_stages="2", pipeline_microbatches="4",
          plan_profile="no/such/profile.json"),
     "--plan_profile=no/such/profile.json: no such file"),
])
def test_bad_combinations_are_refused(parsed, message):
  with flagsaver.as_parsed(**parsed):
    with pytest.raises(ConfigError) as raised:
      tfo_flags.to_config()
  assert message in str(raised.value)


# What each trainer refuses before it trains, beyond the flags' own checks.
TRAINER_REFUSALS = [
    ("tfoverlap.train", ["--pipeline_stages=3", "--pipeline_microbatches=5"],
     "--pipeline_microbatches=5: must divide"),
    ("tfoverlap.train", ["--pipeline_stages=2", "--pipeline_microbatches=4"],
     "--pipeline_split=auto: the runtime needs a profile"),
    ("torch_parity.train", ["--pipeline_stages=2",
                            "--pipeline_microbatches=4", "--strategy=default",
                            "--num_devices=1"],
     "--strategy=default: pipeline stages are separate processes"),
    ("torch_parity.train", ["--pipeline_stages=2",
                            "--pipeline_microbatches=4",
                            "--evaluate=false", "--plan_profile=README.md"],
     "--plan_profile=README.md: not a layer profile"),
    ("tfoverlap.train", ["--pipeline_stages=2", "--pipeline_microbatches=4",
                         "--pipeline_stages_apart=true"],
     "--pipeline_stages_apart=True: the devices runtime derives its "
     "bubble"),
    # The flags take a profile alone (the burst planning command reads one);
    # the trainers refuse it without stages.
    ("tfoverlap.train", ["--plan_profile=README.md"],
     "--plan_profile=README.md: applies only with --pipeline_stages of 2"),
    ("torch_parity.train", ["--plan_profile=README.md"],
     "--plan_profile=README.md: applies only with --pipeline_stages of 2"),
]


@pytest.mark.parametrize("module, args, needle", TRAINER_REFUSALS)
def test_trainers_refuse_with_one_line(module, args, needle):
  assert needle in trainer_refusal(module, args)


# One command per trainer: a refusal its trainer makes (not the flags)
# becomes exit status 2 and one line.
@pytest.mark.parametrize("module, args, needle", [
    TRAINER_REFUSALS[1], TRAINER_REFUSALS[2]])
def test_trainers_exit_2_with_one_line(module, args, needle):
  result = run_module(module, *args, timeout=180)
  assert needle in usage_error_line(result), result.stderr
