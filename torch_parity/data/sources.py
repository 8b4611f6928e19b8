"""Where samples come from, for PyTorch: the four sources behind `--dataset`.

The twin of `tfoverlap.data.sources`, serving the same examples in the same
order. Each source reads a split into raw elements (held by the loader) and
has a decode step that turns one raw element into a float32 [3, S, S] image
in [0, 1]. Decoding is kept apart from reading for the same reasons as in
TensorFlow: `--cache` keeps decoded samples, and `--map_parallelism` spreads
decoding over the loader's workers, so `decode` must be picklable (a
module-level function, bound with `functools.partial`).

- digits: the neutral split of `overlap_core.runtime.datasets`, as TF reads it.
- synthetic: the same pool sizes and label range; pixel values come from
  NumPy's generator keyed by the same (pool seed, index), so they are fixed
  across runs and processes but are not TensorFlow's stateless draws.
- tfds / image_folder: opened through tensorflow-datasets and checked with
  the refusals of `overlap_core.runtime.datasets`, so a missing or
  unreadable data set is refused with the same message as on the TensorFlow
  side (TensorFlow is imported only for these two). TFDS records are
  read once through TensorFlow when the loader is built (they offer no
  random access) and their encoded images decoded by Pillow in the workers;
  an image folder keeps file paths and reads each file when it decodes it.
  PNG pixels equal TensorFlow's; JPEG pixels can differ by a few levels
  (Pillow's DCT is not TensorFlow's INTEGER_FAST one).

Nothing here downloads.
"""

import dataclasses
import functools
import io
import os
from typing import Any, Callable, Dict, Sequence, Tuple

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils import data as torch_data

from overlap_core.runtime import datasets, user_code
from overlap_core.runtime.config import ConfigError, DataConfig
from overlap_core.runtime.datasets import DatasetInfo

# Pillow modes whose pixels are one grey channel as TensorFlow decodes them;
# every other mode is converted to RGB(A) first.
_GREY_MODES = ("L", "I", "I;16", "I;16B", "I;16L")


@dataclasses.dataclass(frozen=True)
class Source:
  """One data set, ready to be read per split.

  Attributes:
    name: for messages, e.g. "digits" or "tfds:mnist".
    num_classes: labels lie in [0, num_classes).
    num_examples: {"train": n, "eval": n}; eval is 0 when there is none.
    read: split ("train" or "eval") -> (raw elements, labels int64 [n]), in
      the order TensorFlow reads them. Runs in the training process only.
    decode: raw element -> float32 [3, image_size, image_size] in [0, 1].
      Picklable: it runs in the loader's worker processes.
  """
  name: str
  num_classes: int
  num_examples: Dict[str, int]
  read: Callable[[str], Tuple[Sequence, np.ndarray]]
  decode: Callable[[Any], torch.Tensor]
  user: bool = False  # the user's Dataset: read gives (it, None)


def describe(cfg: DataConfig) -> DatasetInfo:
  """Sizes and shapes of the data set that `cfg` selects.

  Raises:
    ConfigError: the data set is missing or unreadable, or `cfg` sets a
      knob PyTorch refuses (see `load_source`).
  """
  source = load_source(cfg)
  if source.user:
    x, _ = first_example(cfg.dataset, "train", source.read("train")[0])
    return datasets.user_dataset_info(
        num_classes=source.num_classes, num_examples=source.num_examples,
        inputs_shape=tuple(x.shape), channels_last=False,
        image_size=cfg.image_size)
  return datasets.dataset_info(num_classes=source.num_classes,
                               num_examples=source.num_examples,
                               image_size=cfg.image_size)


def load_source(cfg: DataConfig) -> Source:
  """Opens the source that `cfg.dataset` names.

  Raises:
    ConfigError: naming `dataset`, `data_dir` or `tfds_name` when the data
      set is unknown, missing, has no train split or no images, or cannot be
      decoded, the same refusals as the TensorFlow side. (--data_service
      is refused before, by the compatibility table.)
  """
  loaders = {
      "digits": _digits_source,
      "synthetic": _synthetic_source,
      "tfds": _tfds_source,
      "image_folder": _image_folder_source,
  }
  return datasets.pick_source(cfg, loaders, _user_source)


def _user_source(cfg: DataConfig) -> Source:
  """--dataset=package.module:callable: the user's torch Dataset of
  (x, y) pairs, map-style or iterable; `read` returns it whole (labels
  None) and the loader batches it as it is (it decodes its own samples)."""
  path = cfg.dataset
  fn = user_code.load_callable("dataset", path)
  settings = datasets.user_data_settings(cfg)
  split_sets = {}
  for split in datasets.SPLITS:
    ds = user_code.call_with_settings("dataset", path, fn, settings, split)
    if ds is not None:
      first_example(path, split, ds)  # refuses a wrong type or structure
    split_sets[split] = ds
  if split_sets["train"] is None:
    raise ConfigError("dataset", path, "returned None for split 'train'")
  num_examples = {split: _length(ds) for split, ds in split_sets.items()}
  return Source(name=path, num_classes=cfg.num_classes,
                num_examples=num_examples,
                read=lambda split: (split_sets[split], None), decode=None,
                user=True)


def first_example(path: str, split: str, ds) -> tuple:
  """The first (x, y) of the user's dataset, checked.

  Raises:
    ConfigError: naming --dataset, for what is not a torch Dataset of
      (tensor, target) pairs.
  """
  if not isinstance(ds, torch_data.Dataset):
    raise ConfigError("dataset", path,
                      f"returned {user_code.describe_type(ds)} for split "
                      f"{split!r}; allowed: a torch Dataset (map-style or "
                      "iterable) of (x, y) pairs, or None")
  try:
    example = (next(iter(ds)) if isinstance(ds, torch_data.IterableDataset)
               else ds[0])
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("dataset", path,
                      f"its first {split} example raised "
                      f"{type(e).__name__}: {e}".splitlines()[0]) from None
  if not (isinstance(example, (tuple, list)) and len(example) == 2 and
          torch.is_tensor(example[0])):
    shape = (f"a {len(example)}-tuple" if isinstance(example, (tuple, list))
             else user_code.describe_type(example))
    raise ConfigError("dataset", path,
                      f"split {split!r} yields {shape}; allowed: (x, y) "
                      "pairs, x a tensor")
  return tuple(example)


def _length(ds) -> int:
  """Examples in one pass; 0 for an iterable dataset without a length."""
  if ds is None:
    return 0
  try:
    return len(ds)
  except TypeError:
    return 0


def to_rgb_float(image, image_size: int) -> torch.Tensor:
  """The per-sample conversion that ends every decode, as TensorFlow's.

  Integer images are scaled to [0, 1] the way `tf.image.convert_image_dtype`
  does it (times 1/max in float32); float images are taken as already in
  [0, 1]. Grayscale becomes 3 equal channels, an alpha channel is dropped,
  and the image is resized bilinearly with half-pixel centers and no
  antialiasing, which is what `tf.image.resize(method="bilinear")` does.

  Args:
    image: array [H, W] or [H, W, C] with C in 1, 3, 4, integer or float.
    image_size: side of the square output.

  Returns:
    float32 [3, image_size, image_size] in [0, 1].
  """
  array = np.asarray(image)
  if np.issubdtype(array.dtype, np.integer):
    scale = np.float32(1.0 / np.iinfo(array.dtype).max)
    array = array.astype(np.float32) * scale
  else:
    array = array.astype(np.float32, copy=False)
  if array.ndim == 2:
    array = array[..., np.newaxis]
  if array.shape[-1] == 1:
    array = np.repeat(array, 3, axis=-1)
  elif array.shape[-1] != 3:
    array = array[..., :3]
  tensor = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)
  if tuple(tensor.shape[1:]) != (image_size, image_size):
    tensor = F.interpolate(tensor[None], size=(image_size, image_size),
                           mode="bilinear", align_corners=False,
                           antialias=False)[0]
  return tensor.contiguous()


def decode_image_bytes(data: bytes) -> np.ndarray:
  """PNG, JPEG, GIF or BMP bytes -> pixels, as `tf.image.decode_image`.

  Returns:
    uint8 (or uint16 for 16-bit PNG) [H, W] for grey images, [H, W, 3|4]
    otherwise.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(io.BytesIO(data)) as image:
    if image.mode == "1":
      image = image.convert("L")  # TensorFlow reads 1-bit as 0 or 255
    elif image.mode == "LA":
      image = image.convert("L")
    elif image.mode not in _GREY_MODES + ("RGB", "RGBA"):
      image = image.convert("RGBA" if "A" in image.mode else "RGB")
    return np.asarray(image)


def _digits_source(cfg: DataConfig) -> Source:
  arrays = datasets.load_digits_splits()
  return Source(
      name="digits", num_classes=10,
      num_examples={split: len(labels) for split, (_, labels) in
                    arrays.items()},
      read=functools.partial(_read_arrays, arrays),
      decode=functools.partial(to_rgb_float, image_size=cfg.image_size))


def _read_arrays(arrays, split):
  images, labels = arrays[split]
  return images, labels.astype(np.int64)


def _synthetic_source(cfg: DataConfig) -> Source:
  """Random images drawn per index: a fixed pool that is never stored.

  Indices are laid out as on the TensorFlow side (train first, then eval),
  so the two splits never share an image.
  """
  counts = {"train": datasets.SYNTHETIC_TRAIN_EXAMPLES,
            "eval": datasets.SYNTHETIC_EVAL_EXAMPLES}
  return Source(
      name="synthetic", num_classes=cfg.num_classes, num_examples=counts,
      read=functools.partial(_read_synthetic, cfg.num_classes),
      decode=functools.partial(_synthetic_image, image_size=cfg.image_size))


def _read_synthetic(num_classes: int, split: str):
  start = 0 if split == "train" else datasets.SYNTHETIC_TRAIN_EXAMPLES
  count = (datasets.SYNTHETIC_TRAIN_EXAMPLES if split == "train"
           else datasets.SYNTHETIC_EVAL_EXAMPLES)
  indices = np.arange(start, start + count)
  labels = np.array([
      np.random.default_rng([datasets.POOL_SEED + 1, i]).integers(num_classes)
      for i in indices], np.int64)
  return indices, labels


def _synthetic_image(index, image_size: int) -> torch.Tensor:
  rng = np.random.default_rng([datasets.POOL_SEED, int(index)])
  pixels = rng.random((3, image_size, image_size), dtype=np.float32)
  return torch.from_numpy(pixels)


def _tfds_source(cfg: DataConfig) -> Source:
  # TFDS records are read through TensorFlow; this is the only place the
  # PyTorch side imports it, and only for --dataset=tfds.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  missing = datasets.check_tfds_request(cfg.data_dir, cfg.tfds_name)
  try:
    builder = tfds.builder(cfg.tfds_name, data_dir=cfg.data_dir)
  except (ValueError, AssertionError, OSError) as e:
    # DatasetNotFoundError (a ValueError) for unknown names; other errors for
    # unknown versions or configs: for the user all mean "not here".
    raise missing from e
  if not builder.is_prepared():
    raise missing
  split_names, num_classes = _check_layout(builder, "tfds_name",
                                           cfg.tfds_name)
  encoded = isinstance(builder.info.features["image"], tfds.features.Image)

  def read(split, limit=None):
    # The same records in the same order as the TensorFlow side reads them;
    # encoded images stay encoded, to be decoded by Pillow in the workers.
    ds = builder.as_dataset(
        split=split_names[split], shuffle_files=False,
        read_config=tfds.ReadConfig(try_autocache=False),
        decoders={"image": tfds.decode.SkipDecoding()} if encoded else None)
    if limit is not None:
      ds = ds.take(limit)
    images, labels = [], []
    for example in ds.as_numpy_iterator():
      images.append(example["image"])
      labels.append(example["label"])
    return images, np.asarray(labels, np.int64)

  return _checked_source(Source(
      name=f"tfds:{cfg.tfds_name}", num_classes=num_classes,
      num_examples=_split_sizes(builder, split_names), read=read,
      decode=functools.partial(_decode_stored, image_size=cfg.image_size)),
      "tfds_name", cfg.tfds_name)


def _decode_stored(raw, image_size: int) -> torch.Tensor:
  """An encoded image (bytes) or a stored pixel array -> [3, S, S]."""
  if isinstance(raw, bytes):
    raw = decode_image_bytes(raw)
  return to_rgb_float(raw, image_size)


def _image_folder_source(cfg: DataConfig) -> Source:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  datasets.check_image_folder_dir(cfg.data_dir,
                                  os.path.isdir(cfg.data_dir or ""))
  builder = tfds.ImageFolder(cfg.data_dir)
  datasets.check_image_folder_splits(
      cfg.data_dir, {name: split.num_examples
                     for name, split in builder.info.splits.items()})
  split_names, num_classes = _check_layout(builder, "data_dir", cfg.data_dir)
  label_feature = builder.info.features["label"]

  def read(split, limit=None):
    # TFDS keeps its listing (and its fixed per-split order, which the
    # TensorFlow side reads in) only here; tensorflow-datasets is pinned.
    # pylint: disable-next=protected-access
    examples = builder._split_examples[split_names[split]][:limit]
    return ([example.image_path for example in examples],
            np.array([label_feature.str2int(example.label)
                      for example in examples], np.int64))

  return _checked_source(Source(
      name="image_folder", num_classes=num_classes,
      num_examples=_split_sizes(builder, split_names), read=read,
      decode=functools.partial(_decode_file, image_size=cfg.image_size)),
      "data_dir", cfg.data_dir)


def _check_layout(builder, flag: str, value):
  """({"train": name, "eval": name or None}, num_classes) of a TFDS builder
  with image and label features, refused as the TensorFlow side does."""
  features, splits = builder.info.features, builder.info.splits
  num_classes = (getattr(features["label"], "num_classes", None)
                 if "label" in features else None)
  datasets.check_image_label_layout(flag, value, features=features.keys(),
                                    splits=splits.keys(),
                                    num_classes=num_classes)
  return ({"train": "train", "eval": datasets.eval_split_name(splits.keys())},
          num_classes)


def _split_sizes(builder, split_names) -> Dict[str, int]:
  splits = builder.info.splits
  return {split: (splits[name].num_examples if name else 0)
          for split, name in split_names.items()}


def _checked_source(source: Source, flag: str, value) -> Source:
  """Decodes the first training sample now, so a data set of files that are
  not images fails at startup with one line instead of mid-training."""
  raws, _ = source.read("train", limit=1)
  try:
    source.decode(raws[0])
  except (OSError, ValueError) as e:  # Pillow's UnidentifiedImageError too
    reason = str(e).strip().splitlines()[0] if str(e) else type(e).__name__
    raise datasets.undecodable_images_error(source.name, flag, value,
                                            reason) from e
  return source


def _decode_file(path: str, image_size: int) -> torch.Tensor:
  with open(path, "rb") as f:
    return to_rgb_float(decode_image_bytes(f.read()), image_size)
