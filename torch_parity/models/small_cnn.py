"""A small convolutional classifier, the model of the main training job.

Mirrors `tfoverlap.models.small_cnn`: two stages of two 3x3 convolutions
(padding 1, which is Keras' "same" at stride 1; with bias; ReLU; no
BatchNorm) of 32 then 64 filters, each stage followed by MaxPool2d(2) (floor,
as Keras' "valid" 2x2 pooling); then Flatten, Linear(64*(image_size//4)**2,
128) ReLU and Linear(128, num_classes). The head's size depends on
image_size exactly as the Keras Flatten head does. torch flattens CHW and
Keras HWC, which permutes fc1's input columns but not its size. The input
side must be at least 4 so that both poolings keep a pixel.
"""

import torch
from torch import nn
from torch.nn import functional as F

from torch_parity.models import layers

_STAGE_FILTERS = (32, 64)
_HIDDEN_UNITS = 128


class SmallCNN(nn.Module):
  """The small CNN; module names equal the Keras layer names."""

  def __init__(self, *, image_size: int, num_classes: int, channels: int):
    super().__init__()
    in_channels, side = channels, image_size
    for stage, filters in enumerate(_STAGE_FILTERS, start=1):
      for index in (1, 2):
        self.add_module(f"conv{stage}_{index}",
                        nn.Conv2d(in_channels, filters, 3, padding=1))
        in_channels = filters
      self.add_module(f"pool{stage}", nn.MaxPool2d(2))
      side //= 2
    self.flatten = nn.Flatten()
    self.fc1 = nn.Linear(in_channels * side * side, _HIDDEN_UNITS)
    self.fc2 = nn.Linear(_HIDDEN_UNITS, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    for stage in range(1, len(_STAGE_FILTERS) + 1):
      x = F.relu(getattr(self, f"conv{stage}_1")(x))
      x = F.relu(getattr(self, f"conv{stage}_2")(x))
      x = getattr(self, f"pool{stage}")(x)
    x = F.relu(self.fc1(self.flatten(x)))
    return layers.float32_output(self.fc2(x))


def build_small_cnn(*, image_size: int, num_classes: int,
                    channels: int) -> nn.Module:
  """Builds the small CNN; arguments and result as `build_model`'s."""
  return layers.apply_keras_init(
      SmallCNN(image_size=image_size, num_classes=num_classes,
               channels=channels))
