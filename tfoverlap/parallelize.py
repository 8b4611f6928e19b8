"""The one place a TensorFlow run's parallelism is applied to its model.

`parallelize` builds the model and optimizer and applies, in a fixed order:

  1. pipeline stages: which layers run on which device (not yet: the
     run's ParallelDims has pipeline = 1, and the trainers refuse more);
  2. data parallelism: the model's and optimizer's variables are created
     under the strategy's scope, so they are mirrored on every replica and
     `apply_gradients` all-reduces the gradients;
  3. offload: where tensors live between uses (not yet).

Why this order: a stage is the unit that gets replicated, so stages are
placed before the variables are mirrored; offload decides where the
variables of an already placed, already replicated model live.
"""

from typing import Callable, Tuple

import keras
import tensorflow as tf

from overlap_core.planning.dims import ParallelDims


def parallel_dims(strategy: tf.distribute.Strategy,
                  strategy_name: str) -> ParallelDims:
  """The run's degrees: every replica a data-parallel copy of the model."""
  world_flag = "num_devices" if strategy_name == "mirrored" else "num_workers"
  return ParallelDims.data_parallel_only(strategy.num_replicas_in_sync,
                                         world_flag=world_flag)


def parallelize(strategy: tf.distribute.Strategy, dims: ParallelDims,
                build_model: Callable[[], keras.Model],
                build_optimizer: Callable[[], keras.optimizers.Optimizer]
                ) -> Tuple[keras.Model, keras.optimizers.Optimizer]:
  """Builds the model and optimizer with the run's parallelism applied.

  Args:
    strategy: the run's tf.distribute strategy (data parallelism).
    dims: the run's validated degrees of parallelism.
    build_model: makes the Keras model.
    build_optimizer: makes its optimizer.

  Returns:
    (model, optimizer), their variables replicated as the strategy says and
    the optimizer's slots built, so a checkpoint restores into them in place.
  """
  if dims.is_pipelined:
    raise ValueError(f"Invalid value for argument `dims`. Received: "
                     f"pipeline={dims.pipeline}; allowed: 1 (TensorFlow "
                     "pipeline stages are not built yet)")
  with strategy.scope():
    model = build_model()
    optimizer = build_optimizer()
    optimizer.build(model.trainable_variables)
  return model, optimizer
