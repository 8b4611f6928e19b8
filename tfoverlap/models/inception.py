"""Inception v3, after torchvision.models.Inception3.

Follows torchvision's `Inception3(aux_logits=False, transform_input=False)`
module for module: every convolution is its `BasicConv2d` (conv without bias,
BatchNorm with trainable scale and offset and epsilon 1e-3, ReLU), with the
same kernel shapes, strides and zero padding; the branch average pools are
3x3/1 with padding 1 counted in the mean (torch's count_include_pad=True);
the head is global average pooling, Dropout(0.5), Dense(num_classes).
Left out, as asked of torchvision by those two arguments: the auxiliary
classifier (`AuxLogits`, on Mixed_6e) and the input re-normalization.
Trainable parameters at 1000 classes: torchvision's 27,161,264 less the
3,326,696 of AuxLogits = 23,834,568, independent of image_size. The input
side must be at least 75. Weights are initialized with Keras' defaults, not
torchvision's.
"""

import keras

from tfoverlap.models import layers

_BN_EPSILON = 1e-3  # torchvision's BasicConv2d, unlike its ResNets
_DROPOUT_RATE = 0.5


def build_inception_v3(*, image_size: int, num_classes: int,
                       channels: int) -> keras.Model:
  """Builds Inception v3 without auxiliary logits.

  Layer names follow torchvision's module paths with "_" for "." (for example
  "Mixed_6b_branch7x7_2_conv"), so weights can be matched by name. Arguments
  and result as `build_model`'s.
  """
  inputs = layers.image_input(image_size, channels)
  x = _basic_conv(inputs, 32, 3, strides=2, name="Conv2d_1a_3x3")
  x = _basic_conv(x, 32, 3, name="Conv2d_2a_3x3")
  x = _basic_conv(x, 64, 3, padding=1, name="Conv2d_2b_3x3")
  x = keras.layers.MaxPooling2D(3, strides=2, name="maxpool1")(x)
  x = _basic_conv(x, 80, 1, name="Conv2d_3b_1x1")
  x = _basic_conv(x, 192, 3, name="Conv2d_4a_3x3")
  x = keras.layers.MaxPooling2D(3, strides=2, name="maxpool2")(x)
  x = _inception_a(x, pool_features=32, name="Mixed_5b")
  x = _inception_a(x, pool_features=64, name="Mixed_5c")
  x = _inception_a(x, pool_features=64, name="Mixed_5d")
  x = _inception_b(x, name="Mixed_6a")
  x = _inception_c(x, channels_7x7=128, name="Mixed_6b")
  x = _inception_c(x, channels_7x7=160, name="Mixed_6c")
  x = _inception_c(x, channels_7x7=160, name="Mixed_6d")
  x = _inception_c(x, channels_7x7=192, name="Mixed_6e")
  x = _inception_d(x, name="Mixed_7a")
  x = _inception_e(x, name="Mixed_7b")
  x = _inception_e(x, name="Mixed_7c")
  x = keras.layers.GlobalAveragePooling2D(name="avgpool")(x)
  x = keras.layers.Dropout(_DROPOUT_RATE, name="dropout")(x)
  x = keras.layers.Dense(num_classes, name="fc")(x)
  return keras.Model(inputs, layers.float32_output(x), name="inception_v3")


def _basic_conv(x, filters: int, kernel_size, *, strides: int = 1, padding=0,
                name: str):
  """torchvision's BasicConv2d: conv (no bias), BatchNorm (eps 1e-3), ReLU."""
  x = layers.torch_conv(x, filters, kernel_size, strides=strides,
                        padding=padding, use_bias=False, name=name + "_conv")
  x = layers.batch_norm(x, epsilon=_BN_EPSILON, name=name + "_bn")
  return keras.layers.ReLU(name=name + "_relu")(x)


def _avg_pool_3x3(x, name: str):
  # torch's avg_pool2d(3, stride=1, padding=1) divides by 9 at the borders
  # too (count_include_pad=True); Keras' "same" would divide by fewer, so the
  # zeros are padded in explicitly.
  x = keras.layers.ZeroPadding2D(1, name=name + "_pad")(x)
  return keras.layers.AveragePooling2D(3, strides=1, name=name)(x)


def _inception_a(x, *, pool_features: int, name: str):
  branch1x1 = _basic_conv(x, 64, 1, name=name + "_branch1x1")

  branch5x5 = _basic_conv(x, 48, 1, name=name + "_branch5x5_1")
  branch5x5 = _basic_conv(branch5x5, 64, 5, padding=2,
                          name=name + "_branch5x5_2")

  branch3x3dbl = _basic_conv(x, 64, 1, name=name + "_branch3x3dbl_1")
  branch3x3dbl = _basic_conv(branch3x3dbl, 96, 3, padding=1,
                             name=name + "_branch3x3dbl_2")
  branch3x3dbl = _basic_conv(branch3x3dbl, 96, 3, padding=1,
                             name=name + "_branch3x3dbl_3")

  branch_pool = _avg_pool_3x3(x, name=name + "_avg_pool")
  branch_pool = _basic_conv(branch_pool, pool_features, 1,
                            name=name + "_branch_pool")
  return keras.layers.Concatenate(name=name)(
      [branch1x1, branch5x5, branch3x3dbl, branch_pool])


def _inception_b(x, *, name: str):
  branch3x3 = _basic_conv(x, 384, 3, strides=2, name=name + "_branch3x3")

  branch3x3dbl = _basic_conv(x, 64, 1, name=name + "_branch3x3dbl_1")
  branch3x3dbl = _basic_conv(branch3x3dbl, 96, 3, padding=1,
                             name=name + "_branch3x3dbl_2")
  branch3x3dbl = _basic_conv(branch3x3dbl, 96, 3, strides=2,
                             name=name + "_branch3x3dbl_3")

  branch_pool = keras.layers.MaxPooling2D(3, strides=2,
                                          name=name + "_max_pool")(x)
  return keras.layers.Concatenate(name=name)(
      [branch3x3, branch3x3dbl, branch_pool])


def _inception_c(x, *, channels_7x7: int, name: str):
  c7 = channels_7x7
  branch1x1 = _basic_conv(x, 192, 1, name=name + "_branch1x1")

  branch7x7 = _basic_conv(x, c7, 1, name=name + "_branch7x7_1")
  branch7x7 = _basic_conv(branch7x7, c7, (1, 7), padding=(0, 3),
                          name=name + "_branch7x7_2")
  branch7x7 = _basic_conv(branch7x7, 192, (7, 1), padding=(3, 0),
                          name=name + "_branch7x7_3")

  branch7x7dbl = _basic_conv(x, c7, 1, name=name + "_branch7x7dbl_1")
  branch7x7dbl = _basic_conv(branch7x7dbl, c7, (7, 1), padding=(3, 0),
                             name=name + "_branch7x7dbl_2")
  branch7x7dbl = _basic_conv(branch7x7dbl, c7, (1, 7), padding=(0, 3),
                             name=name + "_branch7x7dbl_3")
  branch7x7dbl = _basic_conv(branch7x7dbl, c7, (7, 1), padding=(3, 0),
                             name=name + "_branch7x7dbl_4")
  branch7x7dbl = _basic_conv(branch7x7dbl, 192, (1, 7), padding=(0, 3),
                             name=name + "_branch7x7dbl_5")

  branch_pool = _avg_pool_3x3(x, name=name + "_avg_pool")
  branch_pool = _basic_conv(branch_pool, 192, 1, name=name + "_branch_pool")
  return keras.layers.Concatenate(name=name)(
      [branch1x1, branch7x7, branch7x7dbl, branch_pool])


def _inception_d(x, *, name: str):
  branch3x3 = _basic_conv(x, 192, 1, name=name + "_branch3x3_1")
  branch3x3 = _basic_conv(branch3x3, 320, 3, strides=2,
                          name=name + "_branch3x3_2")

  branch7x7x3 = _basic_conv(x, 192, 1, name=name + "_branch7x7x3_1")
  branch7x7x3 = _basic_conv(branch7x7x3, 192, (1, 7), padding=(0, 3),
                            name=name + "_branch7x7x3_2")
  branch7x7x3 = _basic_conv(branch7x7x3, 192, (7, 1), padding=(3, 0),
                            name=name + "_branch7x7x3_3")
  branch7x7x3 = _basic_conv(branch7x7x3, 192, 3, strides=2,
                            name=name + "_branch7x7x3_4")

  branch_pool = keras.layers.MaxPooling2D(3, strides=2,
                                          name=name + "_max_pool")(x)
  return keras.layers.Concatenate(name=name)(
      [branch3x3, branch7x7x3, branch_pool])


def _inception_e(x, *, name: str):
  branch1x1 = _basic_conv(x, 320, 1, name=name + "_branch1x1")

  branch3x3 = _basic_conv(x, 384, 1, name=name + "_branch3x3_1")
  branch3x3 = keras.layers.Concatenate(name=name + "_branch3x3")([
      _basic_conv(branch3x3, 384, (1, 3), padding=(0, 1),
                  name=name + "_branch3x3_2a"),
      _basic_conv(branch3x3, 384, (3, 1), padding=(1, 0),
                  name=name + "_branch3x3_2b"),
  ])

  branch3x3dbl = _basic_conv(x, 448, 1, name=name + "_branch3x3dbl_1")
  branch3x3dbl = _basic_conv(branch3x3dbl, 384, 3, padding=1,
                             name=name + "_branch3x3dbl_2")
  branch3x3dbl = keras.layers.Concatenate(name=name + "_branch3x3dbl")([
      _basic_conv(branch3x3dbl, 384, (1, 3), padding=(0, 1),
                  name=name + "_branch3x3dbl_3a"),
      _basic_conv(branch3x3dbl, 384, (3, 1), padding=(1, 0),
                  name=name + "_branch3x3dbl_3b"),
  ])

  branch_pool = _avg_pool_3x3(x, name=name + "_avg_pool")
  branch_pool = _basic_conv(branch_pool, 192, 1, name=name + "_branch_pool")
  return keras.layers.Concatenate(name=name)(
      [branch1x1, branch3x3, branch3x3dbl, branch_pool])
