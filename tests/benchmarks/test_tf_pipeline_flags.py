"""benchmarks.tf_pipeline's command lines: valid flags, the stated size."""

import argparse

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from benchmarks import tf_pipeline

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()


@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("microbatch_size", [1, 4])
def test_each_micro_batch_holds_the_size_asked(framework, stages,
                                               microbatch_size):
  args = argparse.Namespace(image_size=32, microbatch_size=microbatch_size)
  build_flags = tf_pipeline._flags  # pylint: disable=protected-access
  for microbatches in (stages, 8 * stages):
    argv = build_flags(framework, stages, microbatches, args, train_steps=20)
    parsed = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "true")
                  for a in argv)
    with flagsaver.as_parsed(**parsed):
      config = tfo_flags.to_config()
    # S devices, S stages: one pipeline, which splits the whole batch.
    assert config.distribute.num_devices == config.pipeline.stages == stages
    assert config.data.batch_size // microbatches == args.microbatch_size
