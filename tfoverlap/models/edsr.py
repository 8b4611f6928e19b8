"""EDSR baseline for x2 super-resolution (Lim et al., 2017).

Follows the paper's baseline model (the authors' EDSR-PyTorch `edsr.py` with
n_resblocks=16, n_feats=64, res_scale=1, scale=2): every convolution is 3x3
with "same" padding and a bias.
  head: conv channels -> 64;
  body: 16 residual blocks x + conv(ReLU(conv(x))) (64 -> 64, no BatchNorm,
  residual scale 1), then conv 64 -> 64, plus the head output (global skip);
  upsampler: conv 64 -> 256, then depth_to_space(2) (pixel shuffle);
  tail: conv 64 -> channels.
Trainable parameters: (channels*64*9 + 64) + 32*(64*64*9 + 64) +
(64*64*9 + 64) + (64*256*9 + 256) + (64*channels*9 + channels), 1,369,859 for
RGB, independent of image_size.

The mean shift around the network (subtract the DIV2K RGB mean
(0.4488, 0.4371, 0.4040) from the [0, 1] input, add it back to the output) is
a constant here, with no parameters. EDSR-PyTorch implements it as a frozen
1x1 `MeanShift` conv whose weight and bias still appear in
`model.parameters()`; the PyTorch mirror must use a constant too, or the
counts differ. For a channel count other than 3 every channel is shifted by
the average of the three means.

Two layout differences do not change any parameter count: Keras'
depth_to_space orders the 256 channels (row offset, column offset, channel)
while torch's PixelShuffle orders them (channel, row offset, column offset),
which permutes the upsampler's output filters; and initialization uses Keras'
defaults.
"""

import keras

from tfoverlap.models import layers

UPSCALE = 2  # equals overlap_core.runtime.zoo.MODELS["edsr"].upscale
_NUM_RESIDUAL_BLOCKS = 16
_NUM_FEATURES = 64
_DIV2K_RGB_MEAN = (0.4488, 0.4371, 0.4040)


def build_edsr(*, image_size: int, num_classes: int,
               channels: int) -> keras.Model:
  """Builds the x2 EDSR baseline.

  Args:
    image_size: the HIGH-resolution output side in pixels, a multiple of 2;
      the input side is image_size // 2.
    num_classes: ignored; the signature matches the classifiers'.
    channels: image channels, in and out.

  Returns:
    A model mapping float32 low-resolution images
    [B, image_size // 2, image_size // 2, channels] with values in [0, 1] to
    float32 high-resolution images [B, image_size, image_size, channels].
  """
  del num_classes  # a super-resolution model has none
  mean = _channel_mean(channels)
  low_res_size = image_size // UPSCALE
  inputs = keras.layers.Input((low_res_size, low_res_size, channels))
  x = keras.layers.Rescaling(1.0, offset=[-m for m in mean],
                             name="sub_mean")(inputs)
  head = _conv(x, _NUM_FEATURES, name="head")
  x = head
  for index in range(_NUM_RESIDUAL_BLOCKS):
    x = _residual_block(x, name=f"body_{index}")
  x = _conv(x, _NUM_FEATURES, name=f"body_{_NUM_RESIDUAL_BLOCKS}")
  x = keras.layers.Add(name="global_skip")([x, head])
  x = _conv(x, _NUM_FEATURES * UPSCALE**2, name="tail_0_0")
  x = keras.ops.depth_to_space(x, UPSCALE)
  x = _conv(x, channels, name="tail_1")
  x = layers.float32_output(x)
  # Added after the float32 cast: the mean carries more precision than the
  # mixed-precision residual it is added to.
  outputs = keras.layers.Rescaling(1.0, offset=list(mean), dtype="float32",
                                   name="add_mean")(x)
  return keras.Model(inputs, outputs, name="edsr")


def _conv(x, filters: int, name: str):
  return keras.layers.Conv2D(filters, 3, padding="same", name=name)(x)


def _residual_block(x, name: str):
  y = _conv(x, _NUM_FEATURES, name=name + "_body_0")
  y = keras.layers.ReLU(name=name + "_body_1")(y)
  y = _conv(y, _NUM_FEATURES, name=name + "_body_2")
  # res_scale is 1 in the baseline, so there is no multiply.
  return keras.layers.Add(name=name + "_add")([x, y])


def _channel_mean(channels: int):
  if channels == len(_DIV2K_RGB_MEAN):
    return _DIV2K_RGB_MEAN
  return (sum(_DIV2K_RGB_MEAN) / len(_DIV2K_RGB_MEAN),) * channels
