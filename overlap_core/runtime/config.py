"""Validated, frozen run configuration shared by both framework sides.

`flags/` turns parsed absl flags into a `TrainConfig` once, in `main()`; every
library module takes these dataclasses (or plain arguments) and never reads
flags itself. Nothing here imports TensorFlow or PyTorch.
"""

import dataclasses
import re
from typing import Mapping, Optional, Tuple

from overlap_core.runtime import contention
from overlap_core.runtime.paired_removal import (
    DEFAULT_BLOCK_STEPS, NONE as NO_PAIRED_REMOVAL)

AUTOTUNE = -1  # the sentinel stored for "autotune" in prefetch / parallelism
CHECKPOINT_AUTO = 0  # the `every_steps` of --checkpoint_every=auto
# Every entry point exits with this status after printing a ConfigError's
# one line; launchers and the comparison read it as "refused, said why".
USAGE_ERROR_EXIT_CODE = 2


class ConfigError(ValueError):
  """A configuration value that is not allowed.

  The message always names the flag, the value received and what is allowed,
  so the trainers can print it as the one line a user sees.
  """

  def __init__(self, flag: str, value, allowed: str,
               page: Optional[str] = None):
    self.flag = flag
    self.value = value
    self.allowed = allowed
    # The manual page that explains the refusal, where it is not the page
    # of the flag's own group (flags.help.page_for).
    self.page = page
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
  # Optimizer steps per traced call (TensorFlow); 1 = one call per step.
  steps_per_execution: int = 1
  # overlap_core.runtime.host_allocator.POLICIES
  host_allocator: str = "retain"
  # Steps timed alone before training, the reference that contention is
  # measured against (overlap_core.runtime.contention); 0 = none.
  reference_steps: int = contention.DEFAULT_REFERENCE_STEPS
  # A cause removed in alternate blocks of steps
  # (overlap_core.runtime.paired_removal); "none": the run as configured.
  paired_removal: str = NO_PAIRED_REMOVAL
  paired_block_steps: int = DEFAULT_BLOCK_STEPS


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
  all_reduce: str  # auto | ring | nccl | off (no gradient all-reduce)
  all_reduce_pack_mb: float  # 0 = the framework's default packing


CHECKPOINT_MODES = ("none", "sync", "tf_async", "async")
ON_ERROR_POLICIES = ("raise", "warn")
IF_BUSY_POLICIES = ("wait", "skip")


class ArgumentError(ConfigError):
  """A ConfigError about a Python argument rather than a flag.

  The same message less the flag's dashes, with the value as Python writes
  it: `keep=0: allowed: an integer >= 1`.
  """

  def __init__(self, argument: str, value, allowed: str):
    super().__init__(argument, value, allowed)
    self.args = (f"{argument}={value!r}: {allowed}",)


def setting_error(name: str, value, allowed: str) -> ConfigError:
  """The error for a setting as the user spelled it: `--flag` or argument."""
  if name.startswith("--"):
    return ConfigError(name[2:], value, allowed)
  return ArgumentError(name, value, allowed)


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def every_steps_from(value, name: str = "every") -> int:
  """A checkpoint interval as users write it, as `every_steps` stores it.

  Args:
    value: "auto" (any case), or a number of steps >= 1 (an int, or its
      text as a flag gives it).
    name: the setting as the user spelled it, for the error.

  Returns:
    CHECKPOINT_AUTO for "auto", else the number of steps.

  Raises:
    ConfigError: naming `name`, for anything else (0 included: it would
      read as "never", which is --checkpoint=none).
  """
  if isinstance(value, str):
    text = value.strip().lower()
    if text == "auto":
      return CHECKPOINT_AUTO
    steps = int(text) if re.fullmatch(r"[+]?\d+", text) else 0
  else:
    steps = value if _is_int(value) else 0
  if steps < 1:
    raise setting_error(name, value, 'allowed: "auto" or an integer >= 1')
  return steps


def _one_of(choices) -> str:
  return "allowed: " + ", ".join(choices)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """How a run checkpoints; every field is checked when it is built.

  The one place checkpoint settings are validated, for the flags, the Keras
  callback and the checkpointers alike. A value that is not allowed raises
  ConfigError (a ValueError) naming the setting as the caller spells it,
  the value received and what is allowed.

  Usage:
    CheckpointConfig(mode="async", every_steps=every_steps_from("auto"),
                     keep=3, names={"keep": "--checkpoint_keep"})

  Args (besides the fields):
    names: field -> the name the user gave it ("--checkpoint_keep" for a
      flag, "keep" for an argument); a field not named is called by its
      own name. Not stored.
  """
  mode: str  # none | sync | tf_async | async
  every_steps: int  # CHECKPOINT_AUTO = the adaptive cadence chooses
  keep: int
  max_overhead_frac: float = 0.03  # the bound of the adaptive cadence
  on_error: str = "raise"  # raise | warn
  if_busy: str = "wait"  # wait | skip: a persist still runs when due
  names: dataclasses.InitVar[Optional[Mapping[str, str]]] = None

  def __post_init__(self, names: Optional[Mapping[str, str]]):
    def name(field: str) -> str:
      return (names or {}).get(field, field)

    if self.mode not in CHECKPOINT_MODES:
      raise setting_error(name("mode"), self.mode, _one_of(CHECKPOINT_MODES))
    if not _is_int(self.every_steps) or self.every_steps < 0:
      raise setting_error(name("every_steps"), self.every_steps,
                          f"allowed: {CHECKPOINT_AUTO} (auto) or an integer "
                          ">= 1")
    if not _is_int(self.keep) or self.keep < 1:
      raise setting_error(name("keep"), self.keep,
                          "allowed: an integer >= 1")
    fraction = self.max_overhead_frac
    if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
        or not 0 < fraction < 1):
      raise setting_error(name("max_overhead_frac"), fraction,
                          "allowed: a fraction between 0 and 1, e.g. 0.03 "
                          "for 3%")
    if self.on_error not in ON_ERROR_POLICIES:
      raise setting_error(name("on_error"), self.on_error,
                          _one_of(ON_ERROR_POLICIES))
    if self.if_busy not in IF_BUSY_POLICIES:
      raise setting_error(name("if_busy"), self.if_busy,
                          _one_of(IF_BUSY_POLICIES))


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """--pipeline_*: stages 1 means the model is not pipelined."""
  stages: int = 1
  microbatches: int = 1
  schedule: str = "gpipe"  # gpipe | 1f1b | interleaved_1f1b | zero_bubble
  split: str = "auto"  # auto | even | explicit
  cut_layers: Tuple[str, ...] = ()  # with split=explicit: S*V - 1 layers
  virtual_stages: int = 1  # stages per rank (interleaved schedules)
  profile: str = ""  # --plan_profile: a layer profile JSON that predicts
  # stage times (and lets split=auto run); "" for none
  # With stage replicas, all-reduce a stage's gradient buckets as the last
  # micro-batch's backward finishes them (False: after the schedule's step).
  overlap_all_reduce: bool = True
  # Where TensorFlow's stages run: "devices" (one process, a device each)
  # or "processes" (a TensorFlow server process each, driven by one
  # client). PyTorch's stages are always processes.
  runtime: str = "devices"
  # Each stage on resident stand-ins for its neighbours' activations and
  # gradients: the stages' work without waits or transfers (PyTorch only).
  stages_apart: bool = False


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
class BurstConfig:
  """--burst_parallel, --amplification_limit, --background_job.

  The default runs no burst plan and no background job.
  """
  plan_path: str = ""  # "" = off; else a burst plan JSON, already checked
  num_devices: int = 1  # the plan's devices (the run's replicas)
  amplification_limit: float = 2.0  # every planned layer is within it
  background_job: str = "none"  # a name from flags/burst.py, or "none"

  @property
  def enabled(self) -> bool:
    return bool(self.plan_path)

  @property
  def background(self) -> bool:
    return self.background_job != "none"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  run: RunConfig
  model: ModelConfig
  data: DataConfig
  distribute: DistributeConfig
  checkpoint: CheckpointConfig
  pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
  offload: OffloadConfig = dataclasses.field(default_factory=OffloadConfig)
  burst: BurstConfig = dataclasses.field(default_factory=BurstConfig)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def check_burst_supported(cfg: BurstConfig, *, host_devices: int,
                          device_kind: str) -> None:
  """Refuses a plan for more devices than this host has.

  Args:
    cfg: the burst settings.
    host_devices: GPUs, or CPU cores on a host without GPUs.
    device_kind: "GPUs" or "CPU cores", for the message.

  Raises:
    ConfigError: naming the flag.
  """
  if cfg.enabled and cfg.num_devices > host_devices:
    raise ConfigError("burst_parallel", cfg.plan_path,
                      f"the plan needs {cfg.num_devices} devices and this "
                      f"host has {host_devices} {device_kind}")
