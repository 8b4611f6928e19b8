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

_BUILDERS = {
    "mlp": mlp.build_mlp,
    "small_cnn": small_cnn.build_small_cnn,
    "resnet18": resnet.build_resnet18,
    "resnet50": resnet.build_resnet50,
    "vgg16": vgg.build_vgg16,
    "vgg19": vgg.build_vgg19,
    "inception_v3": inception.build_inception_v3,
    "wide_resnet26_2": resnet.build_wide_resnet26_2,
    "wide_resnet50_2": resnet.build_wide_resnet50_2,
    "wide_resnet101_2": resnet.build_wide_resnet101_2,
    "edsr": edsr.build_edsr,
}


def build_model(name: str, *, image_size: int, num_classes: int,
                channels: int = 3) -> keras.Model:
  """Builds the zoo model `name` under the current Keras dtype policy.

  Args:
    name: one of `overlap_core.runtime.zoo.MODEL_NAMES`.
    image_size: the input side in pixels for a classifier; for "edsr" the
      HIGH-resolution output side (the input side is image_size // 2).
    num_classes: number of logits; ignored by "edsr".
    channels: image channels.

  Returns:
    A functional `keras.Model`, weights created, whose output is float32.

  Raises:
    ValueError: naming the argument, the value received and what is allowed,
      for an unknown name, an image_size below the model's minimum or not a
      multiple of its upscale factor, or a non-positive num_classes or
      channels.
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
