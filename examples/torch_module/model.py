"""The model: a small convolutional classifier, as a plain nn.Module.

`torch.fx` traces its forward (no branch on a tensor's value), so the
planner can read its graph and cut it between any two of its layers.
"""

from torch import nn


class Net(nn.Module):
  """Two convolution blocks and a linear head: images [B, C, S, S] in,
  logits [B, classes] out."""

  def __init__(self, channels: int, num_classes: int, width: int = 16):
    super().__init__()
    self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
    self.relu1 = nn.ReLU()
    self.pool1 = nn.MaxPool2d(2)
    self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
    self.relu2 = nn.ReLU()
    self.pool2 = nn.AdaptiveAvgPool2d(1)
    self.flatten = nn.Flatten()
    self.head = nn.Linear(2 * width, num_classes)

  def forward(self, x):
    x = self.pool1(self.relu1(self.conv1(x)))
    x = self.pool2(self.relu2(self.conv2(x)))
    return self.head(self.flatten(x))


def build(channels, num_classes):
  """The trainer passes these two by keyword, because the signature names
  them; it returns the module alone, so the task is classification."""
  return Net(channels, num_classes)
