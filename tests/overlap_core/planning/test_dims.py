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
