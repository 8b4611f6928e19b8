"""The one place a TensorFlow run's parallelism is applied to its model.

`parallelize` builds the model and optimizer and applies, in a fixed order:

  1. pipeline stages: which layers run on which device (not yet: the
     run's ParallelDims has pipeline = 1, and the trainers refuse more);
  2. data parallelism: the model's and optimizer's variables are created
     under the strategy's scope, so they are mirrored on every replica and
     `apply_gradients` all-reduces the gradients;
  3. offload: each Conv and Dense layer's input lives in host memory
     between forward and backward (`tfoverlap.offload.apply_offload`).

Why this order: a stage is the unit that gets replicated, so stages are
placed before the variables are mirrored; offload decides where the
variables of an already placed, already replicated model live.

A burst plan (`--burst_parallel`) replaces steps 1 and 2: the run has one
replica, and the train step splits each layer's batch over the layer's
planned devices (`tfoverlap.burst`). The variables are not mirrored: each
part reads the same variables, so their gradients are already summed.
"""

from typing import Callable, NamedTuple, Optional, Sequence

import keras
import tensorflow as tf

from overlap_core.planning.burst import BurstPlan
from overlap_core.planning.dims import ParallelDims
from overlap_core.runtime.config import ConfigError, OffloadConfig
from tfoverlap import burst as burst_lib
from tfoverlap import offload as offload_lib


class Parallelized(NamedTuple):
  """A model with the run's parallelism applied.

  Attributes:
    model: the Keras model; its variables are what checkpoints save.
    train_model: what the train step calls (here the model itself: the
      strategy, not a wrapper, makes it data parallel).
    optimizer: its optimizer, slots built, so a restore fills them in place.
    dims: the run's degrees of parallelism.
    offload: the `Offloader` that wrapped the model's layers, or None.
    pipeline: the pipeline runtime when pipelined; always None until
      TensorFlow pipeline stages exist. The field keeps the tuple the same
      shape as PyTorch's.
    burst: the forward that runs a burst plan (forward(x, training)), or
      None; then the train step calls it in place of `train_model`.
  """
  model: keras.Model
  train_model: keras.Model
  optimizer: keras.optimizers.Optimizer
  dims: ParallelDims
  offload: Optional[offload_lib.Offloader] = None
  pipeline: None = None
  burst: Optional[Callable] = None


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
                burst: Optional[BurstSpec] = None) -> Parallelized:
  """Builds the model and optimizer with the run's parallelism applied.

  Args:
    strategy: the run's tf.distribute strategy (data parallelism).
    build_model: makes the Keras model.
    build_optimizer: makes its optimizer.
    offload: what to keep in host memory between uses.
    burst: the burst plan to run in place of data parallelism, or None.
  """
  if burst is not None:
    return apply_burst(strategy, build_model, build_optimizer, burst,
                       offload)
  dims = parallel_dims(strategy)
  if dims.is_pipelined:
    raise ValueError(f"Invalid value for argument `strategy`. Received: "
                     f"pipeline={dims.pipeline}; allowed: 1 (TensorFlow "
                     "pipeline stages are not built yet)")
  with strategy.scope():
    model = build_model()
    optimizer = build_optimizer()
    optimizer.build(model.trainable_variables)
  # Outside the scope: the copy counter is one host variable, not mirrored.
  offloader = offload_lib.apply_offload(model, offload)
  return Parallelized(model, model, optimizer, dims, offloader)


def apply_burst(strategy: tf.distribute.Strategy,
                build_model: Callable[[], keras.Model],
                build_optimizer: Callable[[], keras.optimizers.Optimizer],
                spec: BurstSpec, offload: OffloadConfig) -> Parallelized:
  """Replaces steps 1 and 2: every layer on its planned devices.

  Raises:
    ConfigError: the plan does not fit the model (one line).
  """
  if offload.enabled or strategy.num_replicas_in_sync != 1:
    raise ValueError("Invalid value for argument `burst`: a burst plan runs "
                     "on one replica without offload")
  model = build_model()
  optimizer = build_optimizer()
  optimizer.build(model.trainable_variables)
  try:
    widths = burst_lib.widths_for_model(model, spec.plan.widths_by_layer())
    forward = burst_lib.make_burst_forward(model, widths, spec.devices)
  except ValueError as e:
    raise ConfigError("burst_parallel", spec.plan_path, str(e)) from None
  dims = ParallelDims.data_parallel_only(1)
  return Parallelized(model, model, optimizer, dims, burst=forward)
