"""ParallelDims: how one run's processes or replicas divide the work.

Every parallelism a trainer applies is one degree here, and the degrees
multiply to the world: data_parallel x pipeline = world_size. Today only
data parallelism exists (pipeline = 1); pipeline stages will be the second
axis of the same mesh, so a pipelined run and a data-parallel run are told
apart by their dims, not by a strategy name.

  dims = ParallelDims(world_size=4, data_parallel=2, pipeline=2)
  dims.coordinates(rank=3)  # MeshCoordinates(pipeline=1, data_parallel=1)
"""

import dataclasses

from overlap_core.runtime.config import ConfigError


@dataclasses.dataclass(frozen=True)
class MeshCoordinates:
  """Where one rank sits: its pipeline stage and its data-parallel replica."""
  pipeline: int
  data_parallel: int


@dataclasses.dataclass(frozen=True)
class ParallelDims:
  """The validated degrees of parallelism of one run.

  Attributes:
    world_size: processes (PyTorch) or replicas (TensorFlow) in the run.
    data_parallel: replicas that each see a different shard of the batch and
      all-reduce their gradients.
    pipeline: stages the model is split into (1: not pipelined).
    world_flag: the flag that set the world size, named in errors.
  """
  world_size: int
  data_parallel: int
  pipeline: int = 1
  world_flag: str = "num_workers"

  def __post_init__(self):
    for name in ("world_size", "data_parallel", "pipeline"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(self.world_flag if name == "world_size" else name,
                          value, "allowed: an integer of at least 1")
    if self.data_parallel * self.pipeline != self.world_size:
      raise ConfigError(
          self.world_flag, self.world_size,
          f"data parallel x pipeline = {self.data_parallel} x "
          f"{self.pipeline} = {self.data_parallel * self.pipeline}, not the "
          f"world of {self.world_size}; allowed: degrees whose product is "
          "the world size")

  @classmethod
  def data_parallel_only(cls, world_size: int,
                         world_flag: str = "num_workers") -> "ParallelDims":
    """Every process or replica a data-parallel replica of the whole model."""
    return cls(world_size=world_size, data_parallel=world_size,
               world_flag=world_flag)

  @property
  def is_data_parallel(self) -> bool:
    return self.data_parallel > 1

  @property
  def is_pipelined(self) -> bool:
    return self.pipeline > 1

  def coordinates(self, rank: int) -> MeshCoordinates:
    """The mesh position of `rank`.

    Data-parallel replicas of one stage are adjacent ranks: on a host, a
    stage's all-reduce then stays among neighbours while the point-to-point
    activations cross between stage groups.
    """
    if not 0 <= rank < self.world_size:
      raise ValueError(f"Invalid value for argument `rank`. Received: "
                       f"rank={rank}; allowed: 0 to {self.world_size - 1}")
    return MeshCoordinates(pipeline=rank // self.data_parallel,
                           data_parallel=rank % self.data_parallel)

  def describe(self) -> dict:
    """What run.json records: the degrees, by name."""
    return {"world_size": self.world_size,
            "data_parallel": self.data_parallel, "pipeline": self.pipeline}
