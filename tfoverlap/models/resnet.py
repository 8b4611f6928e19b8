"""ResNets and wide ResNets, as torchvision.models.resnet defines them.

Follows torchvision's `ResNet` (v1.5: in a Bottleneck the stride sits on the
3x3 convolution, not the first 1x1) layer for layer, as its PyTorch mirror
`torch_parity.models.resnet` does:
  stem: conv 7x7/2 pad 3 (no bias), BN, ReLU, max pool 3x3/2 pad 1;
  four stages of 64, 128, 256, 512 planes, strides 1, 2, 2, 2; a block's
  shortcut is conv 1x1/stride (no bias) + BN when its stride is not 1 or its
  channel count changes, identity otherwise;
  head: global average pooling, Dense(num_classes) with bias.
Every convolution has no bias and is followed by BatchNorm (trainable scale
and offset, epsilon 1e-5, torch momentum 0.1 = Keras 0.9).

  resnet18:         BasicBlock [2, 2, 2, 2]
  resnet50:         Bottleneck [3, 4, 6, 3], width_per_group 64
  wide_resnet26_2:  Bottleneck [2, 2, 2, 2], width_per_group 128
  wide_resnet50_2:  Bottleneck [3, 4, 6, 3], width_per_group 128
  wide_resnet101_2: Bottleneck [3, 4, 23, 3], width_per_group 128

A wide Bottleneck's inner 1x1/3x3 width is planes * width_per_group / 64; its
output stays planes * 4. wide_resnet26_2 is not in torchvision; it is
torchvision's `ResNet(Bottleneck, [2, 2, 2, 2], width_per_group=128)`.
Trainable parameters at 224 and 1000 classes equal torchvision's:
resnet18 11,689,512; resnet50 25,557,032; wide_resnet50_2 68,883,240;
wide_resnet101_2 126,886,696. The count does not depend on image_size, and
any side >= 1 is accepted (every padded stride keeps at least one pixel).
Weights are initialized with Keras' defaults, not torchvision's.
"""

import keras

from tfoverlap.models import layers

_BOTTLENECK_EXPANSION = 4
_STAGE_PLANES = (64, 128, 256, 512)
_STAGE_STRIDES = (1, 2, 2, 2)


def build_resnet18(*, image_size: int, num_classes: int,
                   channels: int) -> keras.Model:
  """Builds torchvision's resnet18; see `build_resnet` for the arguments."""
  return build_resnet("resnet18", bottleneck=False,
                      blocks_per_stage=(2, 2, 2, 2),
                      image_size=image_size, num_classes=num_classes,
                      channels=channels)


def build_resnet50(*, image_size: int, num_classes: int,
                   channels: int) -> keras.Model:
  """Builds torchvision's resnet50; see `build_resnet` for the arguments."""
  return build_resnet("resnet50", bottleneck=True,
                      blocks_per_stage=(3, 4, 6, 3),
                      image_size=image_size, num_classes=num_classes,
                      channels=channels)


def build_wide_resnet26_2(*, image_size: int, num_classes: int,
                          channels: int) -> keras.Model:
  """Builds a 26-layer wide ResNet; see `build_resnet` for the arguments."""
  return build_resnet("wide_resnet26_2", bottleneck=True,
                      blocks_per_stage=(2, 2, 2, 2), width_per_group=128,
                      image_size=image_size, num_classes=num_classes,
                      channels=channels)


def build_wide_resnet50_2(*, image_size: int, num_classes: int,
                          channels: int) -> keras.Model:
  """Builds torchvision's wide_resnet50_2; see `build_resnet`."""
  return build_resnet("wide_resnet50_2", bottleneck=True,
                      blocks_per_stage=(3, 4, 6, 3), width_per_group=128,
                      image_size=image_size, num_classes=num_classes,
                      channels=channels)


def build_wide_resnet101_2(*, image_size: int, num_classes: int,
                           channels: int) -> keras.Model:
  """Builds torchvision's wide_resnet101_2; see `build_resnet`."""
  return build_resnet("wide_resnet101_2", bottleneck=True,
                      blocks_per_stage=(3, 4, 23, 3), width_per_group=128,
                      image_size=image_size, num_classes=num_classes,
                      channels=channels)


def build_resnet(name: str, *, bottleneck: bool, blocks_per_stage,
                 width_per_group: int = 64, image_size: int, num_classes: int,
                 channels: int) -> keras.Model:
  """Builds a ResNet with torchvision's layout.

  Layer names follow torchvision's module paths with "_" for "." (for example
  "layer2_0_downsample_0"), so weights can be matched by name.

  Args:
    name: the model name.
    bottleneck: Bottleneck blocks (1x1, 3x3, 1x1; expansion 4) if True,
      BasicBlocks (3x3, 3x3; expansion 1) otherwise.
    blocks_per_stage: number of blocks in each of the four stages.
    width_per_group: a Bottleneck's inner width per 64 planes (torchvision's
      `width_per_group`); 64 is a plain ResNet, 128 a "_2" wide one.
    image_size, num_classes, channels: as `build_model`'s.

  Returns:
    The model, as `build_model` returns it.

  Raises:
    ValueError: if width_per_group is set for BasicBlocks, which torchvision
      does not support either.
  """
  if not bottleneck and width_per_group != 64:
    raise ValueError(f"width_per_group={width_per_group}: BasicBlock ResNets "
                     "allow only 64")
  inputs = keras.layers.Input((image_size, image_size, channels))
  x = layers.torch_conv(inputs, 64, 7, strides=2, padding=3, use_bias=False,
                        name="conv1")
  x = layers.batch_norm(x, name="bn1")
  x = keras.layers.ReLU(name="relu")(x)
  x = layers.torch_max_pool(x, 3, strides=2, padding=1, name="maxpool")
  for stage, (planes, stage_stride, num_blocks) in enumerate(
      zip(_STAGE_PLANES, _STAGE_STRIDES, blocks_per_stage), start=1):
    for index in range(num_blocks):
      block_name = f"layer{stage}_{index}"
      strides = stage_stride if index == 0 else 1
      if bottleneck:
        x = _bottleneck_block(x, planes, strides, width_per_group, block_name)
      else:
        x = _basic_block(x, planes, strides, block_name)
  x = keras.layers.GlobalAveragePooling2D(name="avgpool")(x)
  x = keras.layers.Dense(num_classes, name="fc")(x)
  return keras.Model(inputs, layers.float32_output(x), name=name)


def _basic_block(x, planes: int, strides: int, name: str):
  shortcut = _shortcut(x, planes, strides, name)
  y = layers.torch_conv(x, planes, 3, strides=strides, padding=1,
                        use_bias=False, name=name + "_conv1")
  y = layers.batch_norm(y, name=name + "_bn1")
  y = keras.layers.ReLU(name=name + "_relu1")(y)
  y = layers.torch_conv(y, planes, 3, padding=1, use_bias=False,
                        name=name + "_conv2")
  y = layers.batch_norm(y, name=name + "_bn2")
  y = keras.layers.Add(name=name + "_add")([y, shortcut])
  return keras.layers.ReLU(name=name + "_out")(y)


def _bottleneck_block(x, planes: int, strides: int, width_per_group: int,
                      name: str):
  width = planes * width_per_group // 64
  shortcut = _shortcut(x, planes * _BOTTLENECK_EXPANSION, strides, name)
  y = layers.torch_conv(x, width, 1, use_bias=False, name=name + "_conv1")
  y = layers.batch_norm(y, name=name + "_bn1")
  y = keras.layers.ReLU(name=name + "_relu1")(y)
  # v1.5: striding the 3x3 instead of the 1x1 discards no input pixels.
  y = layers.torch_conv(y, width, 3, strides=strides, padding=1,
                        use_bias=False, name=name + "_conv2")
  y = layers.batch_norm(y, name=name + "_bn2")
  y = keras.layers.ReLU(name=name + "_relu2")(y)
  y = layers.torch_conv(y, planes * _BOTTLENECK_EXPANSION, 1, use_bias=False,
                        name=name + "_conv3")
  y = layers.batch_norm(y, name=name + "_bn3")
  y = keras.layers.Add(name=name + "_add")([y, shortcut])
  return keras.layers.ReLU(name=name + "_out")(y)


def _shortcut(x, out_channels: int, strides: int, name: str):
  """The identity, or torchvision's `downsample` where the shape changes."""
  if strides == 1 and x.shape[-1] == out_channels:
    return x
  x = layers.torch_conv(x, out_channels, 1, strides=strides, use_bias=False,
                        name=name + "_downsample_0")
  return layers.batch_norm(x, name=name + "_downsample_1")
