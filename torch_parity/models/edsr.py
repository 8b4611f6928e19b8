"""EDSR baseline for x2 super-resolution (Lim et al., 2017).

Mirrors `tfoverlap.models.edsr`: every convolution is 3x3, padding 1, with a
bias.
  head: conv channels -> 64;
  body: 16 residual blocks x + conv(ReLU(conv(x))) (no BatchNorm, residual
  scale 1), then conv 64 -> 64, plus the head output (global skip);
  upsampler: conv 64 -> 256, then PixelShuffle(2);
  tail: conv 64 -> channels.
Trainable parameters: 1,369,859 for RGB, independent of image_size.

The mean shift around the network (subtract the DIV2K RGB mean from the
[0, 1] input, add it back to the output) is a constant buffer, not a frozen
1x1 convolution as in the authors' EDSR-PyTorch, so it holds no parameters
and the count equals the Keras side's. For a channel count other than 3
every channel is shifted by the average of the three means.

PixelShuffle orders the upsampler's 256 channels (channel, row offset,
column offset) and Keras' depth_to_space (row offset, column offset,
channel): the same layer with its output filters permuted.
"""

import torch
from torch import nn

from torch_parity.models import layers

UPSCALE = 2  # equals overlap_core.runtime.zoo.MODELS["edsr"].upscale
_NUM_RESIDUAL_BLOCKS = 16
_NUM_FEATURES = 64
_DIV2K_RGB_MEAN = (0.4488, 0.4371, 0.4040)


def _conv(in_channels: int, out_channels: int) -> nn.Conv2d:
  return nn.Conv2d(in_channels, out_channels, 3, padding=1)


class ResidualBlock(nn.Module):
  """x + conv(ReLU(conv(x))); `body.0`, `body.2` as in EDSR-PyTorch."""

  def __init__(self, num_features: int):
    super().__init__()
    self.body = nn.Sequential(_conv(num_features, num_features),
                              nn.ReLU(inplace=True),
                              _conv(num_features, num_features))

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    # res_scale is 1 in the baseline, so there is no multiply.
    return x + self.body(x)


class EDSR(nn.Module):
  """EDSR; module paths equal the Keras layer names with "." for "_"."""

  def __init__(self, *, channels: int):
    super().__init__()
    # Not persistent: a constant of the architecture, not state to save.
    self.register_buffer(
        "rgb_mean", torch.tensor(_channel_mean(channels)).view(1, -1, 1, 1),
        persistent=False)
    self.head = _conv(channels, _NUM_FEATURES)
    self.body = nn.Sequential(
        *[ResidualBlock(_NUM_FEATURES) for _ in range(_NUM_RESIDUAL_BLOCKS)],
        _conv(_NUM_FEATURES, _NUM_FEATURES))
    self.tail = nn.Sequential(
        nn.Sequential(_conv(_NUM_FEATURES, _NUM_FEATURES * UPSCALE**2),
                      nn.PixelShuffle(UPSCALE)),
        _conv(_NUM_FEATURES, channels))

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    head = self.head(x - self.rgb_mean)
    x = self.tail(self.body(head) + head)
    # Added after the float32 cast: the mean carries more precision than the
    # mixed-precision residual it is added to.
    return layers.float32_output(x) + self.rgb_mean.float()


def build_edsr(*, image_size: int, num_classes: int,
               channels: int) -> nn.Module:
  """Builds the x2 EDSR baseline.

  Args:
    image_size: the HIGH-resolution output side in pixels, a multiple of 2;
      the input side is image_size // 2. The architecture does not depend
      on it.
    num_classes: ignored; the signature matches the classifiers'.
    channels: image channels, in and out.

  Returns:
    A module mapping float32 low-resolution images
    [B, channels, image_size // 2, image_size // 2] with values in [0, 1] to
    float32 high-resolution images [B, channels, image_size, image_size].
  """
  del image_size, num_classes  # fully convolutional; no classes
  return layers.apply_keras_init(EDSR(channels=channels))


def _channel_mean(channels: int):
  if channels == len(_DIV2K_RGB_MEAN):
    return _DIV2K_RGB_MEAN
  return (sum(_DIV2K_RGB_MEAN) / len(_DIV2K_RGB_MEAN),) * channels
