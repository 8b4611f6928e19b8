"""ParallelDims: the degrees of parallelism multiply to the world."""

import pytest

from overlap_core.planning.dims import MeshCoordinates, ParallelDims
from overlap_core.runtime.config import ConfigError


def test_degrees_must_multiply_to_the_world():
  with pytest.raises(ConfigError, match=r"--num_workers=6: data parallel x "
                     r"pipeline = 2 x 2 = 4, not the world of 6"):
    ParallelDims(world_size=6, data_parallel=2, pipeline=2)
  with pytest.raises(ConfigError, match="--pipeline=0: allowed: an integer"):
    ParallelDims(world_size=2, data_parallel=2, pipeline=0)
  with pytest.raises(ConfigError, match="--num_devices=2"):
    ParallelDims(world_size=2, data_parallel=1, world_flag="num_devices")


def test_data_parallel_only_is_every_rank_a_replica():
  dims = ParallelDims.data_parallel_only(4)
  assert (dims.data_parallel, dims.pipeline) == (4, 1)
  assert dims.is_data_parallel and not dims.is_pipelined
  assert dims.describe() == {"world_size": 4, "data_parallel": 4,
                             "pipeline": 1}
  assert not ParallelDims.data_parallel_only(1).is_data_parallel


def test_a_stage_s_replicas_are_adjacent_ranks():
  dims = ParallelDims(world_size=6, data_parallel=3, pipeline=2)
  assert [dims.coordinates(r) for r in range(6)] == [
      MeshCoordinates(0, 0), MeshCoordinates(0, 1), MeshCoordinates(0, 2),
      MeshCoordinates(1, 0), MeshCoordinates(1, 1), MeshCoordinates(1, 2)]
  with pytest.raises(ValueError, match="rank=6"):
    dims.coordinates(6)


def _for_run(framework, strategy="mirrored", num_workers=1, num_devices=2,
             pipeline_stages=1):
  return ParallelDims.for_run(strategy=strategy, num_workers=num_workers,
                              num_devices=num_devices,
                              pipeline_stages=pipeline_stages,
                              framework=framework)


@pytest.mark.parametrize("framework", ["tensorflow", "pytorch", None])
def test_for_run_counts_the_world_from_the_strategy(framework):
  # Mirrored: --num_devices replicas in each of --num_workers processes.
  assert _for_run(framework, num_workers=2, num_devices=2) == ParallelDims(
      4, 4, 1, world_flag="num_devices")
  assert _for_run(framework, strategy="multi_worker", num_workers=3,
                  num_devices=2) == ParallelDims(3, 3, 1)
  assert _for_run(framework, strategy="default").world_size == 1


def test_a_tensorflow_pipeline_is_one_replica_of_its_devices():
  dims = _for_run("tensorflow", num_devices=2, pipeline_stages=2)
  assert (dims.world_size, dims.data_parallel, dims.pipeline) == (2, 1, 2)
  assert dims.microbatch_size(batch_size=8, num_microbatches=4) == 2
  with pytest.raises(ConfigError) as raised:
    _for_run("tensorflow", num_devices=4, pipeline_stages=2)
  assert str(raised.value).startswith(
      "--num_devices=4: data parallelism across pipelines")
  assert "allowed: one device per stage, --num_devices=2" in str(
      raised.value)


def test_a_pytorch_world_of_4_in_2_stages_is_2_replicas():
  dims = _for_run("pytorch", num_devices=4, pipeline_stages=2)
  assert (dims.world_size, dims.data_parallel, dims.pipeline) == (4, 2, 2)
  assert dims.replica_batch_size(16) == 8
  assert dims.microbatch_size(batch_size=16, num_microbatches=4) == 2
  assert dims.coordinates(3) == MeshCoordinates(pipeline=1, data_parallel=1)


def test_a_world_the_stages_do_not_divide_is_refused_in_one_line():
  with pytest.raises(ConfigError) as raised:
    _for_run("pytorch", num_devices=3, pipeline_stages=2)
  message = str(raised.value)
  assert message == ("--pipeline_stages=2: stages x replicas must be the "
                     "world of 3 processes; allowed: a divisor of 3")
  # Before a trainer is known (the shared flags, the planning commands),
  # it counts as one pipeline for the batch: the trainer refuses it later.
  dims = _for_run(None, num_devices=3, pipeline_stages=2)
  assert (dims.data_parallel, dims.pipeline) == (1, 2)
  assert dims.replica_batch_size(16) == 16
