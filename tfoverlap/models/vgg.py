"""VGG-16 and VGG-19 (configurations D and E, no BatchNorm), after
torchvision.models.vgg16 and vgg19.

Follows torchvision's `VGG(make_layers(cfgs["D"]))` (and "E"):
  features: 3x3 convolutions (padding 1, with bias, ReLU) of
  64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M
  (D; E has four convolutions in each of the last three stages)
  where M is 2x2/2 max pooling;
  classifier: Dense(4096) ReLU Dropout(0.5), Dense(4096) ReLU Dropout(0.5),
  Dense(num_classes).
One deliberate difference: torchvision pools the feature map to 7x7 with
AdaptiveAvgPool2d before flattening; here the final (image_size // 32)^2 map
is flattened as it is, so the first Dense has 512 * (image_size // 32)^2
inputs. At 224 the map is already 7x7 and the pooling is the identity, so the
model and its trainable parameters (1000 classes: 138,357,544 for VGG-16,
143,667,240 for VGG-19) equal torchvision's; at other sizes the PyTorch
mirror drops the adaptive pooling too. Keras flattens HWC and torch CHW,
which permutes that Dense's rows but not its size. The input side must be
at least 32 (five halvings).
Weights are initialized with Keras' defaults, not torchvision's.
"""

import keras

from overlap_core.runtime import zoo
from tfoverlap.models import layers

_CLASSIFIER_WIDTH = 4096
_DROPOUT_RATE = 0.5


def build_vgg(name: str, config, *, image_size: int, num_classes: int,
              channels: int) -> keras.Model:
  """Builds a VGG without BatchNorm and without adaptive pooling.

  Layer names follow torchvision's module paths with "_" for "." (for example
  "features_28", "classifier_6"), so weights can be matched by name.

  Args:
    name: the model's name.
    config: output channels of each convolution, "M" for each pooling.
    image_size, num_classes, channels: as `build_model`'s.

  Returns:
    The model, as `build_model` returns it.
  """
  inputs = layers.image_input(image_size, channels)
  x = inputs
  # torchvision numbers every module of `features`, ReLUs included; keeping
  # its indices keeps the names matchable.
  index = 0
  for item in config:
    if item == "M":
      x = keras.layers.MaxPooling2D(2, name=f"features_{index}")(x)
      index += 1
    else:
      x = keras.layers.Conv2D(item, 3, padding="same", activation="relu",
                              name=f"features_{index}")(x)
      index += 2
  x = keras.layers.Flatten(name="flatten")(x)
  x = keras.layers.Dense(_CLASSIFIER_WIDTH, activation="relu",
                         name="classifier_0")(x)
  x = keras.layers.Dropout(_DROPOUT_RATE, name="classifier_2")(x)
  x = keras.layers.Dense(_CLASSIFIER_WIDTH, activation="relu",
                         name="classifier_3")(x)
  x = keras.layers.Dropout(_DROPOUT_RATE, name="classifier_5")(x)
  x = keras.layers.Dense(num_classes, name="classifier_6")(x)
  return keras.Model(inputs, layers.float32_output(x), name=name)


def build_vgg16(*, image_size: int, num_classes: int,
                channels: int) -> keras.Model:
  """VGG-16 (configuration D); arguments and result as `build_vgg`'s."""
  return build_vgg("vgg16", zoo.VGG_CONFIGS["vgg16"],
                   image_size=image_size, num_classes=num_classes,
                   channels=channels)


def build_vgg19(*, image_size: int, num_classes: int,
                channels: int) -> keras.Model:
  """VGG-19 (configuration E); arguments and result as `build_vgg`'s."""
  return build_vgg("vgg19", zoo.VGG_CONFIGS["vgg19"],
                   image_size=image_size, num_classes=num_classes,
                   channels=channels)
