"""Fixtures and helpers that both framework sides' tests use, written once:
the data sets they read, and what both sides' data tests check of what
their pipelines serve (each side builds its own pipeline and passes it in).

tests/conftest.py registers this module as a plugin, so its fixtures reach
every test without an import; its helpers are imported by name. Nothing here
imports a framework at module level: the GPU machines have PyTorch only.
"""

import collections
import dataclasses

import numpy as np
import pytest

from overlap_core.runtime.config import ConfigError, DataConfig

# The digits data set, 8x8, as both sides' data tests start from. Inline
# loading: tests that are about overlap ask for prefetch and parallel maps.
DIGITS = DataConfig(dataset="digits", data_dir=None, tfds_name="mnist",
                    image_size=8, num_classes=10, batch_size=16,
                    synthetic_on_device=False, prefetch=0,
                    prefetch_to_device=False, map_parallelism=1,
                    cache=False, shuffle_buffer=256, preprocess_cost_ms=0.0,
                    data_service="")
TFDS_NAME = "tiny_gray"


def data_config(**overrides) -> DataConfig:
  """DIGITS with `overrides` (DataConfig's fields)."""
  return dataclasses.replace(DIGITS, **overrides)


def image_counter(images, levels=None) -> collections.Counter:
  """Multiset of images, comparable across orders.

  With `levels`, pixels are compared as integers (pixel * levels), so that
  float32 and float64 renderings of the same k/levels values agree.
  """
  if levels:
    images = np.round(np.asarray(images) * levels).astype(np.int64)
  return collections.Counter(image.tobytes() for image in images)


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
  """A real TFDS dataset, TFDS_NAME (train 20, test 8 grayscale 12x12).

  Returns:
    (its data_dir, {split: (images uint8 NHWC, labels)} as written).
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tensorflow_datasets as tfds
  root = tmp_path_factory.mktemp("tfds")
  rng = np.random.default_rng(7)
  splits = {}
  for split, count in (("train", 20), ("test", 8)):
    splits[split] = (rng.integers(0, 256, (count, 12, 12, 1), dtype=np.uint8),
                     rng.integers(0, 3, count))
  features = tfds.features.FeaturesDict({
      "image": tfds.features.Image(shape=(12, 12, 1)),
      "label": tfds.features.ClassLabel(num_classes=3)})
  tfds.dataset_builders.store_as_tfds_dataset(
      name=TFDS_NAME, version="1.0.0", features=features,
      split_datasets={
          split: tf.data.Dataset.from_tensor_slices(
              {"image": images, "label": labels})
          for split, (images, labels) in splits.items()},
      data_dir=str(root))
  return str(root), splits


def float64_image_batches(batch: int, image_size: int, num_steps: int):
  """Seeded float64 [batch, 3, side, side] images and 10-class labels, torch.

  The pipeline tests compare split training to whole-model training; float64
  keeps their rounding far below the tolerance.
  """
  import torch  # pylint: disable=g-import-not-at-top
  generator = torch.Generator().manual_seed(1)
  return [(torch.randn(batch, 3, image_size, image_size, generator=generator,
                       dtype=torch.float64),
           torch.randint(0, 10, (batch,), generator=generator))
          for _ in range(num_steps)]


# --- What both sides' data tests check of what their pipelines serve --------

# The synthetic pool both sides' tests read: 5 classes, 6x6, one batch an
# epoch.
SYNTHETIC_POOL = {"dataset": "synthetic", "num_classes": 5, "image_size": 6,
                  "batch_size": 1024}


def synthetic_pool_config(make_cfg, describe) -> DataConfig:
  """SYNTHETIC_POOL's config, once the side's `describe` gave its sizes."""
  cfg = make_cfg(**SYNTHETIC_POOL)
  info = describe(cfg)
  assert (info.num_classes, info.num_train_examples,
          info.num_eval_examples) == (5, 1024, 256)
  return cfg


def check_synthetic_pool(epochs, eval_images, image_shape) -> None:
  """The pool is fixed and a seed only orders it.

  Args:
    epochs: {seed: (images, labels)} of one whole training epoch, seeds 1
      and 2, as NumPy arrays.
    eval_images: the whole eval split's images.
    image_shape: one image's shape in the side's layout.
  """
  images, labels = epochs[1]
  assert images.shape == (1024, *image_shape)
  assert 0.0 <= images.min() and images.max() <= 1.0
  assert set(labels) == set(range(5))
  assert image_counter(epochs[1][0]) == image_counter(epochs[2][0])
  assert not np.array_equal(epochs[1][1], epochs[2][1])
  assert eval_images.shape == (256, *image_shape)
  assert not image_counter(eval_images) & image_counter(images)


def knob_settings(*rows) -> list:
  """pytest params of pipeline knobs: each row (prefetch, map_parallelism,
  cache, shuffle_buffer) becomes a dict of those DataConfig fields, under
  the id pytest gives the four values ("0-1-False-0")."""
  names = ("prefetch", "map_parallelism", "cache", "shuffle_buffer")
  return [pytest.param(dict(zip(names, row)), id="-".join(map(str, row)))
          for row in rows]


def check_knobs_kept_batches(epochs, evaluation, digits_reference, *,
                             shuffled: bool) -> None:
  """Whatever the pipeline's knobs, the digits it serves are right.

  Args:
    epochs: two training epochs of one batch each, (images, labels) NumPy.
    evaluation: the eval split's batches of 100.
    digits_reference: the side's {split -> (images, labels)} of the source,
      in its layout.
    shuffled: whether the config shuffles.
  """
  reference_images, reference_labels = digits_reference("train")
  for images, labels in epochs:
    assert image_counter(images, 16) == image_counter(reference_images, 16)
    if shuffled:
      assert not np.array_equal(labels, reference_labels)
    else:
      np.testing.assert_array_equal(labels, reference_labels)
      np.testing.assert_allclose(images, reference_images, atol=1e-6)
  if shuffled:  # each epoch is reshuffled
    assert not np.array_equal(epochs[0][1], epochs[1][1])
  batch_sizes = [len(labels) for _, labels in evaluation]
  assert batch_sizes == [100, 100, 100, 60]  # the partial batch is kept
  np.testing.assert_array_equal(
      np.concatenate([np.asarray(labels) for _, labels in evaluation]),
      digits_reference("eval")[1])


def check_nothing_prepared_ahead(batches, num_prepared, batch_size: int):
  """Taking each of the first batches prepared its samples and no more.

  Args:
    batches: the pipeline, not yet iterated.
    num_prepared: () -> how many samples the pipeline has prepared so far.
    batch_size: its batch size.
  """
  batches = iter(batches)
  for taken in range(1, 5):
    next(batches)
    assert num_prepared() == taken * batch_size


def check_resident_batches_in_turn(read_resident, expected, *,
                                   batch_bytes: int) -> None:
  """`read_resident(**which)`, a side's `make_resident_iterator` with all
  but its start_batch, count and max_bytes given, holds the batches from
  start_batch 2 on (`expected`: batches 2, 3, 4 of the pipeline, as NumPy
  pairs), reads them once and serves them in turn; a byte bound of two
  batches holds two."""
  batches = read_resident(start_batch=2, count=3)
  assert batches.num_batches == 3
  held = [next(batches) for _ in range(4)]
  for batch, want in zip(held, expected):
    np.testing.assert_array_equal(np.asarray(batch[0]), want[0])
    np.testing.assert_array_equal(np.asarray(batch[1]), want[1])
  assert held[3] is held[0]  # read once, then taken in turn
  assert read_resident(count=3,
                       max_bytes=2 * batch_bytes).num_batches == 2


def check_cost_iterations_scale(preprocess_cost) -> None:
  """The side's preprocess_cost calibrates once and scales with the cost."""
  per_ms = preprocess_cost.iterations_per_ms()
  assert per_ms > 0
  assert preprocess_cost.iterations_per_ms() == per_ms  # calibrated once
  assert preprocess_cost.iterations_for_cost(0.0) == 0
  two_ms = preprocess_cost.iterations_for_cost(2.0)
  eight_ms = preprocess_cost.iterations_for_cost(8.0)
  assert two_ms >= 1
  assert abs(eight_ms - 4 * two_ms) <= 4  # rounding only
  with pytest.raises(ValueError):
    preprocess_cost.iterations_for_cost(-1.0)


def check_missing_tfds_names_the_flag(make_cfg, describe, root: str,
                                      empty_dir: str) -> None:
  """A TFDS name not prepared under --data_dir (one that is not there, or
  mnist in an empty directory) is refused naming --tfds_name: the
  pipelines never download."""
  for name, data_dir in (("no_such_dataset", root), ("mnist", empty_dir)):
    cfg = make_cfg(dataset="tfds", data_dir=data_dir, tfds_name=name)
    with pytest.raises(ConfigError, match="never downloads") as error:
      describe(cfg)
    assert error.value.flag == "tfds_name"
    assert str(error.value).startswith(f"--tfds_name={name}:")


def train_only_tfds_config(make_cfg, describe, name: str, data_dir: str,
                           **overrides) -> DataConfig:
  """A TFDS dataset `name` with a train split of 3 RGB 4x4 images and no
  eval split, written under `data_dir`: its config, once the side's
  `describe` found no eval examples."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tensorflow_datasets as tfds
  tfds.dataset_builders.store_as_tfds_dataset(
      name=name, version="1.0.0",
      features=tfds.features.FeaturesDict({
          "image": tfds.features.Image(shape=(4, 4, 3)),
          "label": tfds.features.ClassLabel(num_classes=2)}),
      split_datasets={"train": tf.data.Dataset.from_tensor_slices({
          "image": np.zeros((3, 4, 4, 3), np.uint8),
          "label": np.array([0, 1, 0])})},
      data_dir=data_dir)
  cfg = make_cfg(dataset="tfds", data_dir=data_dir, tfds_name=name,
                 **overrides)
  assert describe(cfg).num_eval_examples == 0
  return cfg
