"""The planning commands' shared argument handling, framework-free."""

import os

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.planning.command import (plan_microbatch_size,
                                           profile_batch_sizes,
                                           profiling_threads)
from overlap_core.planning.dims import ParallelDims

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()


@pytest.mark.parametrize("microbatch, sizes", [
    (8, [4, 8, 16]),
    (3, [2, 3, 6]),
    # Half of 2 would be 1: BatchNorm cannot train on one value per channel.
    (2, [2, 4]),
    (1, [1, 2]),
])
def test_default_sizes_bracket_the_micro_batch_and_never_profile_one_alone(
    microbatch, sizes):
  assert profile_batch_sizes([], microbatch) == sizes


def test_requested_sizes_are_sorted_unique_and_positive():
  assert profile_batch_sizes(["8", "2", "8"], 4) == [2, 8]
  for bad in (["0"], ["two"], ["-1", "4"]):
    with pytest.raises(ValueError, match="allowed: positive integers"):
      profile_batch_sizes(bad, 4)


def test_layers_are_timed_on_the_threads_one_trainer_process_gets():
  cores = os.cpu_count() or 1
  with flagsaver.as_parsed(strategy="mirrored", num_devices="2",
                           pipeline_stages="2"):
    config = tfo_flags.to_config()
  world = ParallelDims.from_config(config, None).world_size
  assert world == 2
  assert profiling_threads(config, world) == max(1, cores // 2)
  with flagsaver.as_parsed(strategy="mirrored", num_devices="2",
                           intra_op_threads="3"):
    config = tfo_flags.to_config()
  assert profiling_threads(
      config, ParallelDims.from_config(config, None).world_size) == 3


@pytest.mark.parametrize("parsed, microbatch", [
    # One pipeline over the 2 mirrored devices: the whole batch of 16.
    (dict(num_devices="2", pipeline_stages="2", pipeline_microbatches="4"), 4),
    # 4 ranks in 2 stages: 2 replicas of 8.
    (dict(num_devices="4", pipeline_stages="2", pipeline_microbatches="4"), 2),
    # A world the stages do not divide plans as one pipeline; the trainer
    # refuses it when it runs.
    (dict(strategy="default", pipeline_stages="2",
          pipeline_microbatches="2"), 8),
])
def test_the_planned_micro_batch_is_the_replicas_batch_over_m(parsed,
                                                              microbatch):
  with flagsaver.as_parsed(batch_size="16", **parsed):
    config = tfo_flags.to_config()
  assert plan_microbatch_size(config) == microbatch
