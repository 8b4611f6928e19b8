"""Building blocks shared by the Keras zoo, shaped like their PyTorch twins.

The zoo is mirrored 1:1 in PyTorch, so a block here takes the arguments its
torch counterpart takes (torch-style `padding`, BatchNorm epsilon) and produces
the same output size and the same trainable parameters.
"""

import keras

# torch's BatchNorm2d momentum=0.1 weights the NEW batch statistic by 0.1;
# Keras' momentum weights the OLD moving value, so the same update is 0.9.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5  # torch's BatchNorm2d default


def image_input(image_size: int, channels: int):
  """The input of a classifier: [B, image_size, image_size, channels] images."""
  return keras.layers.Input((image_size, image_size, channels))


def torch_conv(x, filters: int, kernel_size, *, strides: int = 1, padding=0,
               use_bias: bool = True, name: str):
  """A Conv2D that pads like torch's `nn.Conv2d(padding=...)`.

  Keras' "same" pads the extra row/column at the bottom/right when a strided
  convolution needs an odd total padding, while torch pads symmetrically; the
  windows then sit one pixel apart. Explicit zero padding keeps both sides on
  the same pixels. A stride-1 convolution padded by kernel//2 on every side is
  exactly "same", which avoids the extra padding op.

  Args:
    x: the input tensor, channels-last.
    filters: number of output channels.
    kernel_size: an int or a (height, width) pair.
    strides: the stride on both axes.
    padding: torch-style zero padding, an int or a (height, width) pair.
    use_bias: whether the convolution has a bias (False before BatchNorm).
    name: the layer name; the padding layer, if any, gets `name + "_pad"`.

  Returns:
    The convolution output.
  """
  kernel_hw = _pair(kernel_size)
  padding_hw = _pair(padding)
  if padding_hw == (0, 0):
    keras_padding = "valid"
  elif strides == 1 and padding_hw == (kernel_hw[0] // 2, kernel_hw[1] // 2):
    keras_padding = "same"
  else:
    x = keras.layers.ZeroPadding2D(padding_hw, name=name + "_pad")(x)
    keras_padding = "valid"
  return keras.layers.Conv2D(filters, kernel_hw, strides=strides,
                             padding=keras_padding, use_bias=use_bias,
                             name=name)(x)


def batch_norm(x, *, epsilon: float = BN_EPSILON, name: str):
  """BatchNorm with a trainable scale and offset, as torch's BatchNorm2d.

  Args:
    x: the input tensor, channels-last.
    epsilon: the variance epsilon (torch's `eps`).
    name: the layer name.

  Returns:
    The normalized tensor.
  """
  return keras.layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=epsilon,
                                         name=name)(x)


def torch_max_pool(x, pool_size: int, *, strides: int, padding: int = 0,
                   name: str):
  """MaxPool2D that pads like torch's `nn.MaxPool2d(padding=...)`.

  torch pads max pooling with -inf; zero padding is the same here because
  every caller pools a ReLU output, which is never negative.

  Args:
    x: the input tensor, channels-last, non-negative.
    pool_size: the window side.
    strides: the stride on both axes.
    padding: torch-style padding on every side.
    name: the layer name; the padding layer, if any, gets `name + "_pad"`.

  Returns:
    The pooled tensor.
  """
  if padding:
    x = keras.layers.ZeroPadding2D(padding, name=name + "_pad")(x)
  return keras.layers.MaxPooling2D(pool_size, strides=strides, padding="valid",
                                   name=name)(x)


def float32_output(x, name: str = "float32_output"):
  """Casts the model output to float32.

  Under a mixed precision policy the last layer computes in float16/bfloat16;
  losses and metrics need float32 to stay stable, so every zoo model ends here.

  Args:
    x: the model's final tensor.
    name: the layer name.

  Returns:
    The same values as float32.
  """
  return keras.layers.Activation("linear", dtype="float32", name=name)(x)


def _pair(value):
  if isinstance(value, int):
    return (value, value)
  return tuple(value)
