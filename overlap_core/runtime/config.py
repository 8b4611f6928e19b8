"""Validated, frozen run configuration shared by both framework sides.

`flags/` turns parsed absl flags into a `TrainConfig` once, in `main()`; every
library module takes these dataclasses (or plain arguments) and never reads
flags itself. Nothing here imports TensorFlow or PyTorch.
"""

import dataclasses
from typing import Optional, Tuple

AUTOTUNE = -1  # the sentinel stored for "autotune" in prefetch / parallelism
CHECKPOINT_AUTO = 0  # the `every_steps` of --checkpoint_every=auto


class ConfigError(ValueError):
  """A configuration value that is not allowed.

  The message always names the flag, the value received and what is allowed,
  so the trainers can print it as the one line a user sees.
  """

  def __init__(self, flag: str, value, allowed: str):
    self.flag = flag
    self.value = value
    self.allowed = allowed
    super().__init__(f"--{flag}={value}: {allowed}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  model_dir: str
  train_steps: int
  log_every_steps: int
  seed: int
  deterministic: bool
  loop: str  # "ctl" (custom training loop) or "fit" (Keras model.fit)
  progress: bool
  trace: bool
  tensorboard: bool
  evaluate: bool
  intra_op_threads: int  # 0 = the framework's default
  inter_op_threads: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  name: str
  optimizer: str
  learning_rate: float
  precision: str  # float32 | mixed_float16 | mixed_bfloat16


@dataclasses.dataclass(frozen=True)
class DataConfig:
  dataset: str  # digits | synthetic | tfds | image_folder
  data_dir: Optional[str]
  tfds_name: str
  image_size: int
  num_classes: int  # synthetic only; the other sources know their own
  batch_size: int  # global batch, summed over all replicas and workers
  synthetic_on_device: bool
  prefetch: int  # 0 = off, N = depth, AUTOTUNE
  prefetch_to_device: bool
  map_parallelism: int  # 1 = sequential, N, AUTOTUNE
  cache: bool
  shuffle_buffer: int  # 0 = no shuffling
  preprocess_cost_ms: float  # real CPU work added per sample
  data_service: str  # "" = off, "local" = start one on localhost, or an address


@dataclasses.dataclass(frozen=True)
class DistributeConfig:
  strategy: str  # default | one_device | mirrored | multi_worker | horovod
  num_devices: int
  num_workers: int
  all_reduce: str  # auto | ring | nccl
  all_reduce_pack_mb: float  # 0 = the framework's default packing


def check_all_reduce_applies(cfg: DistributeConfig) -> None:
  """Refuses all-reduce flags that a strategy without an all-reduce ignores.

  `default` and `one_device` run one replica, so --all_reduce and
  --all_reduce_pack_mb would change nothing; both frameworks refuse them
  rather than ignore them.

  Raises:
    ConfigError: naming the all-reduce flag that is set.
  """
  if cfg.strategy in ("default", "one_device"):
    if cfg.all_reduce != "auto":
      raise ConfigError("all_reduce", cfg.all_reduce,
                        f"--strategy={cfg.strategy} has no all-reduce; "
                        "allowed: auto")
    if cfg.all_reduce_pack_mb:
      raise ConfigError("all_reduce_pack_mb", cfg.all_reduce_pack_mb,
                        f"--strategy={cfg.strategy} has no all-reduce; "
                        "allowed: 0")


def check_nccl_has_gpus(cfg: DistributeConfig, *, num_gpus: int) -> None:
  """Refuses --all_reduce=nccl on a host without GPUs.

  Args:
    cfg: the distribution configuration.
    num_gpus: the GPUs this host has, as the framework sees them.

  Raises:
    ConfigError: naming all_reduce.
  """
  if cfg.all_reduce == "nccl" and not num_gpus:
    raise ConfigError("all_reduce", "nccl",
                      "NCCL needs GPUs and this host has none; allowed: "
                      "auto or ring")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  mode: str  # none | sync | tf_async | async
  every_steps: int  # CHECKPOINT_AUTO = the adaptive cadence chooses
  keep: int
  max_overhead_frac: float = 0.03  # the bound of the adaptive cadence
  on_error: str = "raise"  # raise | warn
  if_busy: str = "wait"  # wait | skip: a persist still runs when due


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """--pipeline_*: stages 1 means the model is not pipelined."""
  stages: int = 1
  microbatches: int = 1
  schedule: str = "gpipe"  # gpipe | 1f1b | interleaved_1f1b | zero_bubble
  split: str = "auto"  # auto | even | explicit
  cut_layers: Tuple[str, ...] = ()  # with split=explicit: S*V - 1 layers
  virtual_stages: int = 1  # stages per rank (interleaved schedules)


def check_not_pipelined(cfg: PipelineConfig, framework: str) -> None:
  """Refuses --pipeline_stages > 1 until this framework's runtime exists.

  Raises:
    ConfigError: naming pipeline_stages.
  """
  if cfg.stages > 1:
    raise ConfigError("pipeline_stages", cfg.stages,
                      f"the {framework} pipeline runtime is not built yet "
                      "(python -m torch_parity.plan plans a split offline);"
                      " allowed: 1")


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
  """Which tensors leave the device between uses, and how they travel.

  The default offloads nothing, so constructors that predate offload keep
  working.
  """
  targets: Tuple[str, ...] = ()  # subset of ("activations", "parameters")
  pin_memory: bool = False  # page-locked host buffers
  non_blocking: bool = False  # copies issued with non_blocking=True
  prefetch: bool = False  # next layer's tensors back early, on a side stream

  @property
  def enabled(self) -> bool:
    return bool(self.targets)

  @property
  def activations(self) -> bool:
    return "activations" in self.targets

  @property
  def parameters(self) -> bool:
    return "parameters" in self.targets


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  run: RunConfig
  model: ModelConfig
  data: DataConfig
  distribute: DistributeConfig
  checkpoint: CheckpointConfig
  pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
  offload: OffloadConfig = dataclasses.field(default_factory=OffloadConfig)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)
