"""A multilayer perceptron, the zoo's smallest classifier.

Mirrors `tfoverlap.models.mlp`: Flatten, Linear(C*H*W, 512) ReLU,
Linear(512, 256) ReLU, Linear(256, num_classes), all with bias, so the
trainable parameters are (C*H*W*512 + 512) + (512*256 + 256) +
(256*num_classes + num_classes) in both frameworks. torch flattens CHW and
Keras HWC, which permutes fc1's input columns but not its size.
"""

import torch
from torch import nn
from torch.nn import functional as F

from torch_parity.models import layers


class MLP(nn.Module):
  """The MLP classifier; module names equal the Keras layer names."""

  def __init__(self, *, image_size: int, num_classes: int, channels: int):
    super().__init__()
    self.flatten = nn.Flatten()
    self.fc1 = nn.Linear(channels * image_size * image_size, 512)
    self.fc2 = nn.Linear(512, 256)
    self.fc3 = nn.Linear(256, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.flatten(x)
    x = F.relu(self.fc1(x))
    x = F.relu(self.fc2(x))
    return layers.float32_output(self.fc3(x))


def build_mlp(*, image_size: int, num_classes: int, channels: int) -> nn.Module:
  """Builds the MLP classifier; arguments and result as `build_model`'s."""
  return layers.apply_keras_init(
      MLP(image_size=image_size, num_classes=num_classes, channels=channels))
