"""The embedded digits: read without scikit-learn's import, identical to
what scikit-learn's own loader gives."""

import subprocess
import sys

import numpy as np
from sklearn import datasets as sklearn_datasets

from overlap_core.runtime import datasets

from tests.helpers import REPO_ROOT, subprocess_env


def test_digits_read_from_the_file_are_load_digits():
  pixels, digits = datasets._read_digits()  # pylint: disable=protected-access
  reference = sklearn_datasets.load_digits()
  np.testing.assert_array_equal(pixels, reference.data)
  np.testing.assert_array_equal(digits, reference.target)
  splits = datasets.load_digits_splits()
  images, labels = splits["train"]
  assert images.shape == (1437, 8, 8, 1) and images.dtype == np.float32
  assert labels.dtype == np.int32 and len(splits["eval"][1]) == 360
  assert 0.0 <= images.min() and images.max() == 1.0


def test_reading_the_digits_leaves_scikit_learn_unimported():
  check = ("import sys\n"
           "from overlap_core.runtime import datasets\n"
           "datasets.load_digits_splits()\n"
           "print(sorted(m for m in sys.modules if m.startswith('sklearn')))\n")
  done = subprocess.run([sys.executable, "-c", check], cwd=REPO_ROOT,
                        env=subprocess_env(), capture_output=True, text=True,
                        timeout=120, check=True)
  assert done.stdout.strip() == "[]", done.stdout
