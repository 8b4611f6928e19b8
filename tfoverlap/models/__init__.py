"""The Keras model zoo: one builder per name of `overlap_core.runtime.zoo`.

Every model is a channels-last Keras 3 functional model whose output is
float32 under any mixed precision policy. Classifiers map
[B, image_size, image_size, channels] images to logits [B, num_classes] (no
softmax); "edsr" maps [B, image_size // 2, image_size // 2, channels]
low-resolution images to [B, image_size, image_size, channels].

Each architecture is mirrored 1:1 by the PyTorch side with the same trainable
parameter count (`num_params` here equals torch's
`sum(p.numel() for p in model.parameters())` there); each module's docstring
names the reference it follows and any deviation from it.

Usage:

  model = build_model("resnet18", image_size=32, num_classes=10)
  logits = model(images, training=True)
"""

import math

import keras

from overlap_core.runtime import zoo
from tfoverlap.models import edsr
from tfoverlap.models import inception
from tfoverlap.models import mlp
from tfoverlap.models import resnet
from tfoverlap.models import small_cnn
from tfoverlap.models import vgg

_BUILDERS = zoo.collect_builders(
    (edsr, inception, mlp, resnet, small_cnn, vgg))


def build_model(name: str, *, image_size: int, num_classes: int,
                channels: int = 3) -> keras.Model:
  """Builds the zoo model `name` under the current Keras dtype policy.

  Args:
    name, image_size, num_classes, channels: as
      `overlap_core.runtime.zoo.validate_model_args` checks them ("edsr"
      ignores num_classes).

  Returns:
    A functional `keras.Model`, weights created, whose output is float32.

  Raises:
    ValueError: what `zoo.validate_model_args` raises for a bad request.
  """
  zoo.validate_model_args(name, image_size=image_size,
                          num_classes=num_classes, channels=channels)
  return _BUILDERS[name](image_size=image_size, num_classes=num_classes,
                         channels=channels)


def num_params(model) -> int:
  """Counts the trainable parameters of a Keras model.

  BatchNorm's moving mean and variance are not trainable and not counted, as
  torch keeps them in buffers rather than in `parameters()`.

  Args:
    model: a `keras.Model` (or layer) whose weights exist.

  Returns:
    The number of scalars in `model.trainable_weights`.
  """
  return sum(math.prod(weight.shape) for weight in model.trainable_weights)
