"""Where samples come from: the four sources behind `--dataset`.

Each source reads raw elements per split and has its own decode step that
turns one raw element into `(image float32 [S, S, 3] in [0, 1], label int32)`.
Keeping decode separate from reading is what lets the pipeline cache decoded
samples (`--cache`) and parallelize decoding (`--map_parallelism`).

Nothing here downloads: TFDS datasets are read only from a local `data_dir`
where they were prepared beforehand.
"""

import dataclasses
import os
from typing import Callable, Dict

import tensorflow as tf

from overlap_core.runtime import datasets, user_code
from overlap_core.runtime.config import ConfigError, DataConfig
# The split, sizes, refusals and DatasetInfo are shared with the PyTorch
# pipeline.
from overlap_core.runtime.datasets import (POOL_SEED, SYNTHETIC_EVAL_EXAMPLES,
                                           SYNTHETIC_TRAIN_EXAMPLES,
                                           DatasetInfo, dataset_info,
                                           eval_split_name, load_digits_splits)


@dataclasses.dataclass(frozen=True)
class Source:
  """One data set, ready to be read per split.

  Attributes:
    name: for messages, e.g. "digits" or "tfds:mnist".
    num_classes: labels lie in [0, num_classes).
    num_examples: {"train": n, "eval": n}; eval is 0 when there is none.
    read: split ("train" or "eval") -> unbatched dataset of raw elements.
    decode: raw element (as separate arguments) -> (image, label), the
      image float32 [image_size, image_size, 3] in [0, 1], the label int32.
  """
  name: str
  num_classes: int
  num_examples: Dict[str, int]
  read: Callable[[str], tf.data.Dataset]
  decode: Callable[..., tuple]
  user: bool = False  # the user's callable: read yields (x, y) as is


def describe(cfg: DataConfig) -> DatasetInfo:
  """Sizes and shapes of the data set that `cfg` selects.

  Args:
    cfg: the data configuration.

  Returns:
    The data set's classes and split sizes, and the image shape the
    pipeline produces.

  Raises:
    ConfigError: the data set is missing or unreadable (see `load_source`).
  """
  source = load_source(cfg)
  if source.user:
    return datasets.user_dataset_info(
        num_classes=source.num_classes, num_examples=source.num_examples,
        inputs_shape=tuple(source.read("train").element_spec[0].shape),
        channels_last=True, image_size=cfg.image_size)
  return dataset_info(num_classes=source.num_classes,
                      num_examples=source.num_examples,
                      image_size=cfg.image_size)


def load_source(cfg: DataConfig) -> Source:
  """Opens the source that `cfg.dataset` names.

  Args:
    cfg: the data configuration.

  Returns:
    The opened source; nothing is read yet beyond metadata and, for files
    on disk, one sample to check that it decodes.

  Raises:
    ConfigError: naming `data_dir` or `tfds_name` when the data set is
      missing, has no train split or no images, or cannot be decoded.
  """
  loaders = {
      "digits": _digits_source,
      "synthetic": _synthetic_source,
      "tfds": _tfds_source,
      "image_folder": _image_folder_source,
  }
  return datasets.pick_source(cfg, loaders, _user_source)


def to_rgb_float(image: tf.Tensor, image_size: int) -> tf.Tensor:
  """The per-sample conversion that ends the decode of every stored source.

  Integer images are scaled to [0, 1]; float images are taken as already in
  [0, 1]. Grayscale becomes 3 equal channels, an alpha channel is dropped,
  and the image is resized (bilinear) to `image_size` square.

  Args:
    image: [H, W], [H, W, C] with C in 1, 3, 4, integer or float.
    image_size: side of the square output.

  Returns:
    float32 [image_size, image_size, 3] in [0, 1].
  """
  image = tf.image.convert_image_dtype(image, tf.float32)
  if image.shape.rank == 2:
    image = image[..., tf.newaxis]
  channels = image.shape[-1]
  if channels == 1:
    image = tf.image.grayscale_to_rgb(image)
  elif channels is None:
    image = tf.cond(tf.shape(image)[-1] == 1,
                    lambda: tf.tile(image, [1, 1, 3]),
                    lambda: image[..., :3])
  elif channels != 3:
    image = image[..., :3]
  if image.shape[0] != image_size or image.shape[1] != image_size:
    image = tf.image.resize(image, [image_size, image_size],
                            method="bilinear")
  return tf.ensure_shape(image, [image_size, image_size, 3])


def _digits_source(cfg: DataConfig) -> Source:
  arrays = load_digits_splits()

  def decode(image, label):
    return to_rgb_float(image, cfg.image_size), label

  return Source(
      name="digits", num_classes=10,
      num_examples={split: len(labels) for split, (_, labels) in
                    arrays.items()},
      read=lambda split: tf.data.Dataset.from_tensor_slices(arrays[split]),
      decode=decode)


def _synthetic_source(cfg: DataConfig) -> Source:
  """Random images drawn per index, so the pool is fixed but never stored.

  Drawing sample i with a stateless generator keyed by i gives the same pool
  in every process and every epoch without embedding a large constant in the
  graph (which the data service would have to ship to its workers).
  """
  first_index = {"train": 0, "eval": SYNTHETIC_TRAIN_EXAMPLES}
  counts = {"train": SYNTHETIC_TRAIN_EXAMPLES,
            "eval": SYNTHETIC_EVAL_EXAMPLES}

  def read(split):
    start = first_index[split]
    return tf.data.Dataset.range(start, start + counts[split])

  def decode(index):
    image_seed = tf.stack([tf.constant(POOL_SEED, tf.int64), index])
    label_seed = tf.stack([tf.constant(POOL_SEED + 1, tf.int64), index])
    image = tf.random.stateless_uniform(
        [cfg.image_size, cfg.image_size, 3], seed=image_seed)
    label = tf.random.stateless_uniform(
        [], seed=label_seed, minval=0, maxval=cfg.num_classes, dtype=tf.int32)
    return image, label

  return Source(name="synthetic", num_classes=cfg.num_classes,
                num_examples=counts, read=read, decode=decode)


def _user_source(cfg: DataConfig) -> Source:
  """--dataset=package.module:callable: the user's unbatched (x, y) pairs,
  read as the callable returns them (it decodes its own samples)."""
  path = cfg.dataset
  fn = user_code.load_callable("dataset", path)
  settings = datasets.user_data_settings(cfg)

  def call(split):
    ds = user_code.call_with_settings("dataset", path, fn, settings, split)
    if ds is not None:
      _check_user_dataset(path, split, ds)
    return ds

  train = call("train")
  if train is None:
    raise ConfigError("dataset", path, "returned None for split 'train'")
  if cfg.data_service:
    _check_serializable(path, cfg.data_service, train)
  evaluation = call("eval")
  num_examples = {"train": _cardinality(train),
                  "eval": 0 if evaluation is None else _cardinality(
                      evaluation)}

  def read(split):
    return train if split == "train" else evaluation

  return Source(name=path, num_classes=cfg.num_classes,
                num_examples=num_examples, read=read, decode=None, user=True)


def _check_user_dataset(path: str, split: str, ds) -> None:
  """Refuses what is not an unbatched dataset of (x, y) tensors."""
  if not isinstance(ds, tf.data.Dataset):
    raise ConfigError("dataset", path,
                      f"returned {user_code.describe_type(ds)} for split "
                      f"{split!r}; allowed: an unbatched tf.data.Dataset of "
                      "(x, y) pairs, or None")
  spec = ds.element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2 and all(
      isinstance(s, tf.TensorSpec) for s in spec)):
    raise ConfigError("dataset", path,
                      f"split {split!r} yields {spec}; allowed: (x, y) "
                      "pairs of tensors")


def _check_serializable(path: str, data_service: str, ds) -> None:
  """Refuses the tf.data service for a dataset whose graph cannot be sent
  to the service's workers: one that runs Python (`from_generator`,
  `py_function`)."""
  try:
    # The serialization the service itself performs (no public API).
    ds._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL)
  except tf.errors.OpError as e:
    reason = (e.message or "").strip().splitlines()[0] if e.message else ""
    reason = reason.split("}} ", 1)[-1]  # drop the op's device prefix
    raise ConfigError("data_service", data_service,
                      f"--dataset={path} cannot be sent to the service's "
                      f"workers ({reason}); allowed: empty, or a dataset of "
                      "TensorFlow ops only") from None


def _cardinality(ds) -> int:
  """Examples in one pass; 0 when tf.data cannot tell (or endless)."""
  return max(0, int(ds.cardinality()))


def _tfds_source(cfg: DataConfig) -> Source:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = cfg.tfds_name
  missing = datasets.check_tfds_request(cfg.data_dir, name)
  try:
    builder = tfds.builder(name, data_dir=cfg.data_dir)
  except (ValueError, AssertionError, OSError) as e:
    # DatasetNotFoundError (a ValueError) for unknown names; other errors for
    # unknown versions or configs: for the user all mean "not here".
    raise missing from e
  if not builder.is_prepared():
    raise missing
  return _builder_source(cfg, builder, f"tfds:{name}", "tfds_name", name)


def _image_folder_source(cfg: DataConfig) -> Source:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  datasets.check_image_folder_dir(cfg.data_dir,
                                  os.path.isdir(cfg.data_dir or ""))
  builder = tfds.ImageFolder(cfg.data_dir)
  datasets.check_image_folder_splits(
      cfg.data_dir, {name: split.num_examples
                     for name, split in builder.info.splits.items()})
  return _builder_source(cfg, builder, "image_folder", "data_dir",
                         cfg.data_dir)


def _builder_source(cfg: DataConfig, builder, name: str, flag: str,
                    value) -> Source:
  """A source over a TFDS builder with 'image' and 'label' features.

  Images are read encoded and decoded in the source's decode step (not by
  TFDS while reading), so `--cache` keeps decoded pixels and decoding runs
  with `--map_parallelism`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  features = builder.info.features
  splits = builder.info.splits
  num_classes = (getattr(features["label"], "num_classes", None)
                 if "label" in features else None)
  datasets.check_image_label_layout(flag, value, features=features.keys(),
                                    splits=splits.keys(),
                                    num_classes=num_classes)
  split_names = {"train": "train", "eval": eval_split_name(splits.keys())}
  image_feature = features["image"]
  encoded = isinstance(image_feature, tfds.features.Image)
  # TFDS silently caches small datasets in memory unless told not to, which
  # would make --cache=false cache anyway.
  read_config = tfds.ReadConfig(try_autocache=False)

  def read(split):
    ds = builder.as_dataset(
        split=split_names[split], shuffle_files=False, read_config=read_config,
        decoders={"image": tfds.decode.SkipDecoding()} if encoded else None)
    return ds.map(lambda example: (example["image"], example["label"]))

  def decode(image, label):
    if encoded:
      image = image_feature.decode_example(image)
    return to_rgb_float(image, cfg.image_size), tf.cast(label, tf.int32)

  source = Source(
      name=name, num_classes=num_classes,
      num_examples={split: (splits[s].num_examples if s else 0)
                    for split, s in split_names.items()},
      read=read, decode=decode)
  _check_decodable(source, flag, value)
  return source


def _check_decodable(source: Source, flag: str, value) -> None:
  """Decodes the first training sample now, so a data set of files that are
  not images fails at startup with one line instead of mid-training."""
  try:
    for _ in source.read("train").take(1).map(source.decode):
      pass
  except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
    reason = e.message.strip().splitlines()[0] if e.message else type(e)
    raise datasets.undecodable_images_error(source.name, flag, value,
                                            reason) from e

