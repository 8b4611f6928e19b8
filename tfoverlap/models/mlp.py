"""A multilayer perceptron, the zoo's smallest classifier.

Flatten -> Dense(512) ReLU -> Dense(256) ReLU -> Dense(num_classes), all with
bias. The PyTorch mirror is nn.Flatten, nn.Linear(C*H*W, 512), ReLU,
nn.Linear(512, 256), ReLU, nn.Linear(256, num_classes): the same trainable
parameters, (C*H*W*512 + 512) + (512*256 + 256) + (256*num_classes +
num_classes). Keras flattens HWC and torch CHW, which permutes the first
Dense's rows but not its size.
"""

import keras

from tfoverlap.models import layers


def build_mlp(*, image_size: int, num_classes: int,
              channels: int) -> keras.Model:
  """Builds the MLP classifier; arguments and result as `build_model`'s."""
  inputs = layers.image_input(image_size, channels)
  x = keras.layers.Flatten(name="flatten")(inputs)
  x = keras.layers.Dense(512, activation="relu", name="fc1")(x)
  x = keras.layers.Dense(256, activation="relu", name="fc2")(x)
  x = keras.layers.Dense(num_classes, name="fc3")(x)
  return keras.Model(inputs, layers.float32_output(x), name="mlp")
