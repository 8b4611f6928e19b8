"""VGG-16 and VGG-19 (configurations D and E, no BatchNorm), as the Keras zoo
defines them.

Mirrors `tfoverlap.models.vgg`: `features` is 3x3 convolutions (padding 1,
with bias, ReLU) of 64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512,
M, 512, 512, 512, M (VGG-16; VGG-19 has four convolutions in each of the
last three stages), where M is MaxPool2d(2); `classifier` is Linear(4096)
ReLU Dropout(0.5), Linear(4096) ReLU Dropout(0.5), Linear(num_classes).
Like the Keras side, and unlike torchvision, there is no AdaptiveAvgPool2d
to 7x7: the final (image_size // 32)^2 map is flattened as it is, so the
first Linear has 512 * (image_size // 32)^2 inputs. At 224 the two layouts
coincide (138,357,544 trainable parameters for VGG-16 and 143,667,240 for
VGG-19 at 1000 classes). torch flattens CHW and Keras HWC, which permutes
that Linear's input columns but not its size. The input side must be at
least 32 (five halvings).
"""

import torch
from torch import nn

from overlap_core.runtime import zoo
from torch_parity.models import layers

_CLASSIFIER_WIDTH = 4096
_DROPOUT_RATE = 0.5


class VGG(nn.Module):
  """VGG of one configuration; `features.i` and `classifier.i` are Keras'
  `features_i`, ..."""

  def __init__(self, config, *, image_size: int, num_classes: int,
               channels: int):
    super().__init__()
    modules, in_channels, side = [], channels, image_size
    for item in config:
      if item == "M":
        modules.append(nn.MaxPool2d(2))
        side //= 2
      else:
        modules += [nn.Conv2d(in_channels, item, 3, padding=1),
                    nn.ReLU(inplace=True)]
        in_channels = item
    self.features = nn.Sequential(*modules)
    self.flatten = nn.Flatten()
    self.classifier = nn.Sequential(
        nn.Linear(in_channels * side * side, _CLASSIFIER_WIDTH),
        nn.ReLU(inplace=True),
        nn.Dropout(_DROPOUT_RATE),
        nn.Linear(_CLASSIFIER_WIDTH, _CLASSIFIER_WIDTH),
        nn.ReLU(inplace=True),
        nn.Dropout(_DROPOUT_RATE),
        nn.Linear(_CLASSIFIER_WIDTH, num_classes),
    )

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.flatten(self.features(x))
    return layers.float32_output(self.classifier(x))


def build_vgg16(*, image_size: int, num_classes: int,
                channels: int) -> nn.Module:
  """Builds VGG-16 (configuration D) without BatchNorm and without adaptive
  pooling; arguments and result as `build_model`'s."""
  return layers.apply_keras_init(
      VGG(zoo.VGG_CONFIGS["vgg16"], image_size=image_size,
          num_classes=num_classes, channels=channels))


def build_vgg19(*, image_size: int, num_classes: int,
                channels: int) -> nn.Module:
  """VGG-19 (configuration E); arguments and result as `build_vgg16`'s."""
  return layers.apply_keras_init(
      VGG(zoo.VGG_CONFIGS["vgg19"], image_size=image_size,
          num_classes=num_classes, channels=channels))
