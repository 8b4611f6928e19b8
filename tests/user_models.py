"""Models and datasets a user would bring, for --model/--dataset tests.

Importable by the trainers' subprocesses as `tests.user_models:<name>`
(the repository root is on their PYTHONPATH). Each imports its framework
inside the function, so one module serves both sides.
"""

import numpy as np

from overlap_core.runtime.user_code import Task

NUM_EXAMPLES = {"train": 64, "eval": 16}
FEATURES = 6


def _images(split, image_size, channels, num_classes):
  rng = np.random.default_rng(0 if split == "train" else 1)
  n = NUM_EXAMPLES[split]
  images = rng.random((n, image_size, image_size, channels), np.float32)
  labels = rng.integers(0, num_classes, n).astype(np.int32)
  return images, labels


def _regression_arrays(split):
  rng = np.random.default_rng(2 if split == "train" else 3)
  x = rng.standard_normal((NUM_EXAMPLES[split], FEATURES)).astype(np.float32)
  y = x.sum(axis=1, keepdims=True)
  return x, y


# --- TensorFlow ------------------------------------------------------------


def keras_classifier(image_size, channels, num_classes):
  """A functional Keras classifier: the model alone (classification)."""
  import keras  # pylint: disable=g-import-not-at-top
  inputs = keras.Input((image_size, image_size, channels))
  x = keras.layers.Conv2D(4, 3, padding="same", activation="relu",
                          name="conv")(inputs)
  x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
  outputs = keras.layers.Dense(num_classes, name="logits")(x)
  return keras.Model(inputs, outputs, name="user_cnn")


def keras_regression():
  """A functional Keras regression model, declaring its Task."""
  import keras  # pylint: disable=g-import-not-at-top
  inputs = keras.Input((FEATURES,))
  x = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
  outputs = keras.layers.Dense(1, name="out")(x)
  return keras.Model(inputs, outputs), Task.regression()


def keras_subclassed(num_classes):
  """A subclassed Keras model: no functional graph to cut."""
  import keras  # pylint: disable=g-import-not-at-top

  class Net(keras.Model):

    def __init__(self):
      super().__init__()
      self.flatten = keras.layers.Flatten()
      self.dense = keras.layers.Dense(num_classes)

    def call(self, x):
      return self.dense(self.flatten(x))

  return Net()


def tf_images(split, image_size, num_classes):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.data.Dataset.from_tensor_slices(
      _images(split, image_size, 3, num_classes))


def tf_regression(split):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.data.Dataset.from_tensor_slices(_regression_arrays(split))


def tf_generator(split):
  """Pairs from Python: the tf.data service cannot ship this graph."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x, y = _regression_arrays(split)
  return tf.data.Dataset.from_generator(
      lambda: zip(x, y), output_signature=(
          tf.TensorSpec([FEATURES], tf.float32), tf.TensorSpec([1], tf.float32)))


def tf_images_only(split):
  """The wrong structure: images without targets."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.data.Dataset.from_tensor_slices(_images(split, 8, 3, 10)[0])


# --- PyTorch ---------------------------------------------------------------


def torch_classifier(channels, num_classes):
  """An nn.Module classifier of NCHW images: the module alone."""
  from torch import nn  # pylint: disable=g-import-not-at-top
  return nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU(),
                       nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                       nn.Linear(4, num_classes))


def torch_classifier_noting_loader_workers(channels, num_classes):
  """`torch_classifier` whose every forward appends to the file named by
  $FORWARD_LOG how many worker processes (a DataLoader's) were alive:
  what ran beside it."""
  import multiprocessing  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class Noting(nn.Module):

    def __init__(self):
      super().__init__()
      self.net = torch_classifier(channels, num_classes)

    def forward(self, x):
      with open(os.environ["FORWARD_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{len(multiprocessing.active_children())}\n")
      return self.net(x)

  return Noting()


def torch_regression():
  from torch import nn  # pylint: disable=g-import-not-at-top
  return (nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, 1)),
          Task.regression())


def torch_untraceable():
  """A regression module whose forward branches on a tensor's value:
  torch.fx cannot trace it."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class Branchy(nn.Module):

    def __init__(self):
      super().__init__()
      self.linear = nn.Linear(FEATURES, 1)

    def forward(self, x):
      if x.sum() > 0:
        x = torch.relu(x)
      return self.linear(x)

  return Branchy(), Task.regression()


def torch_images(split, image_size, num_classes):
  """A map-style dataset of ([3, S, S] float, label)."""
  import torch  # pylint: disable=g-import-not-at-top
  images, labels = _images(split, image_size, 3, num_classes)
  return torch.utils.data.TensorDataset(
      torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(),
      torch.from_numpy(labels).long())


def torch_images_slow_on_rank_1(split, image_size, num_classes):
  """`torch_images`, each training sample costing rank 1 (the
  `SLOW_RANK_COST_MS` environment variable, in ms) of real CPU work and
  every other rank nothing: one replica waits for its input, the others
  for it."""
  import os  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from torch_parity.data import preprocess_cost  # pylint: disable=g-import-not-at-top
  images = torch_images(split, image_size, num_classes)
  slow = split == "train" and os.environ.get("RANK") == "1"
  rounds = preprocess_cost.iterations_for_cost(
      float(os.environ["SLOW_RANK_COST_MS"])) if slow else 0

  class SlowOnRank1(torch.utils.data.Dataset):

    def __len__(self):
      return len(images)

    def __getitem__(self, index):
      image, label = images[index]
      return preprocess_cost.apply_cost(image, rounds), label

  return SlowOnRank1()


def torch_regression_stream(split):
  """An iterable dataset of (x [FEATURES], y [1])."""
  import torch  # pylint: disable=g-import-not-at-top
  x, y = _regression_arrays(split)

  class Stream(torch.utils.data.IterableDataset):

    def __iter__(self):
      return iter(zip(torch.from_numpy(x), torch.from_numpy(y)))

  return Stream()


def torch_regression_data(split):
  import torch  # pylint: disable=g-import-not-at-top
  x, y = _regression_arrays(split)
  return torch.utils.data.TensorDataset(torch.from_numpy(x),
                                        torch.from_numpy(y))


def torch_images_only(split):
  import torch  # pylint: disable=g-import-not-at-top
  return torch.utils.data.TensorDataset(
      torch.zeros(NUM_EXAMPLES[split], 3, 8, 8))


# --- Both ------------------------------------------------------------------


def raising_builder():
  raise RuntimeError("no weights here")
