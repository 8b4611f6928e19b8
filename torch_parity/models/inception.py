"""Inception v3 without auxiliary logits, as the Keras zoo defines it.

Mirrors `tfoverlap.models.inception` (torchvision's
`Inception3(aux_logits=False, transform_input=False)` layout) module for
module: every convolution is a `BasicConv2d` (conv without bias, BatchNorm
with eps 1e-3, ReLU) with the same kernel shapes, strides and zero padding;
the branch average pools are 3x3/1 with padding 1 counted in the mean
(count_include_pad=True, which the Keras side pads explicitly to match);
the head is global average pooling, Dropout(0.5), Linear(num_classes).
Trainable parameters at 1000 classes: 23,834,568, independent of image_size.
The input side must be at least 75.
"""

import torch
from torch import nn
from torch.nn import functional as F

from torch_parity.models import layers

_BN_EPSILON = 1e-3  # the Keras side's (and torchvision's) BasicConv2d
_DROPOUT_RATE = 0.5


class BasicConv2d(nn.Module):
  """Conv (no bias), BatchNorm (eps 1e-3), ReLU."""

  def __init__(self, in_channels: int, out_channels: int, kernel_size,
               stride: int = 1, padding=0):
    super().__init__()
    self.conv = nn.Conv2d(in_channels, out_channels, kernel_size,
                          stride=stride, padding=padding, bias=False)
    self.bn = layers.batch_norm(out_channels, eps=_BN_EPSILON)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return F.relu(self.bn(self.conv(x)), inplace=True)


def _avg_pool_3x3(x: torch.Tensor) -> torch.Tensor:
  return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=True)


def _max_pool_3x3_2(x: torch.Tensor) -> torch.Tensor:
  return F.max_pool2d(x, 3, stride=2)


class InceptionA(nn.Module):
  """35x35 block: 1x1, 5x5, double 3x3 and pooled branches."""

  def __init__(self, in_channels: int, pool_features: int):
    super().__init__()
    self.branch1x1 = BasicConv2d(in_channels, 64, 1)
    self.branch5x5_1 = BasicConv2d(in_channels, 48, 1)
    self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
    self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, 1)
    self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
    self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
    self.branch_pool = BasicConv2d(in_channels, pool_features, 1)
    self.out_channels = 64 + 64 + 96 + pool_features

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    branch1x1 = self.branch1x1(x)
    branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
    branch3x3dbl = self.branch3x3dbl_3(
        self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
    branch_pool = self.branch_pool(_avg_pool_3x3(x))
    return torch.cat([branch1x1, branch5x5, branch3x3dbl, branch_pool], 1)


class InceptionB(nn.Module):
  """35x35 -> 17x17 reduction."""

  def __init__(self, in_channels: int):
    super().__init__()
    self.branch3x3 = BasicConv2d(in_channels, 384, 3, stride=2)
    self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, 1)
    self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
    self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)
    self.out_channels = 384 + 96 + in_channels

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    branch3x3 = self.branch3x3(x)
    branch3x3dbl = self.branch3x3dbl_3(
        self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
    return torch.cat([branch3x3, branch3x3dbl, _max_pool_3x3_2(x)], 1)


class InceptionC(nn.Module):
  """17x17 block with factorized 7x7 convolutions."""

  def __init__(self, in_channels: int, channels_7x7: int):
    super().__init__()
    c7 = channels_7x7
    self.branch1x1 = BasicConv2d(in_channels, 192, 1)
    self.branch7x7_1 = BasicConv2d(in_channels, c7, 1)
    self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
    self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
    self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, 1)
    self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
    self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
    self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
    self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
    self.branch_pool = BasicConv2d(in_channels, 192, 1)
    self.out_channels = 4 * 192

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    branch1x1 = self.branch1x1(x)
    branch7x7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
    branch7x7dbl = x
    for index in range(1, 6):
      branch7x7dbl = getattr(self, f"branch7x7dbl_{index}")(branch7x7dbl)
    branch_pool = self.branch_pool(_avg_pool_3x3(x))
    return torch.cat([branch1x1, branch7x7, branch7x7dbl, branch_pool], 1)


class InceptionD(nn.Module):
  """17x17 -> 8x8 reduction."""

  def __init__(self, in_channels: int):
    super().__init__()
    self.branch3x3_1 = BasicConv2d(in_channels, 192, 1)
    self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
    self.branch7x7x3_1 = BasicConv2d(in_channels, 192, 1)
    self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
    self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
    self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)
    self.out_channels = 320 + 192 + in_channels

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    branch3x3 = self.branch3x3_2(self.branch3x3_1(x))
    branch7x7x3 = x
    for index in range(1, 5):
      branch7x7x3 = getattr(self, f"branch7x7x3_{index}")(branch7x7x3)
    return torch.cat([branch3x3, branch7x7x3, _max_pool_3x3_2(x)], 1)


class InceptionE(nn.Module):
  """8x8 block whose 3x3 branches split into parallel 1x3 and 3x1."""

  def __init__(self, in_channels: int):
    super().__init__()
    self.branch1x1 = BasicConv2d(in_channels, 320, 1)
    self.branch3x3_1 = BasicConv2d(in_channels, 384, 1)
    self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
    self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
    self.branch3x3dbl_1 = BasicConv2d(in_channels, 448, 1)
    self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
    self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
    self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
    self.branch_pool = BasicConv2d(in_channels, 192, 1)
    self.out_channels = 320 + 2 * 384 + 2 * 384 + 192

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    branch1x1 = self.branch1x1(x)
    branch3x3 = self.branch3x3_1(x)
    branch3x3 = torch.cat([self.branch3x3_2a(branch3x3),
                           self.branch3x3_2b(branch3x3)], 1)
    branch3x3dbl = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
    branch3x3dbl = torch.cat([self.branch3x3dbl_3a(branch3x3dbl),
                              self.branch3x3dbl_3b(branch3x3dbl)], 1)
    branch_pool = self.branch_pool(_avg_pool_3x3(x))
    return torch.cat([branch1x1, branch3x3, branch3x3dbl, branch_pool], 1)


class InceptionV3(nn.Module):
  """Inception v3; module paths equal the Keras layer names with "." for "_".

  For example the Keras layer "Mixed_6b_branch7x7_2_conv" is the module
  `Mixed_6b.branch7x7_2.conv` here.
  """

  def __init__(self, *, num_classes: int, channels: int):
    super().__init__()
    self.Conv2d_1a_3x3 = BasicConv2d(channels, 32, 3, stride=2)
    self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
    self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
    self.maxpool1 = nn.MaxPool2d(3, stride=2)
    self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
    self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
    self.maxpool2 = nn.MaxPool2d(3, stride=2)
    self.Mixed_5b = InceptionA(192, pool_features=32)
    self.Mixed_5c = InceptionA(self.Mixed_5b.out_channels, pool_features=64)
    self.Mixed_5d = InceptionA(self.Mixed_5c.out_channels, pool_features=64)
    self.Mixed_6a = InceptionB(self.Mixed_5d.out_channels)
    self.Mixed_6b = InceptionC(self.Mixed_6a.out_channels, channels_7x7=128)
    self.Mixed_6c = InceptionC(self.Mixed_6b.out_channels, channels_7x7=160)
    self.Mixed_6d = InceptionC(self.Mixed_6c.out_channels, channels_7x7=160)
    self.Mixed_6e = InceptionC(self.Mixed_6d.out_channels, channels_7x7=192)
    self.Mixed_7a = InceptionD(self.Mixed_6e.out_channels)
    self.Mixed_7b = InceptionE(self.Mixed_7a.out_channels)
    self.Mixed_7c = InceptionE(self.Mixed_7b.out_channels)
    self.avgpool = nn.AdaptiveAvgPool2d(1)
    self.dropout = nn.Dropout(_DROPOUT_RATE)
    self.fc = nn.Linear(self.Mixed_7c.out_channels, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
    x = self.maxpool1(x)
    x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
    for block in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b",
                  "7c"):
      x = getattr(self, f"Mixed_{block}")(x)
    x = self.dropout(torch.flatten(self.avgpool(x), 1))
    return layers.float32_output(self.fc(x))


def build_inception_v3(*, image_size: int, num_classes: int,
                       channels: int) -> nn.Module:
  """Builds Inception v3 without auxiliary logits; arguments and result as
  `build_model`'s (the architecture does not depend on image_size)."""
  del image_size  # global average pooling makes the head size-independent
  return layers.apply_keras_init(
      InceptionV3(num_classes=num_classes, channels=channels))
