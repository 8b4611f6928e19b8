"""ResNets and wide ResNets, as the Keras zoo (after torchvision) defines them.

Mirrors `tfoverlap.models.resnet` layer for layer (ResNet v1.5: in a
Bottleneck the stride sits on the 3x3 convolution):
  stem: conv 7x7/2 pad 3 (no bias), BN, ReLU, max pool 3x3/2 pad 1;
  four stages of 64, 128, 256, 512 planes, strides 1, 2, 2, 2; a block's
  shortcut is conv 1x1/stride (no bias) + BN when its stride is not 1 or its
  channel count changes, identity otherwise;
  head: global average pooling, Linear(num_classes) with bias.
Every convolution has no bias and is followed by BatchNorm (eps 1e-5,
momentum 0.1).

  resnet18:         BasicBlock [2, 2, 2, 2]
  resnet50:         Bottleneck [3, 4, 6, 3], width_per_group 64
  wide_resnet26_2:  Bottleneck [2, 2, 2, 2], width_per_group 128
  wide_resnet50_2:  Bottleneck [3, 4, 6, 3], width_per_group 128
  wide_resnet101_2: Bottleneck [3, 4, 23, 3], width_per_group 128

Trainable parameters equal the Keras side's (and torchvision's) and do not
depend on image_size; any side >= 1 is accepted.
"""

import torch
from torch import nn
from torch.nn import functional as F

from torch_parity.models import layers

_BOTTLENECK_EXPANSION = 4
_STAGE_PLANES = (64, 128, 256, 512)
_STAGE_STRIDES = (1, 2, 2, 2)


def _downsample(in_channels: int, out_channels: int,
                stride: int) -> nn.Module | None:
  """The shortcut projection where a block changes shape, else None."""
  if stride == 1 and in_channels == out_channels:
    return None
  return nn.Sequential(
      nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
      layers.batch_norm(out_channels))


class BasicBlock(nn.Module):
  """Two 3x3 convolutions with BN and a shortcut (expansion 1)."""

  def __init__(self, in_channels: int, planes: int, stride: int):
    super().__init__()
    self.conv1 = nn.Conv2d(in_channels, planes, 3, stride=stride, padding=1,
                           bias=False)
    self.bn1 = layers.batch_norm(planes)
    self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
    self.bn2 = layers.batch_norm(planes)
    self.downsample = _downsample(in_channels, planes, stride)
    self.out_channels = planes

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    shortcut = x if self.downsample is None else self.downsample(x)
    y = F.relu(self.bn1(self.conv1(x)))
    y = self.bn2(self.conv2(y))
    return F.relu(y + shortcut)


class Bottleneck(nn.Module):
  """1x1, 3x3 (strided), 1x1 convolutions with BN and a shortcut."""

  def __init__(self, in_channels: int, planes: int, stride: int,
               width_per_group: int):
    super().__init__()
    width = planes * width_per_group // 64
    out_channels = planes * _BOTTLENECK_EXPANSION
    self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
    self.bn1 = layers.batch_norm(width)
    self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1,
                           bias=False)
    self.bn2 = layers.batch_norm(width)
    self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
    self.bn3 = layers.batch_norm(out_channels)
    self.downsample = _downsample(in_channels, out_channels, stride)
    self.out_channels = out_channels

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    shortcut = x if self.downsample is None else self.downsample(x)
    y = F.relu(self.bn1(self.conv1(x)))
    y = F.relu(self.bn2(self.conv2(y)))
    y = self.bn3(self.conv3(y))
    return F.relu(y + shortcut)


class ResNet(nn.Module):
  """A ResNet; module paths equal the Keras layer names with "." for "_"."""

  def __init__(self, *, bottleneck: bool, blocks_per_stage,
               width_per_group: int, num_classes: int, channels: int):
    super().__init__()
    self.conv1 = nn.Conv2d(channels, 64, 7, stride=2, padding=3, bias=False)
    self.bn1 = layers.batch_norm(64)
    self.relu = nn.ReLU(inplace=True)
    self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
    in_channels = 64
    for stage, (planes, stage_stride, num_blocks) in enumerate(
        zip(_STAGE_PLANES, _STAGE_STRIDES, blocks_per_stage), start=1):
      blocks = []
      for index in range(num_blocks):
        stride = stage_stride if index == 0 else 1
        if bottleneck:
          block = Bottleneck(in_channels, planes, stride, width_per_group)
        else:
          block = BasicBlock(in_channels, planes, stride)
        blocks.append(block)
        in_channels = block.out_channels
      self.add_module(f"layer{stage}", nn.Sequential(*blocks))
    self.avgpool = nn.AdaptiveAvgPool2d(1)
    self.fc = nn.Linear(in_channels, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
    x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
    x = torch.flatten(self.avgpool(x), 1)
    return layers.float32_output(self.fc(x))


def build_resnet(*, bottleneck: bool, blocks_per_stage,
                 width_per_group: int = 64, image_size: int, num_classes: int,
                 channels: int) -> nn.Module:
  """Builds a ResNet with torchvision's layout.

  Args:
    bottleneck: Bottleneck blocks (1x1, 3x3, 1x1; expansion 4) if True,
      BasicBlocks (3x3, 3x3; expansion 1) otherwise.
    blocks_per_stage: number of blocks in each of the four stages.
    width_per_group: a Bottleneck's inner width per 64 planes; 64 is a plain
      ResNet, 128 a "_2" wide one.
    image_size, num_classes, channels: as `build_model`'s; the architecture
      does not depend on image_size.

  Returns:
    The module, as `build_model` returns it.

  Raises:
    ValueError: if width_per_group is set for BasicBlocks, which the Keras
      side (and torchvision) refuse too.
  """
  del image_size  # global average pooling makes the head size-independent
  if not bottleneck and width_per_group != 64:
    raise ValueError(f"width_per_group={width_per_group}: BasicBlock ResNets "
                     "allow only 64")
  return layers.apply_keras_init(
      ResNet(bottleneck=bottleneck, blocks_per_stage=tuple(blocks_per_stage),
             width_per_group=width_per_group, num_classes=num_classes,
             channels=channels))


def build_resnet18(*, image_size: int, num_classes: int,
                   channels: int) -> nn.Module:
  """Builds resnet18; see `build_resnet` for the arguments."""
  return build_resnet(bottleneck=False, blocks_per_stage=(2, 2, 2, 2),
                      image_size=image_size, num_classes=num_classes,
                      channels=channels)


def build_resnet50(*, image_size: int, num_classes: int,
                   channels: int) -> nn.Module:
  """Builds resnet50; see `build_resnet` for the arguments."""
  return build_resnet(bottleneck=True, blocks_per_stage=(3, 4, 6, 3),
                      image_size=image_size, num_classes=num_classes,
                      channels=channels)


def build_wide_resnet26_2(*, image_size: int, num_classes: int,
                          channels: int) -> nn.Module:
  """Builds the 26-layer wide ResNet; see `build_resnet`."""
  return build_resnet(bottleneck=True, blocks_per_stage=(2, 2, 2, 2),
                      width_per_group=128, image_size=image_size,
                      num_classes=num_classes, channels=channels)


def build_wide_resnet50_2(*, image_size: int, num_classes: int,
                          channels: int) -> nn.Module:
  """Builds wide_resnet50_2; see `build_resnet`."""
  return build_resnet(bottleneck=True, blocks_per_stage=(3, 4, 6, 3),
                      width_per_group=128, image_size=image_size,
                      num_classes=num_classes, channels=channels)


def build_wide_resnet101_2(*, image_size: int, num_classes: int,
                           channels: int) -> nn.Module:
  """Builds wide_resnet101_2; see `build_resnet`."""
  return build_resnet(bottleneck=True, blocks_per_stage=(3, 4, 23, 3),
                      width_per_group=128, image_size=image_size,
                      num_classes=num_classes, channels=channels)
