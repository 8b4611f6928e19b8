"""Fixtures and helpers that both framework sides' tests use, written once.

tests/conftest.py registers this module as a plugin, so its fixtures reach
every test without an import; its helpers are imported by name. Nothing here
imports a framework at module level: the GPU machines have PyTorch only.
"""

import collections
import dataclasses

import numpy as np
import pytest

from overlap_core.runtime.config import DataConfig

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
