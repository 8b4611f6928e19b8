"""Tests for the Keras model zoo: it runs, it trains, it counts like torch."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfoverlap import models
from overlap_core.runtime import zoo

NUM_CLASSES = 10
BATCH_SIZE = 2

# torchvision's published trainable parameter counts at 1000 classes.
INCEPTION_V3_WITH_AUX = 27_161_264
INCEPTION_AUX_LOGITS = (
    768 * 128 + 2 * 128  # conv0: 1x1 768->128, no bias, BN scale + offset
    + 128 * 768 * 5 * 5 + 2 * 768  # conv1: 5x5 128->768, no bias, BN
    + 768 * 1000 + 1000)  # fc: 768->1000 with bias
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "wide_resnet50_2": 68_883_240,
    "wide_resnet101_2": 126_886_696,
    "inception_v3": INCEPTION_V3_WITH_AUX - INCEPTION_AUX_LOGITS,
}


@pytest.fixture(autouse=True)
def fresh_keras_state():
  """Frees each test's models and restores the float32 policy after it."""
  yield
  keras.mixed_precision.set_global_policy("float32")
  keras.backend.clear_session()


def small_image_size(name):
  if zoo.MODELS[name].task == "super_resolution":
    return 16
  return max(zoo.MODELS[name].min_image_size, 32)


def random_inputs(model, rng):
  return rng.random((BATCH_SIZE, *model.input.shape[1:]), dtype=np.float32)


def expected_output_shape(name, image_size, channels=3):
  if zoo.MODELS[name].task == "super_resolution":
    return (BATCH_SIZE, image_size, image_size, channels)
  return (BATCH_SIZE, NUM_CLASSES)


def bottleneck_resnet_params(blocks_per_stage, width_per_group, num_classes):
  """torchvision's Bottleneck ResNet parameter count, worked out by hand."""
  total = 3 * 64 * 7 * 7 + 2 * 64  # stem conv + BN
  in_channels = 64
  for planes, num_blocks in zip((64, 128, 256, 512), blocks_per_stage):
    width, out_channels = planes * width_per_group // 64, planes * 4
    for _ in range(num_blocks):
      total += in_channels * width + 2 * width  # 1x1 + BN
      total += width * width * 9 + 2 * width  # 3x3 + BN
      total += width * out_channels + 2 * out_channels  # 1x1 + BN
      if in_channels != out_channels:  # first block's downsample
        total += in_channels * out_channels + 2 * out_channels
      in_channels = out_channels
  return total + in_channels * num_classes + num_classes  # fc


def test_registry_is_exactly_the_zoo():
  # pylint: disable-next=protected-access
  assert tuple(models._BUILDERS) == zoo.MODEL_NAMES


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_model_runs_and_one_training_step_moves_every_weight(name):
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(0)
  image_size = small_image_size(name)
  model = models.build_model(name, image_size=image_size,
                             num_classes=NUM_CLASSES)
  images = random_inputs(model, rng)

  outputs = model(images, training=False)
  assert tuple(outputs.shape) == expected_output_shape(name, image_size)
  assert np.isfinite(outputs.numpy()).all()

  if zoo.MODELS[name].task == "super_resolution":
    targets = rng.random(expected_output_shape(name, image_size),
                         dtype=np.float32)
    loss_fn = keras.losses.MeanAbsoluteError()  # EDSR's L1 loss
  else:
    targets = rng.integers(0, NUM_CLASSES, BATCH_SIZE)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  variables = model.trainable_variables
  before = [v.numpy().copy() for v in variables]
  # Plain SGD at 1e3 moves a weight by 1e3 x its gradient: at least what
  # Adam's first step at 1e-3 would (lr x g / (|g| + eps / sqrt(1 -
  # beta_2)), at most 316 x g), so any weight Adam would move moves; and
  # with no moment slots to fill it costs a tenth of Adam's step on the
  # wide ResNets' 69-127M weights.
  optimizer = keras.optimizers.SGD(1e3)
  with tf.GradientTape() as tape:
    loss = loss_fn(targets, model(images, training=True))
  gradients = tape.gradient(loss, variables)
  optimizer.apply_gradients(zip(gradients, variables))

  assert np.isfinite(loss.numpy())
  assert all(np.isfinite(g.numpy()).all() for g in gradients)
  # A weight the loss does not reach (a disconnected or dead layer) gets a
  # zero gradient, and the step leaves it exactly where it was.
  unchanged = [v.path for v, old in zip(variables, before)
               if np.array_equal(v.numpy(), old)]
  assert not unchanged


# The wide ResNets are left out: their strides and paddings, all that sets
# the smallest input, are resnet50's.
@pytest.mark.parametrize("name", [
    n for n, spec in zoo.MODELS.items()
    if spec.min_image_size < 32 and not n.startswith("wide_resnet")])
def test_model_runs_at_its_zoo_min_image_size(name):
  min_size = zoo.MODELS[name].min_image_size
  model = models.build_model(name, image_size=min_size,
                             num_classes=NUM_CLASSES)
  outputs = model(random_inputs(model, np.random.default_rng(0)))
  assert tuple(outputs.shape) == expected_output_shape(name, min_size)


@pytest.mark.parametrize("name", TORCHVISION_PARAMS)
def test_params_equal_torchvision_at_224(name):
  model = models.build_model(name, image_size=224, num_classes=1000)
  assert models.num_params(model) == TORCHVISION_PARAMS[name]


def test_wide_resnet26_2_params_follow_the_torchvision_formula():
  # The hand formula is first checked against published counts, then gives
  # the figure for the depth torchvision does not publish.
  assert (bottleneck_resnet_params((3, 4, 6, 3), 64, 1000)
          == TORCHVISION_PARAMS["resnet50"])
  assert (bottleneck_resnet_params((3, 4, 23, 3), 128, 1000)
          == TORCHVISION_PARAMS["wide_resnet101_2"])
  model = models.build_model("wide_resnet26_2", image_size=32,
                             num_classes=NUM_CLASSES)
  assert models.num_params(model) == bottleneck_resnet_params(
      (2, 2, 2, 2), 128, NUM_CLASSES)


def test_small_classifier_params_match_their_docstrings():
  image_size, channels = 32, 3
  mlp = models.build_model("mlp", image_size=image_size,
                           num_classes=NUM_CLASSES, channels=channels)
  assert models.num_params(mlp) == (
      image_size * image_size * channels * 512 + 512
      + 512 * 256 + 256 + 256 * NUM_CLASSES + NUM_CLASSES)
  cnn = models.build_model("small_cnn", image_size=image_size,
                           num_classes=NUM_CLASSES, channels=channels)
  assert models.num_params(cnn) == (
      channels * 32 * 9 + 32 + 32 * 32 * 9 + 32
      + 32 * 64 * 9 + 64 + 64 * 64 * 9 + 64
      + 64 * (image_size // 4)**2 * 128 + 128
      + 128 * NUM_CLASSES + NUM_CLASSES)


@pytest.mark.parametrize("channels", [3, 1])
def test_edsr_baseline_params_and_shapes(channels):
  conv3x3 = lambda c_in, c_out: c_in * c_out * 9 + c_out  # with bias
  expected = (conv3x3(channels, 64)  # head
              + 16 * 2 * conv3x3(64, 64)  # residual blocks
              + conv3x3(64, 64)  # body's final conv
              + conv3x3(64, 256)  # x2 upsampler, before depth_to_space
              + conv3x3(64, channels))  # tail
  if channels == 3:
    assert expected == 1_369_859
  image_size = 16
  model = models.build_model("edsr", image_size=image_size, num_classes=0,
                             channels=channels)
  assert models.num_params(model) == expected
  low_res = image_size // zoo.MODELS["edsr"].upscale
  assert tuple(model.input.shape) == (None, low_res, low_res, channels)
  assert tuple(model.output.shape) == (None, image_size, image_size, channels)


def test_unknown_name_raises_naming_it():
  with pytest.raises(ValueError, match="resnet19") as error:
    models.build_model("resnet19", image_size=32, num_classes=NUM_CLASSES)
  assert "name=" in str(error.value) and "resnet18" in str(error.value)


@pytest.mark.parametrize("name, image_size", [("vgg16", 31),
                                              ("vgg19", 31),
                                              ("inception_v3", 74),
                                              ("edsr", 15)])
def test_bad_image_size_raises_naming_it(name, image_size):
  with pytest.raises(ValueError, match=f"image_size={image_size}"):
    models.build_model(name, image_size=image_size, num_classes=NUM_CLASSES)


def test_num_params_counts_trainable_weights_not_moving_statistics():
  model = models.build_model("resnet18", image_size=32,
                             num_classes=NUM_CLASSES)
  sizes = lambda weights: sum(math.prod(w.shape) for w in weights)
  batch_norms = [layer for layer in model.layers
                 if isinstance(layer, keras.layers.BatchNormalization)]
  moving_statistics = sizes([w for bn in batch_norms
                             for w in (bn.moving_mean, bn.moving_variance)])
  assert batch_norms and moving_statistics > 0
  assert models.num_params(model) == sizes(model.trainable_weights)
  assert models.num_params(model) == sizes(model.weights) - moving_statistics


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_output_is_float32_under_mixed_bfloat16(name):
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  image_size = small_image_size(name)
  model = models.build_model(name, image_size=image_size,
                             num_classes=NUM_CLASSES)
  images = random_inputs(model, np.random.default_rng(0))
  # The policy must have reached the body, or the check below is vacuous:
  # the last convolution or dense layer outputs bfloat16, from the same
  # weights (float32, as mixed precision keeps them).
  last = [layer for layer in model.layers
          if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense))][-1]
  assert last.kernel.dtype == "float32"
  # One forward pass gives both: the probe shares the model's layers.
  hidden, outputs = keras.Model(model.input, [last.output, model.output])(
      images)
  assert hidden.dtype == tf.bfloat16
  assert outputs.dtype == tf.float32
  assert tuple(outputs.shape) == expected_output_shape(name, image_size)
  assert np.isfinite(outputs.numpy()).all()
