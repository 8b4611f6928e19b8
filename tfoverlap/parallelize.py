"""The one place a TensorFlow run's parallelism is applied to its model.

`parallelize` builds the model and optimizer and applies, in a fixed order
(the same as `torch_parity.parallelize`; why is beside the code):

  1. pipeline stages: the model is cut at the plan's layers into stage
     sub-models on one device each, run by a GPipe step
     (`tfoverlap.pipeline`); a pipelined run has no data parallelism here;
  2. burst: a burst plan (`--burst_parallel`) in place of data
     parallelism: the run has one replica, and the train step splits each
     layer's batch over the layer's planned devices (`tfoverlap.burst`).
     The variables are not mirrored: each part reads the same variables,
     so their gradients are already summed;
  3. data parallelism: the model's and optimizer's variables are created
     under the strategy's scope, so they are mirrored on every replica and
     `apply_gradients` all-reduces the gradients;
  4. offload: each Conv and Dense layer's input lives in host memory
     between forward and backward (`tfoverlap.offload.apply_offload`).
"""

from typing import Callable, Dict, NamedTuple, Optional, Sequence

import keras
import tensorflow as tf

from overlap_core.planning.burst import BurstPlan
from overlap_core.planning.dims import ParallelDims
from overlap_core.planning.profile import Profile
from overlap_core.runtime.config import (ConfigError, OffloadConfig,
                                         PipelineConfig)
from tfoverlap import burst as burst_lib
from tfoverlap import offload as offload_lib
from tfoverlap import pipeline as pipeline_lib
from tfoverlap import pipeline_processes


class Parallelized(NamedTuple):
  """A model with the run's parallelism applied.

  Attributes:
    model: the Keras model; its variables are what checkpoints save.
    train_model: what the train step calls (here the model itself: the
      strategy, not a wrapper, makes it data parallel).
    optimizer: its optimizer, slots built, so a restore fills them in place.
    dims: the run's degrees of parallelism.
    offload: the `Offloader` that wrapped the model's layers, or None.
    pipeline: the `PipelineRuntime` when pipelined (its stages share the
      model's layers; the train step runs its schedule), else None.
    burst: the forward that runs a burst plan (forward(x, training)), or
      None; then the train step calls it in place of `train_model`.
    burst_placements: with `burst`, a dict the first burst step that runs
      fills: where each layer's parts computed, forward and backward
      (`tfoverlap.burst.placements_of_step`); else None.
  """
  model: keras.Model
  train_model: keras.Model
  optimizer: keras.optimizers.Optimizer
  dims: ParallelDims
  offload: Optional[offload_lib.Offloader] = None
  pipeline: Optional[pipeline_lib.PipelineRuntime] = None
  burst: Optional[Callable] = None
  burst_placements: Optional[Dict[str, dict]] = None


class PipelineSpec(NamedTuple):
  """What step 1 needs to cut the model: the flags' pipeline settings, the
  micro-batch the layer graph is read at, one device per stage, and the
  layer profile that predicts stage times (None: no predictions)."""
  config: PipelineConfig
  microbatch_size: int
  devices: Sequence[str]
  profile: Optional[Profile] = None


class BurstSpec(NamedTuple):
  """A burst plan to run, where it came from, and the devices it runs on
  (a layer of width k runs on the first k)."""
  plan: BurstPlan
  plan_path: str
  devices: Sequence[str]


def parallel_dims(strategy: tf.distribute.Strategy) -> ParallelDims:
  """The run's degrees: every replica a data-parallel copy of the model."""
  return ParallelDims.data_parallel_only(strategy.num_replicas_in_sync)


def parallelize(strategy: tf.distribute.Strategy,
                build_model: Callable[[], keras.Model],
                build_optimizer: Callable[[], keras.optimizers.Optimizer],
                offload: OffloadConfig = OffloadConfig(),
                pipeline: Optional[PipelineSpec] = None,
                burst: Optional[BurstSpec] = None, *,
                time_offload_copies: bool = True) -> Parallelized:
  """Builds the model and optimizer with the run's parallelism applied.

  Args:
    strategy: the run's tf.distribute strategy (data parallelism); the
      default strategy when pipelined.
    build_model: makes the Keras model.
    build_optimizer: makes its optimizer.
    offload: what to keep in host memory between uses.
    pipeline: how to cut the model, when it has more than one stage.
    burst: the burst plan to run in place of data parallelism, or None.
    time_offload_copies: time the offload copies in the graph; False
      under op determinism, which refuses `tf.timestamp`.

  """
  # The order is the same on both sides (torch_parity.parallelize):
  # pipeline first, because a stage is the unit the other parallelisms
  # replicate, so the model is cut before anything is copied; burst next,
  # because it replaces data parallelism and must be chosen before any
  # variable is mirrored; data parallelism then, because it decides the
  # replicas every variable has; offload last, because it decides where
  # the variables of an already placed, already replicated model live.
  # Pipeline, burst and offload do not combine with one another or with a
  # strategy's replicas; the compatibility table refuses those before
  # this runs (`trainer.check_supported`).
  if pipeline is not None and pipeline.config.stages > 1:
    return apply_pipeline(strategy, build_model, build_optimizer, pipeline)
  if burst is not None:
    return apply_burst(strategy, build_model, build_optimizer, burst)
  dims = parallel_dims(strategy)
  with strategy.scope():
    model = build_model()
    optimizer = build_optimizer()
    optimizer.build(model.trainable_variables)
  # Outside the scope: the copy counter is one host variable, not mirrored.
  offloader = offload_lib.apply_offload(
      model, offload, time_copies=time_offload_copies,
      num_replicas=_local_replicas(strategy))
  return Parallelized(model, model, optimizer, dims, offloader)


def _local_replicas(strategy: tf.distribute.Strategy) -> int:
  """The replicas this process runs (a multi-worker job's other workers
  run theirs in processes of their own)."""
  try:
    return len(strategy.extended.worker_devices)
  except RuntimeError:  # the default strategy has no device list: one
    return 1


def apply_pipeline(strategy: tf.distribute.Strategy,
                   build_model: Callable[[], keras.Model],
                   build_optimizer: Callable[[], keras.optimizers.Optimizer],
                   spec: PipelineSpec) -> Parallelized:
  """Step 1: the whole model, its stages on their devices (this process's,
  or with --pipeline_runtime=processes the stage servers').

  Args:
    strategy: the default strategy (a pipelined run has one replica
      here); the variables are created under its scope.

  Raises:
    ConfigError: for a split the model cannot take.
  """
  cfg = spec.config
  with strategy.scope():
    model = build_model()
    optimizer = build_optimizer()
  plan = pipeline_lib.plan_split(model, cfg, batch_size=spec.microbatch_size,
                                 profile=spec.profile)
  if cfg.runtime == pipeline_processes.RUNTIME:
    # Moves each stage's variables to its stage server.
    runtime = pipeline_processes.ProcessPipelineRuntime(
        model, plan.cuts, num_microbatches=cfg.microbatches,
        stages_apart=cfg.stages_apart)
  else:
    runtime = pipeline_lib.PipelineRuntime(
        model, plan.cuts, devices=spec.devices,
        num_microbatches=cfg.microbatches)
  # After the stages are placed: the optimizer makes its slots beside
  # their variables.
  with strategy.scope():
    optimizer.build(model.trainable_variables)
  if spec.profile is not None:
    runtime.predicted_by = plan
  # Its stages are this process's devices, one replica.
  dims = ParallelDims.for_run(strategy="mirrored", num_workers=1,
                              num_devices=len(spec.devices),
                              pipeline_stages=cfg.stages,
                              framework="tensorflow")
  return Parallelized(model, model, optimizer, dims, None, runtime)


def apply_burst(strategy: tf.distribute.Strategy,
                build_model: Callable[[], keras.Model],
                build_optimizer: Callable[[], keras.optimizers.Optimizer],
                spec: BurstSpec) -> Parallelized:
  """Replaces step 2: every layer on its planned devices.

  Args:
    strategy: the default strategy (a burst run has one replica: its
      parts read the same variables); the variables are created under
      its scope.

  Raises:
    ConfigError: the plan does not fit the model (one line).
  """
  with strategy.scope():
    model = build_model()
    optimizer = build_optimizer()
    optimizer.build(model.trainable_variables)
  try:
    widths = burst_lib.widths_for_model(model, spec.plan)
    forward = burst_lib.make_burst_forward(model, widths, spec.devices)
  except ValueError as e:
    raise ConfigError("burst_parallel", spec.plan_path, str(e)) from None
  dims = ParallelDims.data_parallel_only(1)
  return Parallelized(model, model, optimizer, dims, burst=forward,
                      burst_placements={})
