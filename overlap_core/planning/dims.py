"""ParallelDims: how one run's processes or replicas divide the work.

Every parallelism a trainer applies is one degree here, and the degrees
multiply to the world: data_parallel x pipeline = world_size, so a pipelined
run and a data-parallel run are told apart by their dims, not by a strategy
name. The arithmetic from the run's settings to the degrees, and from the
degrees to each replica's batch and micro-batch, is here and nowhere else:
the flags, the planning commands and both trainers call it.

  dims = ParallelDims.for_run(strategy="mirrored", num_workers=1,
                              num_devices=4, pipeline_stages=2,
                              framework="pytorch")
  dims.data_parallel                      # 2
  dims.microbatch_size(batch_size=64, num_microbatches=4)   # 8
  dims.coordinates(rank=3)  # MeshCoordinates(pipeline=1, data_parallel=1)
"""

import dataclasses
from typing import Optional

from overlap_core.runtime.compat_table import BOTH, DATA_PARALLEL_REFUSAL, TF
from overlap_core.runtime.config import ConfigError, TrainConfig


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

  @classmethod
  def for_run(cls, *, strategy: str, num_workers: int, num_devices: int,
              pipeline_stages: int = 1,
              framework: Optional[str]) -> "ParallelDims":
    """The dims a run's settings give, validated for `framework`.

    The world is --num_workers processes, each running --num_devices
    replicas under mirrored and one otherwise. It is pipeline stages x
    data-parallel replicas, and every stage of one replica reads the same
    batch: a PyTorch world of 4 ranks in 2 stages is 2 replicas, and a
    TensorFlow pipeline's stages are its --num_devices devices, one replica
    (TensorFlow has no data parallelism across pipelines).

    Args:
      strategy, num_workers, num_devices, pipeline_stages: the flags'
        values (--strategy, ...).
      framework: the trainer that runs them, "tensorflow" or "pytorch"; a
        world it cannot split into the stages is refused. None, for the
        shared flags and the planning commands, which run before any
        trainer refuses the combinations it cannot run: such a world is
        then reckoned as one pipeline of the stages (one replica), so that
        the trainer refuses it later, with its own reason.

    Raises:
      ConfigError: naming --pipeline_stages (or, for TensorFlow,
        --num_devices), the value and what is allowed.
    """
    world = num_workers * (num_devices if strategy == "mirrored" else 1)
    world_flag = "num_devices" if strategy == "mirrored" else "num_workers"
    stages = pipeline_stages
    if framework is not None and framework not in BOTH:
      raise ValueError(f"framework={framework!r}: allowed: "
                       f"{', '.join(BOTH)} or None")
    if framework == TF and stages > 1 and world != stages:
      raise ConfigError("num_devices", num_devices,
                        DATA_PARALLEL_REFUSAL + "; allowed: one device per "
                        f"stage, --num_devices={stages}")
    if world % stages:
      if framework is None:
        return cls(world_size=stages, data_parallel=1, pipeline=stages,
                   world_flag=world_flag)
      raise ConfigError("pipeline_stages", stages,
                        f"stages x replicas must be the world of {world} "
                        f"processes; allowed: a divisor of {world}")
    return cls(world_size=world, data_parallel=world // stages,
               pipeline=stages, world_flag=world_flag)

  @classmethod
  def from_config(cls, config: TrainConfig,
                  framework: Optional[str]) -> "ParallelDims":
    """`for_run` on a validated run configuration."""
    dist = config.distribute
    return cls.for_run(strategy=dist.strategy, num_workers=dist.num_workers,
                       num_devices=dist.num_devices,
                       pipeline_stages=config.pipeline.stages,
                       framework=framework)

  def replica_batch_size(self, batch_size: int) -> int:
    """What one data-parallel replica (one pipeline) reads of the global
    `batch_size`: every stage of the replica reads the same batch."""
    return batch_size // self.data_parallel

  def microbatch_size(self, batch_size: int, num_microbatches: int) -> int:
    """The micro-batch one stage runs: the replica's batch over
    `num_microbatches` (at least 1)."""
    return max(1, self.replica_batch_size(batch_size) // num_microbatches)

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
