"""The digits the package ships: the UCI data set as published, split the
same way in every process."""

import numpy as np

from overlap_core.runtime import datasets

# The UCI data set's test part, as its description gives it: 1797 8x8
# images of counts 0 to 16, and how many of each digit 0 to 9.
NUM_EXAMPLES = 1797
PER_DIGIT = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_the_shipped_file_holds_the_uci_digits():
  pixels, digits = datasets._read_digits()  # pylint: disable=protected-access
  assert pixels.shape == (NUM_EXAMPLES, 64)
  assert np.array_equal(pixels, np.round(pixels))
  assert pixels.min() == 0 and pixels.max() == 16
  assert np.bincount(digits.astype(int)).tolist() == PER_DIGIT


def test_the_splits_partition_the_digits_by_the_pool_seed():
  pixels, _ = datasets._read_digits()  # pylint: disable=protected-access
  splits = datasets.load_digits_splits()
  images, labels = splits["train"]
  assert images.shape == (1437, 8, 8, 1) and images.dtype == np.float32
  assert labels.dtype == np.int32 and len(splits["eval"][1]) == 360
  assert 0.0 <= images.min() and images.max() == 1.0
  # Together exactly the file's rows, each once.
  rows = np.concatenate([images, splits["eval"][0]]).reshape(-1, 64) * 16
  assert sorted(map(bytes, rows.astype(np.uint8))) == sorted(
      map(bytes, pixels.astype(np.uint8)))
