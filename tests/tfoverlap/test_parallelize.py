"""The one parallelize step of the TensorFlow trainer."""

import keras
import tensorflow as tf

from tfoverlap import distribute, parallelize


def _build_model():
  inputs = keras.Input((4,))
  return keras.Model(inputs, keras.layers.Dense(2)(inputs))


def test_variables_are_mirrored_and_the_optimizer_built(two_cpu_devices):
  strategy = distribute.mirrored_strategy(two_cpu_devices)
  built = parallelize.parallelize(
      strategy, _build_model, lambda: keras.optimizers.Adam())
  model, train_model, optimizer, dims = (built.model, built.train_model,
                                         built.optimizer, built.dims)
  assert train_model is model and built.burst is None
  assert (dims.world_size, dims.data_parallel, dims.pipeline) == (2, 2, 1)
  # Mirrored: one component per replica device, so apply_gradients
  # all-reduces; built slots, so a checkpoint restores into them in place.
  kernel = model.trainable_variables[0].value
  assert len(strategy.experimental_local_results(kernel)) == 2
  assert len(optimizer.variables) > 1


def test_the_default_strategy_is_one_replica():
  dims = parallelize.parallelize(
      tf.distribute.get_strategy(), _build_model,
      lambda: keras.optimizers.SGD()).dims
  assert not dims.is_data_parallel
