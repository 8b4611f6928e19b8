"""A small convolutional classifier, the model of the main training job.

Two stages of two 3x3 convolutions ("same" padding, with bias, ReLU, no
BatchNorm) of 32 then 64 filters, each stage followed by 2x2 max pooling
(floor, as torch's MaxPool2d(2)); then Flatten, Dense(128) ReLU and
Dense(num_classes). It is defined here, not after a published reference; the
PyTorch mirror is Conv2d(k=3, padding=1) x2, MaxPool2d(2), Conv2d x2,
MaxPool2d(2), Flatten, Linear(64*(image_size//4)**2, 128), ReLU,
Linear(128, num_classes), with the same trainable parameters:
  conv 3x3: channels*32*9+32, 32*32*9+32, 32*64*9+64, 64*64*9+64;
  dense: 64*(image_size//4)**2*128+128, 128*num_classes+num_classes.
Keras flattens HWC and torch CHW, which permutes the first Dense's rows but
not its size. The input side must be at least 4 so that both poolings keep a
pixel.

Flatten rather than global average pooling: on 32x32 digits (load_digits
upscaled, batch 64, Adam 1e-3) global pooling reached only 86-90% held-out
accuracy after 300 steps, Flatten 95-99% after 100.
"""

import keras

from tfoverlap.models import layers


def build_small_cnn(*, image_size: int, num_classes: int,
                    channels: int) -> keras.Model:
  """Builds the small CNN; arguments and result as `build_model`'s."""
  inputs = layers.image_input(image_size, channels)
  x = inputs
  for stage, filters in enumerate((32, 64), start=1):
    for index in (1, 2):
      x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu",
                              name=f"conv{stage}_{index}")(x)
    x = keras.layers.MaxPooling2D(2, name=f"pool{stage}")(x)
  x = keras.layers.Flatten(name="flatten")(x)
  x = keras.layers.Dense(128, activation="relu", name="fc1")(x)
  x = keras.layers.Dense(num_classes, name="fc2")(x)
  return keras.Model(inputs, layers.float32_output(x), name="small_cnn")
