"""The model: a small functional Keras network that predicts a number.

It returns `(model, Task.regression())`: the trainer then minimizes the
mean squared error against the targets and reports the mean absolute
error when it evaluates. Its layers are named, so a pipeline split can
name its cut (`--pipeline_split=hidden_2`).
"""

import keras

from overlap_core.runtime.user_code import Task

from examples.keras_regression.data import NUM_FEATURES


def build(seed):
  """The trainer passes `seed` because the signature names it."""
  keras.utils.set_random_seed(seed)
  inputs = keras.Input((NUM_FEATURES,), name="features")
  x = inputs
  for i in range(1, 4):
    x = keras.layers.Dense(64, activation="relu", name=f"hidden_{i}")(x)
  outputs = keras.layers.Dense(1, name="prediction")(x)
  return keras.Model(inputs, outputs, name="regressor"), Task.regression()
