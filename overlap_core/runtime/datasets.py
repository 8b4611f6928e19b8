"""What both input pipelines agree on about data sets, framework-neutral.

The TensorFlow pipeline (`tfoverlap.data`) and the PyTorch one
(`torch_parity.data`) must serve the same examples, split the same way, with
the same sizes and the same refusals. Everything that decides that without
touching a tensor lives here, once: the `DatasetInfo` both `describe()`s
return, the digits train/eval split, the synthetic pool's sizes, which TFDS
split counts as the evaluation split, the checks on a pipeline request, how
many batches a resident iterator holds, and how deep the device buffer
is. Nothing here imports TensorFlow or PyTorch.
"""

import dataclasses
import functools
import itertools
import math
import os
from typing import Callable, Dict, Iterable, Mapping, Optional, TypeVar

import numpy as np

from overlap_core.runtime import user_code
from overlap_core.runtime.config import AUTOTUNE, ConfigError

SPLITS = ("train", "eval")
TASKS = ("classification", "super_resolution")

SYNTHETIC_TRAIN_EXAMPLES = 1024
SYNTHETIC_EVAL_EXAMPLES = 256
# Fixed, independent of the run seed: the data set is the same in every run,
# only the order the run seed shuffles it in changes.
POOL_SEED = 0
DIGITS_EVAL_FRACTION = 0.2
EVAL_SPLIT_NAMES = ("test", "validation")  # first one present is used

# Device buffer depth when --prefetch=autotune: device-side buffers cannot be
# autotuned, and two batches is what hides one step's copy behind the next.
AUTOTUNE_DEVICE_BUFFER = 2


Source = TypeVar("Source")


def pick_source(cfg, loaders: Mapping[str, Callable[..., Source]],
                user_source: Callable[..., Source]) -> Source:
  """The source `cfg.dataset` names: the user's callable for an import
  path, else the side's loader of that built-in name (both sides know the
  same names).

  Raises:
    ConfigError: naming `dataset` when it is neither.
  """
  if user_code.is_import_path(cfg.dataset):
    return user_source(cfg)
  if cfg.dataset not in loaders:
    raise ConfigError("dataset", cfg.dataset,
                      f"allowed: {', '.join(loaders)}")
  return loaders[cfg.dataset](cfg)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the model and the step ledger need to know about a data set."""
  num_classes: int
  num_train_examples: int
  num_eval_examples: int  # 0 when the source has no evaluation split
  image_size: int
  channels: int  # 3 for the zoo's sources (grayscale is expanded); the
  # user's dataset's own


def dataset_info(*, num_classes: int, num_examples: Dict[str, int],
                 image_size: int) -> DatasetInfo:
  """The `DatasetInfo` of an opened source, as both `describe()`s return it.

  Args:
    num_classes: the source's label count.
    num_examples: {"train": n, "eval": n}, eval 0 when there is none.
    image_size: the side both pipelines resize every image to.
  """
  # Both pipelines decode every source to RGB, grayscale ones included.
  return DatasetInfo(num_classes=num_classes,
                     num_train_examples=num_examples["train"],
                     num_eval_examples=num_examples["eval"],
                     image_size=image_size,
                     channels=3)


def user_dataset_info(*, num_classes: int, num_examples: Dict[str, int],
                      inputs_shape: tuple, channels_last: bool,
                      image_size: int) -> DatasetInfo:
  """The `DatasetInfo` of the user's (x, y) dataset, from one example's
  input shape: channels are its last axis (TensorFlow) or its first
  (PyTorch, for an image [C, H, W]); image_size its first spatial side, or
  --image_size for inputs that are not images."""
  if len(inputs_shape) == 3:
    channels = inputs_shape[-1] if channels_last else inputs_shape[0]
    side = inputs_shape[0] if channels_last else inputs_shape[1]
  else:
    channels = inputs_shape[-1] if inputs_shape else 1
    side = image_size
  return DatasetInfo(num_classes=num_classes,
                     num_train_examples=num_examples["train"],
                     num_eval_examples=num_examples["eval"],
                     image_size=int(side or image_size),
                     channels=int(channels or 1))


def user_data_settings(cfg) -> dict:
  """The run's settings a --dataset callable may ask for by keyword."""
  return {"image_size": cfg.image_size, "num_classes": cfg.num_classes,
          "batch_size": cfg.batch_size}


def check_input_request(*, split: str, task: str, image_size: int,
                        upscale: int) -> None:
  """Refuses a pipeline request that no source could serve.

  Args:
    split: "train" or "eval".
    task: "classification" or "super_resolution".
    image_size: side of the (high-resolution) images.
    upscale: super-resolution factor; must divide image_size.

  Raises:
    ValueError: unknown split or task (a programming error, not a flag).
    ConfigError: image_size is not a multiple of upscale.
  """
  if split not in SPLITS:
    raise ValueError(f"split={split!r}: allowed: {', '.join(SPLITS)}")
  if task not in TASKS + ("regression",):
    raise ValueError(f"task={task!r}: allowed: {', '.join(TASKS)}")
  if upscale < 1 or image_size % upscale:
    raise ConfigError("image_size", image_size,
                      f"must be a multiple of the upscale factor {upscale}")


def no_eval_split_error(source_name: str) -> ConfigError:
  """The refusal to evaluate on a source without an evaluation split."""
  return ConfigError("evaluate", True,
                     f"{source_name} has no {' or '.join(EVAL_SPLIT_NAMES)} "
                     "split to evaluate on; allowed: --evaluate=false or a "
                     "dataset with one")


NEVER_DOWNLOADS = "tfoverlap never downloads"
IMAGE_FOLDER_LAYOUT = "<data_dir>/<split>/<label>/<image>.png|jpg"


def check_tfds_request(data_dir: str, tfds_name: str) -> ConfigError:
  """Refuses --dataset=tfds without a local directory; else returns the
  refusal to raise when the dataset is not prepared there."""
  if not data_dir:
    raise ConfigError("data_dir", data_dir,
                      "--dataset=tfds needs the local directory the dataset "
                      f"was prepared in ({NEVER_DOWNLOADS})")
  return ConfigError(
      "tfds_name", tfds_name,
      f"not prepared under --data_dir={data_dir}; allowed: a TFDS "
      f"dataset already built there ({NEVER_DOWNLOADS}; prepare it "
      f"beforehand, e.g. `tfds build {tfds_name} --data_dir={data_dir}`)")


def check_image_folder_dir(data_dir: str, is_dir: bool) -> None:
  """Refuses --dataset=image_folder without an existing directory."""
  if not data_dir or not is_dir:
    raise ConfigError("data_dir", data_dir,
                      f"allowed: an existing local directory laid out as "
                      f"{IMAGE_FOLDER_LAYOUT}")


def check_image_folder_splits(data_dir: str,
                              split_sizes: Dict[str, int]) -> None:
  """Refuses an image folder with no images in a train split."""
  if not split_sizes.get("train"):
    raise ConfigError("data_dir", data_dir,
                      f"no images in a train split (found splits "
                      f"{sorted(split_sizes)}); allowed: a directory laid "
                      f"out as {IMAGE_FOLDER_LAYOUT} with a train split")


def check_image_label_layout(flag: str, value, *, features: Iterable[str],
                             splits: Iterable[str],
                             num_classes: Optional[int]) -> None:
  """Refuses a stored data set that is not images with class labels."""
  features, splits = sorted(features), sorted(splits)
  if "image" not in features or "label" not in features:
    raise ConfigError(flag, value,
                      f"needs features 'image' and 'label'; found {features}")
  if "train" not in splits:
    raise ConfigError(flag, value, f"needs a 'train' split; found {splits}")
  if not num_classes:
    raise ConfigError(flag, value,
                      "needs a 'label' feature that is a ClassLabel")


def undecodable_images_error(source_name: str, flag: str, value,
                             reason) -> ConfigError:
  """The refusal of a data set whose first image does not decode."""
  return ConfigError(flag, value,
                     f"cannot decode the images of {source_name} ({reason}); "
                     "allowed: PNG, JPEG, GIF or BMP images")


def eval_split_name(split_names: Iterable[str]) -> Optional[str]:
  """The split of a stored data set that `split="eval"` reads, or None."""
  available = set(split_names)
  return next((name for name in EVAL_SPLIT_NAMES if name in available), None)


def per_replica_batch_size(batch_size: int, num_replicas: int) -> int:
  """The global batch divided over the replicas that share it.

  Raises:
    ConfigError: batch_size does not divide evenly.
  """
  if batch_size % num_replicas:
    raise ConfigError("batch_size", batch_size,
                      f"must divide evenly over {num_replicas} replicas")
  return batch_size // num_replicas


Batch = TypeVar("Batch")


def take_resident(batches: Iterable[Batch], count: int, *,
                  max_bytes: Optional[int],
                  nbytes: Callable[[Batch], int]) -> list:
  """The first `count` of `batches` to hold resident, or fewer where
  holding the next would pass `max_bytes` (None: no bound): at least one.

  Raises:
    ValueError: count < 1, or `batches` holds none.
  """
  if count < 1:
    raise ValueError(f"count={count}: allowed: 1 or more")
  held, held_bytes = [], 0
  for batch in itertools.islice(batches, count):
    size = nbytes(batch)
    if held and max_bytes is not None and held_bytes + size > max_bytes:
      break
    held.append(batch)
    held_bytes += size
  if not held:
    raise ValueError("no batch to hold resident: the source is empty")
  return held


def device_buffer_size(prefetch: int) -> int:
  """Batches buffered per device: the prefetch depth, at least 1."""
  if prefetch == AUTOTUNE:
    return AUTOTUNE_DEVICE_BUFFER
  return max(1, prefetch)


# The UCI 8x8 digits the package ships (data/README.md): 1797 rows of 64
# pixel counts (0 to 16), then the digit.
DIGITS_FILE = os.path.join(os.path.dirname(__file__), "data",
                           "digits.csv.gz")


def _read_digits() -> tuple:
  """(pixels [1797, 64], digits [1797]), as the file holds them."""
  table = np.loadtxt(DIGITS_FILE, delimiter=",")
  return table[:, :-1], table[:, -1]


@functools.lru_cache(maxsize=1)
def load_digits_splits() -> Dict[str, tuple]:
  """The shipped digits, split identically in every process and run.

  Returns:
    {"train": (images, labels), "eval": (images, labels)}: images float32
    [n, 8, 8, 1] in [0, 1], labels int32 [n]; 1437 and 360 examples.
  """
  pixels, target = _read_digits()
  images = (pixels.reshape(-1, 8, 8) / 16.0).astype(np.float32)[
      ..., np.newaxis]
  labels = target.astype(np.int32)
  order = np.random.default_rng(POOL_SEED).permutation(len(labels))
  num_eval = math.ceil(DIGITS_EVAL_FRACTION * len(labels))
  eval_idx, train_idx = order[:num_eval], order[num_eval:]
  return {"train": (images[train_idx], labels[train_idx]),
          "eval": (images[eval_idx], labels[eval_idx])}
