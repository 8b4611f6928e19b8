"""Tests for the PyTorch zoo: each name is the Keras zoo's architecture.

Parity is checked three ways: layer-by-layer trainable parameter counts at
the sizes the Keras tests build and at small ones; Keras weights copied into
the torch model give the same outputs (so padding, pooling, flatten order,
BatchNorm epsilon and the mean shift agree, not just the sizes); and one
training-mode forward updates BatchNorm statistics alike.
"""

import dataclasses
import math
import subprocess
import sys

import keras
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.helpers import REPO_ROOT, subprocess_env
from tfoverlap import models as keras_models
from overlap_core.runtime import zoo
from overlap_core.runtime.config import (DataConfig, DistributeConfig,
                                         ModelConfig)
from torch_parity import data, distribute, models, steps

NUM_CLASSES = 10
BATCH_SIZE = 2

# (name, image_size, num_classes, channels) as tests/test_models.py builds
# the Keras models for its parameter counts, so the Keras side costs here
# what it costs there.
KERAS_TEST_CASES = [
    *[(name, 224, 1000, 3) for name in (
        "resnet18", "resnet50", "vgg16", "vgg19", "wide_resnet50_2",
        "wide_resnet101_2", "inception_v3")],
    ("wide_resnet26_2", 32, NUM_CLASSES, 3),
    ("mlp", 32, NUM_CLASSES, 3),
    ("small_cnn", 32, NUM_CLASSES, 3),
    ("edsr", 16, 0, 3),
    ("edsr", 16, 0, 1),
]
# Small sides, odd where a head's size depends on the side, so that the
# floor of each pooling is exercised; one channel, so the stems are resized.
SMALL_SIZES = {
    "mlp": 5,
    "small_cnn": 7,
    "resnet18": 1,
    "resnet50": 1,
    "vgg16": 63,
    "vgg19": 63,
    "inception_v3": 75,
    "wide_resnet26_2": 1,
    "wide_resnet50_2": 1,
    "wide_resnet101_2": 1,
    "edsr": 2,
}
SMALL_CASES = [(name, size, NUM_CLASSES, 1)
               for name, size in SMALL_SIZES.items()]


@pytest.fixture(autouse=True)
def fresh_keras_state():
  """Frees each test's Keras models."""
  yield
  keras.backend.clear_session()


def case_id(case):
  name, image_size, num_classes, channels = case
  return f"{name}-{image_size}px-{num_classes}cls-{channels}ch"


def is_super_resolution(name):
  return zoo.MODELS[name].task == "super_resolution"


def input_side(name, image_size):
  return image_size // zoo.MODELS[name].upscale


def keras_layer_params(model):
  """{Keras layer name: its trainable scalars}, for layers that have any."""
  counts = {layer.name: sum(math.prod(w.shape)
                            for w in layer.trainable_weights)
            for layer in model.layers}
  return {name: count for name, count in counts.items() if count}


def torch_layer_params(model):
  """{module path with "_" for ".": its trainable scalars}."""
  counts = {}
  for name, parameter in model.named_parameters():
    if parameter.requires_grad:
      layer = name.rpartition(".")[0].replace(".", "_")
      counts[layer] = counts.get(layer, 0) + parameter.numel()
  return counts


def copy_keras_weights(keras_model, torch_model):
  """Loads a Keras zoo model's weights into its torch twin, by layer name.

  Converts layouts: conv kernels (kh, kw, in, out) to (out, in, kh, kw),
  dense kernels (in, out) to (out, in), the first dense after a Flatten from
  HWC to CHW input order, and EDSR's upsampler filters from depth_to_space
  order to PixelShuffle order. Checks that BatchNorm epsilon and momentum
  agree on the way, and that every torch weight and statistic was loaded.
  """
  modules = {path.replace(".", "_"): module
             for path, module in torch_model.named_modules()}
  loaded = set()

  def load(module, attribute, value):
    target = getattr(module, attribute)
    assert tuple(target.shape) == value.shape, (module, attribute)
    with torch.no_grad():
      target.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    loaded.add(id(target))

  flatten_input_shape = None
  for layer in keras_model.layers:
    if isinstance(layer, keras.layers.Flatten):
      flatten_input_shape = tuple(layer.input.shape[1:])
    if not layer.weights:
      continue
    module = modules[layer.name]
    if isinstance(layer, keras.layers.Conv2D):
      kernel = layer.kernel.numpy().transpose(3, 2, 0, 1)
      bias = layer.bias.numpy() if layer.use_bias else None
      if layer.name == "tail_0_0":  # EDSR's upsampler, before the shuffle
        filters = kernel.shape[0]
        blocks = zoo.MODELS["edsr"].upscale**2
        # torch output channel c * blocks + k is Keras' k * channels + c.
        order = np.arange(filters).reshape(blocks, -1).T.reshape(-1)
        kernel, bias = kernel[order], bias[order]
      load(module, "weight", kernel)
      if bias is not None:
        load(module, "bias", bias)
    elif isinstance(layer, keras.layers.Dense):
      kernel = layer.kernel.numpy()
      if flatten_input_shape is not None and len(flatten_input_shape) == 3:
        height, width, channels = flatten_input_shape
        kernel = (kernel.reshape(height, width, channels, -1)
                  .transpose(2, 0, 1, 3).reshape(kernel.shape))
      flatten_input_shape = None  # only the first dense reads the flatten
      load(module, "weight", kernel.T)
      load(module, "bias", layer.bias.numpy())
    elif isinstance(layer, keras.layers.BatchNormalization):
      assert module.eps == pytest.approx(layer.epsilon), layer.name
      assert module.momentum == pytest.approx(1 - layer.momentum), layer.name
      load(module, "weight", layer.gamma.numpy())
      load(module, "bias", layer.beta.numpy())
      load(module, "running_mean", layer.moving_mean.numpy())
      load(module, "running_var", layer.moving_variance.numpy())
    else:
      raise AssertionError(f"no torch layout known for {layer.name}")
  unloaded = [name for name, tensor in [*torch_model.named_parameters(),
                                        *torch_model.named_buffers()]
              if id(tensor) not in loaded
              and not name.endswith("num_batches_tracked")
              and name != "rgb_mean"]  # EDSR's constant, no Keras weight
  assert not unloaded


def randomize_batch_norm_statistics(keras_model, rng):
  """Gives every BatchNorm non-trivial statistics, scale and shift.

  Fresh BatchNorms are the identity up to epsilon, which would let a
  swapped mean and variance (or scale and shift) pass unnoticed.
  """
  for layer in keras_model.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      size = layer.gamma.shape
      layer.gamma.assign(rng.uniform(0.5, 1.5, size).astype(np.float32))
      layer.beta.assign(rng.normal(0, 0.1, size).astype(np.float32))
      layer.moving_mean.assign(rng.normal(0, 0.1, size).astype(np.float32))
      layer.moving_variance.assign(
          rng.uniform(0.5, 1.5, size).astype(np.float32))


def keras_and_torch_twins(name, image_size, channels=3, seed=0):
  """The Keras model and a torch model holding the same weights."""
  keras.utils.set_random_seed(seed)
  keras_model = keras_models.build_model(
      name, image_size=image_size, num_classes=NUM_CLASSES, channels=channels)
  randomize_batch_norm_statistics(keras_model, np.random.default_rng(seed))
  torch_model = models.build_model(
      name, image_size=image_size, num_classes=NUM_CLASSES, channels=channels)
  copy_keras_weights(keras_model, torch_model)
  return keras_model, torch_model


def nhwc_to_nchw(images):
  return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))


def as_nhwc(outputs):
  """Torch outputs in the Keras layout: images to NHWC, logits as they are."""
  outputs = outputs.detach().numpy()
  return outputs.transpose(0, 2, 3, 1) if outputs.ndim == 4 else outputs


def assert_outputs_close(torch_outputs, keras_outputs):
  keras_outputs = np.asarray(keras_outputs)
  scale = max(1.0, float(np.abs(keras_outputs).max()))
  np.testing.assert_allclose(as_nhwc(torch_outputs), keras_outputs,
                             rtol=1e-4, atol=1e-4 * scale)


def test_registry_is_exactly_the_zoo():
  # pylint: disable-next=protected-access
  assert tuple(models._BUILDERS) == zoo.MODEL_NAMES


@pytest.mark.parametrize("case", KERAS_TEST_CASES + SMALL_CASES, ids=case_id)
def test_params_equal_keras_layer_by_layer(case):
  name, image_size, num_classes, channels = case
  keras_model = keras_models.build_model(
      name, image_size=image_size, num_classes=num_classes, channels=channels)
  # Shapes are all a count needs; on the meta device torch allocates and
  # initializes nothing.
  with torch.device("meta"):
    torch_model = models.build_model(
        name, image_size=image_size, num_classes=num_classes,
        channels=channels)
  assert models.num_params(torch_model) == keras_models.num_params(keras_model)
  # Equal per layer, not only in total: a size moved from one layer to
  # another would otherwise pass.
  assert torch_layer_params(torch_model) == keras_layer_params(keras_model)


@pytest.mark.parametrize("name, image_size", [
    ("mlp", 12),
    ("small_cnn", 14),  # flattens a 3x3 map: the HWC/CHW order matters
    ("vgg16", 64),  # flattens a 2x2 map
    ("vgg19", 64),  # and four convolutions in each of the last stages
    ("resnet18", 33),  # odd sides: torch's symmetric padding matters
    ("wide_resnet26_2", 35),
    ("inception_v3", 79),
    ("edsr", 16),
])
def test_same_weights_give_keras_outputs(name, image_size):
  keras_model, torch_model = keras_and_torch_twins(name, image_size)
  side = input_side(name, image_size)
  images = np.random.default_rng(1).random((BATCH_SIZE, side, side, 3),
                                           dtype=np.float32)
  torch_model.eval()  # BatchNorm statistics and no dropout, as training=False
  with torch.no_grad():
    torch_outputs = torch_model(nhwc_to_nchw(images))
  keras_outputs = keras_model(images, training=False)
  assert_outputs_close(torch_outputs, keras_outputs)


def test_training_forward_updates_batch_norm_like_keras():
  # Eight samples, not two: layer4's map is 1x1, and BatchNorm over two
  # values maps them to about +-1 whatever they are, which amplifies the
  # frameworks' different rounding beyond any useful tolerance.
  image_size, batch_size = 32, 8
  keras_model, torch_model = keras_and_torch_twins("resnet18", image_size)
  images = np.random.default_rng(1).random(
      (batch_size, image_size, image_size, 3), dtype=np.float32)
  batch_norms = [layer for layer in keras_model.layers
                 if isinstance(layer, keras.layers.BatchNormalization)]
  old_variances = [bn.moving_variance.numpy().copy() for bn in batch_norms]

  torch_model.train()
  torch_outputs = torch_model(nhwc_to_nchw(images))
  keras_outputs = keras_model(images, training=True)

  # Batch statistics normalize both, so the outputs agree in training too.
  assert_outputs_close(torch_outputs, keras_outputs)
  modules = {path.replace(".", "_"): module
             for path, module in torch_model.named_modules()}
  for bn, old_variance in zip(batch_norms, old_variances):
    module = modules[bn.name]
    np.testing.assert_allclose(module.running_mean.numpy(),
                               bn.moving_mean.numpy(), rtol=1e-4, atol=1e-5)
    # Both keep 0.9 of the old variance; torch adds 0.1 of the unbiased
    # batch variance where Keras adds 0.1 of the biased one.
    _, height, width, _ = bn.output.shape
    count = batch_size * height * width
    keras_added = bn.moving_variance.numpy() - 0.9 * old_variance
    torch_added = module.running_var.numpy() - 0.9 * old_variance
    np.testing.assert_allclose(torch_added, keras_added * count / (count - 1),
                               rtol=1e-3, atol=1e-6)


def small_model_and_images(name, channels=1):
  image_size = SMALL_SIZES[name]
  model = models.build_model(name, image_size=image_size,
                             num_classes=NUM_CLASSES, channels=channels)
  side = input_side(name, image_size)
  return model.eval(), torch.rand(BATCH_SIZE, channels, side, side)


def expected_output_shape(name, channels=1):
  if is_super_resolution(name):
    image_size = SMALL_SIZES[name]
    return (BATCH_SIZE, channels, image_size, image_size)
  return (BATCH_SIZE, NUM_CLASSES)


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_output_shape_at_small_size(name):
  model, images = small_model_and_images(name)
  with torch.no_grad():
    outputs = model(images)
  assert tuple(outputs.shape) == expected_output_shape(name)
  assert outputs.dtype == torch.float32 and torch.isfinite(outputs).all()


# One model per family module: the float32 cast sits in each family's
# forward, and autocast re-casts every weight per call, which is slow for
# the large ResNets on a CPU.
@pytest.mark.parametrize("name", [
    "mlp", "small_cnn", "resnet18", "vgg16", "inception_v3", "edsr"])
def test_output_is_float32_under_autocast(name):
  model, images = small_model_and_images(name)
  last_layer = [m for m in model.modules()
                if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))][-1]
  last_layer_dtypes = []
  last_layer.register_forward_hook(
      lambda module, inputs, output: last_layer_dtypes.append(output.dtype))
  with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    outputs = model(images)
  # Autocast must have reached the model, or the float32 check is vacuous.
  assert last_layer_dtypes == [torch.bfloat16]
  assert tuple(outputs.shape) == expected_output_shape(name)
  assert outputs.dtype == torch.float32 and torch.isfinite(outputs).all()


@pytest.mark.parametrize("name, image_size", [
    ("mlp", 32), ("small_cnn", 32), ("resnet18", 32), ("edsr", 16)])
def test_one_training_step_moves_every_weight(name, image_size):
  torch.manual_seed(0)
  model = models.build_model(name, image_size=image_size,
                             num_classes=NUM_CLASSES)
  side = input_side(name, image_size)
  images = torch.rand(BATCH_SIZE, 3, side, side)
  if is_super_resolution(name):
    targets = torch.rand(BATCH_SIZE, 3, image_size, image_size)
    loss_fn = torch.nn.L1Loss()  # EDSR's loss
  else:
    targets = torch.randint(0, NUM_CLASSES, (BATCH_SIZE,))
    loss_fn = torch.nn.CrossEntropyLoss()
  before = {n: p.detach().clone() for n, p in model.named_parameters()}
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

  loss = loss_fn(model(images), targets)
  loss.backward()
  optimizer.step()

  assert torch.isfinite(loss)
  # A layer the loss does not reach gets no (or a zero) gradient, and Adam
  # leaves it exactly where it was.
  unchanged = [n for n, p in model.named_parameters()
               if torch.equal(p.detach(), before[n])]
  assert not unchanged


def test_weights_start_from_keras_default_distributions():
  torch.manual_seed(0)
  mlp = models.build_model("mlp", image_size=32, num_classes=NUM_CLASSES)
  cnn = models.build_model("small_cnn", image_size=32,
                           num_classes=NUM_CLASSES)
  layers = [m for model in (mlp, cnn) for m in model.modules()
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
  assert len(layers) == 3 + 6
  for layer in layers:
    receptive = layer.weight[0, 0].numel()
    fan_out, fan_in = (n * receptive for n in layer.weight.shape[:2])
    glorot_bound = math.sqrt(6 / (fan_in + fan_out))
    largest = float(layer.weight.detach().abs().max())
    # torch's own default, U(+-1/sqrt(fan_in)), misses this window for every
    # one of these layers, above or below.
    assert 0.95 * glorot_bound < largest <= glorot_bound, layer
    assert not layer.bias.detach().any(), layer


@pytest.mark.parametrize("name, image_size, num_classes, channels", [
    ("resnet19", 32, NUM_CLASSES, 3),
    ("vgg16", 31, NUM_CLASSES, 3),
    ("vgg19", 31, NUM_CLASSES, 3),
    ("inception_v3", 74, NUM_CLASSES, 3),
    ("edsr", 15, NUM_CLASSES, 3),
    ("mlp", 32, 0, 3),
    ("small_cnn", 32, NUM_CLASSES, 0),
])
def test_bad_requests_raise_what_keras_raises(name, image_size, num_classes,
                                              channels):
  with pytest.raises(ValueError) as keras_error:
    keras_models.build_model(name, image_size=image_size,
                             num_classes=num_classes, channels=channels)
  with pytest.raises(ValueError) as torch_error:
    models.build_model(name, image_size=image_size, num_classes=num_classes,
                       channels=channels)
  assert str(torch_error.value) == str(keras_error.value)


def test_num_params_leaves_out_batch_norm_statistics():
  model = models.build_model("resnet18", image_size=32,
                             num_classes=NUM_CLASSES)
  batch_norms = [m for m in model.modules()
                 if isinstance(m, torch.nn.BatchNorm2d)]
  statistics = sum(m.running_mean.numel() + m.running_var.numel()
                   for m in batch_norms)
  assert batch_norms and statistics > 0
  assert models.num_params(model) == sum(p.numel()
                                         for p in model.parameters())
  all_buffers = sum(b.numel() for b in model.buffers())
  assert all_buffers == statistics + len(batch_norms)  # num_batches_tracked
  # A frozen parameter is not trainable, as a non-trainable Keras weight.
  model.fc.weight.requires_grad_(False)
  assert models.num_params(model) == (sum(p.numel()
                                          for p in model.parameters())
                                      - model.fc.weight.numel())


def test_import_and_build_leave_tensorflow_unloaded():
  code = (
      "import sys, torch\n"
      "from torch_parity import models\n"
      "model = models.build_model('resnet18', image_size=32, num_classes=10)\n"
      "model.eval()(torch.rand(1, 3, 32, 32))\n"
      "loaded = sorted(m for m in sys.modules\n"
      "                if m.split('.')[0] in ('tensorflow', 'keras'))\n"
      "print('frameworks:', loaded)\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300, cwd=REPO_ROOT,
                          env=subprocess_env(), check=False)
  assert result.returncode == 0, result.stderr
  assert "frameworks: []" in result.stdout


# --- in the training step ------------------------------------------------


def single_process_strategy():
  return distribute.build_strategy(DistributeConfig(
      strategy="default", num_devices=1, num_workers=1, all_reduce="auto",
      all_reduce_pack_mb=0.0))


@pytest.fixture
def one_thread():
  """Runs the test's tensor math on one thread, then restores the count.

  The models below are tiny: their convolutions on 4x4 to 16x16 maps are
  too small to share among threads. On a 2-core host that other processes
  also use, two threads made an EDSR step 10-30x slower than one, waiting
  for each other.
  """
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


# torch's float16 convolutions on the CPU run on slow reference kernels, so
# float16 is checked on the MLP's matmuls.
@pytest.mark.parametrize("precision, name, compute_dtype", [
    ("float32", "small_cnn", torch.float32),
    ("mixed_bfloat16", "small_cnn", torch.bfloat16),
    ("mixed_float16", "mlp", torch.float16),
])
def test_precision_sets_the_dtype_the_train_step_computes_in(
    one_thread, precision, name, compute_dtype):
  del one_thread
  torch.manual_seed(0)
  model = models.build_model(name, image_size=16, num_classes=NUM_CLASSES)
  optimizer = steps.build_optimizer(
      ModelConfig(name=name, optimizer="adam", learning_rate=1e-3,
                  precision=precision), model.parameters())
  train_step = steps.make_train_step(model, optimizer,
                                     single_process_strategy(),
                                     task="classification",
                                     precision=precision)
  output_dtypes = []
  for module in model.modules():
    if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
      module.register_forward_hook(
          lambda module, inputs, output: output_dtypes.append(output.dtype))
  batch = (torch.rand(8, 3, 16, 16), torch.randint(0, NUM_CLASSES, (8,)))
  before = [p.detach().clone() for p in model.parameters()]
  loss = train_step(batch)
  # Every convolution and linear layer computed in the compute dtype.
  assert output_dtypes and set(output_dtypes) == {compute_dtype}
  assert torch.isfinite(loss)
  # The weights stay float32 and the step moved them.
  assert {p.dtype for p in model.parameters()} == {torch.float32}
  assert not all(torch.equal(p.detach(), old)
                 for p, old in zip(model.parameters(), before))


def psnr_db(predicted, target) -> torch.Tensor:
  """Per-image PSNR of [0, 1] images, as `steps.evaluate` has it."""
  squared = (target - predicted).square().mean(dim=(1, 2, 3))
  return -10.0 * torch.log(squared + 1e-10) / math.log(10.0)


def test_edsr_beats_bicubic_upsampling_after_a_few_steps(one_thread):
  # The setting of the TensorFlow trainer's test (tests/tfoverlap/
  # test_train.py), which says why it is the fair small one: the digits at
  # 8x8 from 4x4, where bicubic gets 13.4 dB, a model ignoring its input at
  # best 11.5 dB, and 40 steps got EDSR to 15.3-15.6 dB over seeds 0-2.
  del one_thread
  torch.manual_seed(0)
  cfg = DataConfig(dataset="digits", data_dir=None, tfds_name="mnist",
                   image_size=8, num_classes=10, batch_size=16,
                   synthetic_on_device=False, prefetch=0,
                   prefetch_to_device=False, map_parallelism=1, cache=False,
                   shuffle_buffer=1024, preprocess_cost_ms=0.0,
                   data_service="")
  strategy = single_process_strategy()
  model = models.build_model("edsr", image_size=8, num_classes=0)
  optimizer = steps.build_optimizer(
      ModelConfig(name="edsr", optimizer="adam", learning_rate=1e-3,
                  precision="float32"), model.parameters())
  train_step = steps.make_train_step(model, optimizer, strategy,
                                     task="super_resolution",
                                     precision="float32")
  batches = iter(data.make_loader(cfg, split="train",
                                  task="super_resolution", seed=0,
                                  upscale=2))
  for _ in range(40):
    train_step(next(batches))
  evaluation = data.make_loader(cfg, split="eval", task="super_resolution",
                                seed=0, upscale=2)
  result = steps.evaluate(model, evaluation, strategy,
                          task="super_resolution", precision="float32")
  low_res, high_res = (torch.cat(parts) for parts in zip(*evaluation))
  assert result["eval_examples"] == len(high_res) == 360
  bicubic_db = psnr_db(F.interpolate(low_res, scale_factor=2,
                                     mode="bicubic", align_corners=False),
                       high_res).mean()
  train_high_res = next(iter(data.make_loader(
      dataclasses.replace(cfg, batch_size=1437, shuffle_buffer=0),
      split="train", task="super_resolution", seed=0, upscale=2)))[1]
  mean_image = train_high_res.mean(dim=0).expand_as(high_res)
  assert psnr_db(mean_image, high_res).mean() < bicubic_db
  assert result["eval_psnr_db"] > bicubic_db
