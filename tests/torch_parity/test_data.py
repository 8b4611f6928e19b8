"""Tests of torch_parity.data: real PyTorch DataLoaders on the CPU.

Sources are real: the shipped UCI digits, a TFDS dataset this file writes with
TFDS's own writer, and PNG files it writes for an image folder. Where both
frameworks serve the same examples, the tf.data pipeline of tfoverlap.data is
the reference, compared pixel for pixel (NHWC there, NCHW here). Worker
processes are real DataLoader workers.
"""

import collections
import dataclasses
import functools
import multiprocessing
import os
import resource
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import torch
from absl.testing import flagsaver
from PIL import Image

import flags as tfo_flags
from tfoverlap import data as tf_data
from overlap_core.runtime import datasets
from overlap_core.runtime import zoo
from overlap_core.runtime.config import AUTOTUNE, ConfigError
from tests import fixtures
from tests.fixtures import TFDS_NAME, data_config, image_counter
from tests.helpers import PROGRESS_WAIT_S, wait_until
from torch_parity import data, distribute, trainer
from torch_parity.data import device, pipeline, preprocess_cost, sources

DIGITS_TRAIN, DIGITS_EVAL = 1437, 360


make_cfg = data_config

# The settings test_knobs_keep_batches_correct runs: inline and in worker
# processes, cached or not, shuffling or not.
KNOBS = fixtures.knob_settings(
    (0, 1, False, 0),
    (0, 2, True, 256),
    (3, 2, True, 0),
    (AUTOTUNE, 1, False, 256))


def loader(cfg, split="train", task="classification", seed=0, **kwargs):
  return data.make_loader(cfg, split=split, task=task, seed=seed, **kwargs)


def take(batches, count):
  """The first `count` batches, as tuples of NumPy arrays."""
  out = []
  for batch in batches:
    out.append(tuple(t.numpy() for t in batch))
    if len(out) == count:
      break
  return out


def one_pass(batches):
  """All (inputs, targets) of a finite loader or dataset, concatenated."""
  parts = [tuple(np.asarray(t) for t in batch) for batch in batches]
  return tuple(np.concatenate(column) for column in zip(*parts))


def tf_reference(cfg, split, task="classification", upscale=1, count=None):
  """What tfoverlap.data serves for the same configuration (NHWC)."""
  ds = tf_data.make_input_fn(cfg, split=split, task=task, seed=0,
                             upscale=upscale)(None)
  if count is not None:
    ds = ds.take(count)
  return one_pass(ds)


def nhwc(images):
  return np.transpose(images, (0, 2, 3, 1))


def digits_reference(split):
  """The neutral split, NCHW with 3 channels, as decode makes it."""
  images, labels = datasets.load_digits_splits()[split]
  return np.repeat(np.transpose(images, (0, 3, 1, 2)), 3, axis=1), labels


def write_png(path, pixels):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(np.asarray(pixels, np.uint8)).save(path)


# --- sources -----------------------------------------------------------------


def test_digits_describe_and_batches():
  cfg = make_cfg(prefetch=AUTOTUNE, map_parallelism=AUTOTUNE)
  assert data.describe(cfg) == data.DatasetInfo(
      num_classes=10, num_train_examples=DIGITS_TRAIN,
      num_eval_examples=DIGITS_EVAL, image_size=8, channels=3)
  train = loader(cfg)
  assert train.num_workers == pipeline.available_cores()
  batches = take(train, 20)
  images, labels = (np.concatenate(parts) for parts in zip(*batches))
  assert batches[0][0].shape == (16, 3, 8, 8)
  assert batches[0][0].dtype == np.float32 and labels.dtype == np.int64
  assert images.min() >= 0.0 and images.max() <= 1.0 and images.max() > 0.9
  assert set(labels) == set(range(10))


@pytest.mark.parametrize("image_size", [8, 16])
def test_digits_pixels_equal_tensorflow(image_size):
  # 16 upsamples the 8x8 digits: the bilinear resize must match TF's too.
  cfg = make_cfg(image_size=image_size, shuffle_buffer=0, batch_size=100)
  tf_images, tf_labels = tf_reference(cfg, "eval")
  images, labels = one_pass(loader(cfg, split="eval"))
  assert images.shape == (DIGITS_EVAL, 3, image_size, image_size)
  np.testing.assert_array_equal(labels, tf_labels)
  np.testing.assert_allclose(nhwc(images), tf_images, atol=1e-6)
  # Unshuffled training reads the same order as TensorFlow does, and, as
  # its repeat-then-batch, batch 14 holds the end of epoch 1 and the start
  # of epoch 2.
  tf_images, tf_labels = tf_reference(cfg, "train", count=16)
  images, labels = one_pass(take(loader(cfg), 16))
  np.testing.assert_array_equal(labels, tf_labels)
  np.testing.assert_allclose(nhwc(images), tf_images, atol=1e-6)


def test_digits_order_follows_the_seed_and_every_epoch_is_reshuffled():
  cfg = make_cfg(batch_size=DIGITS_TRAIN)
  reference_images, _ = digits_reference("train")
  epochs = {seed: take(loader(cfg, seed=seed), 2) for seed in (1, 2)}
  for images, _ in epochs[1] + epochs[2]:
    assert image_counter(images, 16) == image_counter(reference_images, 16)
  first, second = epochs[1]
  assert not np.array_equal(first[1], second[1])  # reshuffled per epoch
  assert not np.array_equal(epochs[1][0][1], epochs[2][0][1])
  again = take(loader(cfg, seed=1), 1)[0]
  np.testing.assert_array_equal(again[1], first[1])


def test_synthetic_pool_is_fixed_and_the_seed_only_orders_it():
  cfg = fixtures.synthetic_pool_config(make_cfg, data.describe)
  epochs = {seed: take(loader(cfg, seed=seed), 1)[0] for seed in (1, 2)}
  assert epochs[1][1].dtype == np.int64
  fixtures.check_synthetic_pool(
      epochs, one_pass(loader(cfg, split="eval"))[0], (3, 6, 6))


def test_tfds_reads_a_locally_prepared_dataset_as_tensorflow_does(tfds_dir):
  root, written = tfds_dir
  cfg = make_cfg(dataset="tfds", data_dir=root, tfds_name=TFDS_NAME,
                 image_size=12, batch_size=4, shuffle_buffer=0)
  assert data.describe(cfg) == data.DatasetInfo(3, 20, 8, 12, 3)
  images, labels = one_pass(loader(cfg, split="eval"))
  expected = np.repeat(written["test"][0] / 255.0, 3, axis=-1)
  assert (image_counter(nhwc(images), levels=255) ==
          image_counter(expected, levels=255))
  tf_images, tf_labels = tf_reference(cfg, "eval")
  np.testing.assert_array_equal(labels, tf_labels)
  np.testing.assert_array_equal(nhwc(images), tf_images)  # same float32 bits
  # Downscaled to 8, with workers: still TensorFlow's pixels.
  small = dataclasses.replace(cfg, image_size=8, prefetch=2,
                              map_parallelism=2)
  tf_images, tf_labels = tf_reference(small, "train", count=3)
  images, labels = one_pass(take(loader(small), 3))
  assert images.shape == (12, 3, 8, 8)
  np.testing.assert_array_equal(labels, tf_labels)
  np.testing.assert_allclose(nhwc(images), tf_images, atol=1e-6)


def write_color_folder(root, counts, height=10, width=6):
  colors = {"cat": (255, 0, 0), "dog": (0, 0, 255)}
  for split, count in counts:
    for label, color in colors.items():
      for i in range(count):
        write_png(str(root / split / label / f"{i}.png"),
                  np.tile(np.array(color, np.uint8), (height, width, 1)))
  return colors


def test_image_folder_reads_pngs(tmp_path):
  colors = write_color_folder(tmp_path, (("train", 5), ("validation", 2)))
  cfg = make_cfg(dataset="image_folder", data_dir=str(tmp_path),
                 batch_size=4)
  assert data.describe(cfg) == data.DatasetInfo(2, 10, 4, 8, 3)
  images, labels = one_pass(loader(cfg, split="eval"))
  assert images.shape == (4, 3, 8, 8)
  assert sorted(labels) == [0, 0, 1, 1]
  for image, label in zip(images, labels):  # labels sort: cat 0, dog 1
    expected = np.array(colors[["cat", "dog"][label]]) / 255.0
    np.testing.assert_allclose(image, np.broadcast_to(expected[:, None, None],
                                                      image.shape), atol=1e-6)
  tf_images, tf_labels = tf_reference(cfg, "eval")
  np.testing.assert_array_equal(labels, tf_labels)  # TFDS's own file order
  np.testing.assert_allclose(nhwc(images), tf_images, atol=1e-6)


@pytest.mark.parametrize("prefetch,map_parallelism", [(0, 1), (2, 2)])
def test_cache_keeps_decoded_samples_after_the_files_are_gone(
    tmp_path, prefetch, map_parallelism):
  write_color_folder(tmp_path, (("train", 3),))
  files = sorted(tmp_path.glob("train/*/*.png"))
  contents = {path: path.read_bytes() for path in files}
  for cache in (True, False):
    for path, content in contents.items():
      path.write_bytes(content)
    # One epoch per batch. With workers, batches 1 and 2 (two whole epochs)
    # are prepared before the files go, so every later one is served from
    # the cache, or fails without it.
    cfg = make_cfg(dataset="image_folder", data_dir=str(tmp_path),
                   batch_size=6, shuffle_buffer=0, prefetch=prefetch,
                   map_parallelism=map_parallelism, cache=cache)
    batches = iter(loader(cfg))
    first_labels = next(batches)[1]
    next(batches)
    for path in files:
      path.unlink()
    if cache:
      for _ in range(6):
        np.testing.assert_array_equal(next(batches)[1], first_labels)
    else:
      with pytest.raises(FileNotFoundError):
        for _ in range(6):
          next(batches)
    del batches


def test_ranks_read_disjoint_shards_like_tensorflow():
  cfg = make_cfg(batch_size=16)
  reference_images, _ = digits_reference("eval")
  shards = []
  for rank in range(2):
    batches = loader(cfg, split="eval", rank=rank, world_size=2)
    images, labels = one_pass(batches)
    assert len(labels) == DIGITS_EVAL // 2
    assert max(len(y) for _, y in batches) == 8  # the global 16 over 2 ranks
    shards.append(image_counter(images, 16))
    # The same elements as TensorFlow's shard of the same pipeline.
    context = tf.distribute.InputContext(num_input_pipelines=2,
                                         input_pipeline_id=rank,
                                         num_replicas_in_sync=2)
    tf_images, _ = one_pass(tf_data.make_input_fn(
        cfg, split="eval", task="classification", seed=0)(context))
    assert shards[-1] == image_counter(np.transpose(tf_images, (0, 3, 1, 2)),
                                       16)
  assert not shards[0] & shards[1]
  assert shards[0] + shards[1] == image_counter(reference_images, 16)
  first_epochs = [take(loader(dataclasses.replace(cfg, batch_size=1436),
                              rank=rank, world_size=2), 1)[0][0]
                  for rank in range(2)]
  assert not image_counter(first_epochs[0], 16) & image_counter(
      first_epochs[1], 16)
  with pytest.raises(ConfigError, match="divide evenly") as error:
    loader(make_cfg(batch_size=15), rank=0, world_size=2)
  assert error.value.flag == "batch_size"


# --- task shapes -------------------------------------------------------------


@pytest.mark.parametrize("upscale", [2, 4])
def test_super_resolution_pairs_are_tensorflows_area_downscales(upscale):
  cfg = make_cfg(image_size=16, shuffle_buffer=0)
  low, high = take(loader(cfg, task="super_resolution", upscale=upscale),
                   1)[0]
  side = 16 // upscale
  assert low.shape == (16, 3, side, side) and high.shape == (16, 3, 16, 16)
  block_means = high.reshape(16, 3, side, upscale, side, upscale).mean(
      axis=(3, 5))
  np.testing.assert_allclose(low, block_means, atol=1e-6)
  tf_low = tf.image.resize(nhwc(high), [side, side], method="area").numpy()
  np.testing.assert_allclose(nhwc(low), tf_low, atol=1e-6)
  with pytest.raises(ConfigError, match="image_size"):
    loader(cfg, task="super_resolution", upscale=3)


# --- knobs -------------------------------------------------------------------


def test_knob_mapping():
  cores = pipeline.available_cores()
  expected = {
      (0, 1): (0, None, 1),  # inline, sequential
      (0, 3): (0, None, 3),  # inline, 3 sample threads
      (0, AUTOTUNE): (0, None, cores),
      (4, 1): (1, 4, 1),  # one worker, 4 batches ahead
      (4, 2): (2, 2, 1),
      (3, 2): (2, 2, 1),  # 4 in flight: the next multiple of 2
      (1, 4): (4, 1, 1),  # at least one batch per worker
      (AUTOTUNE, 3): (3, 2, 1),
      (AUTOTUNE, AUTOTUNE): (cores, 2, 1),
  }
  for (prefetch, parallelism), settings in expected.items():
    got = pipeline.loader_settings(make_cfg(prefetch=prefetch,
                                            map_parallelism=parallelism))
    assert (got.num_workers, got.prefetch_factor,
            got.sample_threads) == settings, (prefetch, parallelism)
  six_ahead = pipeline.loader_settings(make_cfg(prefetch=6,
                                                map_parallelism=3))
  assert six_ahead.batches_ahead == 6
  for flag, value in (("map_parallelism", 0), ("prefetch", -2)):
    with pytest.raises(ConfigError) as error:
      pipeline.loader_settings(make_cfg(**{flag: value}))
    assert error.value.flag == flag


@pytest.mark.parametrize("knobs", KNOBS)
def test_knobs_keep_batches_correct(knobs):
  cfg = make_cfg(**knobs, batch_size=DIGITS_TRAIN)
  train = loader(cfg, seed=3)
  settings = pipeline.loader_settings(cfg)
  assert train.num_workers == settings.num_workers
  if settings.num_workers:
    assert train.prefetch_factor == settings.prefetch_factor
  # With cache, the second epoch comes from memory.
  fixtures.check_knobs_kept_batches(
      take(train, 2),
      loader(dataclasses.replace(cfg, batch_size=100), split="eval"),
      digits_reference, shuffled=bool(knobs["shuffle_buffer"]))


def test_skip_batches_yields_the_tail_of_an_uninterrupted_stream():
  # 1437 / 100: epoch 1 ends inside batch 14, so the resumed stream crosses
  # an epoch boundary in a batch that mixes two epochs.
  cfg = make_cfg(batch_size=100, shuffle_buffer=256, prefetch=2,
                 map_parallelism=2, preprocess_cost_ms=0.02)
  uninterrupted = take(loader(cfg, seed=5), 17)
  resumed = take(loader(cfg, seed=5, skip_batches=13), 4)
  for (x1, y1), (x2, y2) in zip(uninterrupted[13:], resumed):
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(x1, x2)
  # Also per rank, and for evaluation (which resumes inside its one pass).
  ranked = take(loader(cfg, seed=5, rank=1, world_size=2), 9)
  np.testing.assert_array_equal(
      take(loader(cfg, seed=5, rank=1, world_size=2, skip_batches=7), 1)[0][1],
      ranked[7][1])
  eval_cfg = dataclasses.replace(cfg, prefetch=0)
  eval_labels = [y for _, y in take(loader(eval_cfg, split="eval"), 4)]
  resumed_eval = take(loader(eval_cfg, split="eval", skip_batches=2), 9)
  assert len(resumed_eval) == 2
  np.testing.assert_array_equal(resumed_eval[0][1], eval_labels[2])


def test_skip_batches_prepares_none_of_the_skipped(monkeypatch):
  prepared = []
  cost = preprocess_cost.apply_cost

  def counting_cost(image, iterations):
    prepared.append(iterations)
    return cost(image, iterations)

  monkeypatch.setattr(preprocess_cost, "apply_cost", counting_cost)
  cfg = make_cfg(preprocess_cost_ms=0.05)
  batches = iter(loader(cfg, skip_batches=500))  # 5.6 epochs of 1437
  images, _ = next(batches)
  assert len(prepared) == 16  # this batch's samples, none of the skipped
  assert all(iterations > 0 for iterations in prepared)
  assert images.shape == (16, 3, 8, 8)


def test_inline_map_parallelism_prepares_samples_on_threads(monkeypatch):
  threads = collections.Counter()
  cost = preprocess_cost.apply_cost

  def recording_cost(image, iterations):
    threads[threading.current_thread().name.split("_")[0]] += 1
    return cost(image, iterations)

  monkeypatch.setattr(preprocess_cost, "apply_cost", recording_cost)
  sequential = take(loader(make_cfg(map_parallelism=1)), 2)
  assert threads == {"MainThread": 32}
  threads.clear()
  parallel = take(loader(make_cfg(map_parallelism=2)), 2)
  assert threads == {"sample": 32}  # none on the training thread
  for (x1, y1), (x2, y2) in zip(sequential, parallel):  # same order
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(x1, x2)


def test_preprocess_cost_iterations_scale_with_cost():
  fixtures.check_cost_iterations_scale(preprocess_cost)
  rounds, checksum = preprocess_cost.burn(0.3, 7)
  assert rounds == 7 and np.isfinite(checksum)


def test_preprocess_cost_burns_cpu_where_samples_are_prepared():
  cost_ms, num_samples = 5.0, 32
  nominal_s = cost_ms * num_samples / 1e3
  preprocess_cost.iterations_per_ms()  # calibrate outside the measurement
  plain = take(loader(make_cfg(shuffle_buffer=0)), 2)
  # Inline: the training process itself burns the CPU.
  start = time.process_time()
  costly = take(loader(make_cfg(shuffle_buffer=0,
                                preprocess_cost_ms=cost_ms)), 2)
  assert time.process_time() - start > 0.5 * nominal_s
  for (x1, y1), (x2, y2) in zip(plain, costly):  # values untouched
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
  # With workers: they burn it; their CPU time is counted once they exit.
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  batches = iter(loader(make_cfg(preprocess_cost_ms=cost_ms, prefetch=2,
                                 map_parallelism=2)))
  for _ in range(2):
    next(batches)
  del batches  # shuts the workers down and reaps them
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  workers_cpu_s = ((after.ru_utime + after.ru_stime) -
                   (before.ru_utime + before.ru_stime))
  assert workers_cpu_s > 0.5 * nominal_s


# --- devices -----------------------------------------------------------------


def test_cpu_prefetcher_yields_the_same_batches_in_order():
  cfg = make_cfg(batch_size=64, prefetch=2, map_parallelism=2)
  direct = take(loader(cfg, split="eval"), 100)
  staged = device.make_device_prefetcher(loader(cfg, split="eval"), "cpu",
                                         depth=2)
  assert isinstance(staged, device.ThreadPrefetcher)
  prefetched = take(staged, 100)
  assert len(prefetched) == len(direct) == 6  # one pass, then StopIteration
  for (x1, y1), (x2, y2) in zip(direct, prefetched):
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
  with pytest.raises(StopIteration):
    next(staged)
  train = device.make_device_prefetcher(loader(cfg, seed=4), "cpu", depth=3)
  for (x1, y1), (x2, y2) in zip(take(loader(cfg, seed=4), 5), take(train, 5)):
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(x1, x2)
  train.close()
  with pytest.raises(StopIteration):
    next(train)
  with pytest.raises(ValueError, match="depth"):
    device.make_device_prefetcher([], "cpu", depth=0)


def test_cpu_prefetcher_raises_the_sources_error_on_the_callers_thread():

  def failing():
    yield (torch.zeros(2),)
    raise OSError("disk gone")

  staged = device.make_device_prefetcher(failing(), "cpu", depth=2)
  np.testing.assert_array_equal(next(staged)[0].numpy(), [0.0, 0.0])
  with pytest.raises(OSError, match="disk gone"):
    next(staged)


def _next_within(iterator, bound_s: float):
  """next(iterator) on a helper thread: what it returned or raised, or a
  failed test when it still waits after `bound_s` (instead of a hung suite).
  """
  outcome = {}

  def call():
    try:
      outcome["value"] = next(iterator)
    except BaseException as e:  # pylint: disable=broad-except
      outcome["error"] = e

  caller = threading.Thread(target=call, daemon=True)
  caller.start()
  caller.join(bound_s)
  assert not caller.is_alive(), f"next() still waiting after {bound_s} s"
  return outcome


def test_cpu_prefetcher_gives_up_on_a_source_that_never_yields():
  never = threading.Event()

  def stuck():
    yield (torch.zeros(2),)
    never.wait()  # a hung DataLoader worker, a source blocked on a lock
    yield (torch.ones(2),)

  staged = device.make_device_prefetcher(stuck(), "cpu", depth=2,
                                         timeout_s=0.5)
  try:
    assert "value" in _next_within(staged, 60)
    # Generous: the bound only turns a hang into a failure; what is tested
    # is that next() ends by itself, with the timeout named.
    error = _next_within(staged, 60).get("error")
    assert isinstance(error, TimeoutError), error
    assert "no batch from the input pipeline in 0.5 s" in str(error)
    with pytest.raises(StopIteration):
      next(staged)
  finally:
    never.set()  # lets the prefetch thread end
    staged.close()
  with pytest.raises(ValueError, match="timeout_s"):
    device.make_device_prefetcher([], "cpu", depth=1, timeout_s=0)


def test_cpu_prefetcher_reraises_what_ended_its_thread():

  class Fatal(BaseException):
    """Not an Exception: what used to end the thread without a word."""

  def fatal():
    yield (torch.zeros(2),)
    raise Fatal("source gave up")

  staged = device.make_device_prefetcher(fatal(), "cpu", depth=2)
  assert "value" in _next_within(staged, 60)
  error = _next_within(staged, 60).get("error")
  assert isinstance(error, Fatal) and "source gave up" in str(error)


def test_resident_batches_are_the_same_tensors_every_step():
  cfg = make_cfg(dataset="synthetic", synthetic_on_device=True, batch_size=8)
  batches = device.make_resident_iterator(cfg, task="classification", seed=0,
                                          upscale=1, device="cpu")
  first, second = next(batches), next(batches)
  assert first is second  # no pipeline: the very same tensors every step
  assert first[0].shape == (8, 3, 8, 8) and first[0].device.type == "cpu"
  expected = take(loader(cfg), 1)
  np.testing.assert_array_equal(first[0].numpy(), expected[0][0])
  per_rank = [data.make_resident_iterator(
      cfg, task="classification", seed=0, upscale=1, device="cpu", rank=rank,
      world_size=2) for rank in range(2)]
  halves = [next(batches)[0].numpy() for batches in per_rank]
  assert halves[0].shape == (4, 3, 8, 8)
  assert not image_counter(halves[0]) & image_counter(halves[1])
  sr = next(data.make_resident_iterator(cfg, task="super_resolution", seed=0,
                                        upscale=2, device="cpu"))
  assert sr[0].shape == (8, 3, 4, 4) and sr[1].shape == (8, 3, 8, 8)



def test_resident_batches_from_a_start_are_the_loaders_in_turn():
  cfg = make_cfg(dataset="synthetic", batch_size=8)
  # 8 images of 3 x 8 x 8 float32 and 8 int64 labels: 6208 bytes a batch.
  fixtures.check_resident_batches_in_turn(
      functools.partial(data.make_resident_iterator, cfg,
                        task="classification", seed=0, upscale=1,
                        device="cpu"),
      take(loader(cfg), 5)[2:5], batch_bytes=6208)

# --- errors ------------------------------------------------------------------


def test_missing_tfds_dataset_names_the_flag(tfds_dir, tmp_path):
  fixtures.check_missing_tfds_names_the_flag(
      make_cfg, data.describe, tfds_dir[0], str(tmp_path))
  with pytest.raises(ConfigError) as error:
    loader(make_cfg(dataset="tfds", data_dir=None))
  assert error.value.flag == "data_dir"


def test_tfds_without_eval_split_refuses_evaluation(tmp_path):
  cfg = fixtures.train_only_tfds_config(
      make_cfg, data.describe, "train_only_torch", str(tmp_path),
      batch_size=2)
  with pytest.raises(ConfigError, match="--evaluate"):
    loader(cfg, split="eval")
  images, labels = take(loader(cfg), 2)[1]  # training still works
  assert images.shape == (2, 3, 8, 8) and set(labels) <= {0, 1}


def test_bad_image_folders_name_data_dir(tmp_path):
  (tmp_path / "empty").mkdir()
  for path in (str(tmp_path / "does_not_exist"), str(tmp_path / "empty")):
    with pytest.raises(ConfigError) as error:
      data.describe(make_cfg(dataset="image_folder", data_dir=path))
    assert error.value.flag == "data_dir"
    assert str(error.value).startswith("--data_dir=")


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="split"):
    loader(make_cfg(), split="validation")
  with pytest.raises(ValueError, match="task"):
    loader(make_cfg(), task="detection")
  with pytest.raises(ValueError, match="rank"):
    loader(make_cfg(), rank=2, world_size=2)
  with pytest.raises(ValueError, match="skip_batches"):
    loader(make_cfg(), skip_batches=-1)
  with pytest.raises(ConfigError, match="allowed: digits"):
    data.describe(make_cfg(dataset="imagenet"))


# --- knobs, by their effect ----------------------------------------------
# Each test counts the samples a loader really prepares; none reads back the
# value of the knob it is about.

# Bounds a wait for work that a correct loader does at once; reached only
# when the behaviour under test is broken.
WAIT_S = PROGRESS_WAIT_S
# Worker processes are forked, so they run the counting functions patched in
# here and share the counters made from this context.
FORK = multiprocessing.get_context("fork")



def count_prepared_samples(monkeypatch, barrier=None):
  """Counts samples prepared in this process and in forked workers.

  Every sample goes through `preprocess_cost.apply_cost` where it is
  prepared, cost or not. With `barrier`, each process's first sample waits
  there until as many processes have begun one as the barrier has parties.

  Returns:
    A `multiprocessing.Value`; `.value` is the count.
  """
  prepared = FORK.Value("q", 0)
  apply_cost = preprocess_cost.apply_cost
  waited = []  # per process: a forked worker starts with this one's copy

  def counting_cost(image, iterations):
    with prepared.get_lock():
      prepared.value += 1
    if barrier is not None and not waited:
      waited.append(True)
      barrier.wait()  # BrokenBarrierError reaches the caller's next()
    return apply_cost(image, iterations)

  monkeypatch.setattr(preprocess_cost, "apply_cost", counting_cost)
  return prepared


def forked(batches):
  """`batches` with its worker processes forked from this one."""
  batches.multiprocessing_context = FORK
  return batches


def test_prefetch_0_prepares_nothing_ahead_of_the_step(monkeypatch):
  prepared = count_prepared_samples(monkeypatch)
  cfg = make_cfg(prefetch=0, map_parallelism=1)
  inline = loader(cfg)
  # Inline loading runs on this thread only: nothing else can have prepared
  # a sample, and nothing can behind the test's back.
  assert inline.num_workers == 0
  fixtures.check_nothing_prepared_ahead(inline, lambda: prepared.value,
                                        cfg.batch_size)


def test_prefetch_n_prepares_n_batches_ahead_of_the_step(monkeypatch):
  depth = 3
  prepared = count_prepared_samples(monkeypatch)
  cfg = make_cfg(prefetch=depth, map_parallelism=1)
  batches = iter(forked(loader(cfg)))
  next(batches)
  # With the consumer idle, only the batches in flight can grow the count.
  wait_until(lambda: prepared.value >= (1 + depth) * cfg.batch_size,
             f"{depth} batches prepared ahead")
  del batches  # stops the worker


def test_map_parallelism_n_prepares_in_n_processes_at_once(monkeypatch):
  # Each worker's first sample waits for the other's: one worker alone
  # would stop there until the wait breaks.
  barrier = FORK.Barrier(2, timeout=WAIT_S)
  count_prepared_samples(monkeypatch, barrier=barrier)
  batches = iter(forked(loader(make_cfg(prefetch=2, map_parallelism=2))))
  for _ in range(3):
    next(batches)
  del batches


@pytest.mark.parametrize("cache, decodes_per_sample", [(True, 1),
                                                       (False, 2)])
def test_cache_decodes_each_sample_once_across_epochs(monkeypatch, cache,
                                                      decodes_per_sample):
  decoded = []
  load_source = sources.load_source

  def counting_source(cfg):
    source = load_source(cfg)

    def counting_decode(element):
      decoded.append(1)
      return source.decode(element)

    return dataclasses.replace(source, decode=counting_decode)

  monkeypatch.setattr(sources, "load_source", counting_source)
  # One batch is one epoch; inline, so every decode is counted here.
  cfg = make_cfg(cache=cache, batch_size=DIGITS_TRAIN, shuffle_buffer=0)
  first, second = take(loader(cfg), 2)
  np.testing.assert_array_equal(first[0], second[0])
  assert len(decoded) == decodes_per_sample * DIGITS_TRAIN


def train_config(*args):
  """The TrainConfig the trainers build from these command-line arguments."""
  tfo_flags.define_flags()
  with flagsaver.flagsaver():
    tfo_flags.FLAGS.unparse_flags()
    tfo_flags.FLAGS(["torch_parity.train", *args])
    return tfo_flags.to_config()


@pytest.mark.parametrize("prefetch_to_device", [True, False])
def test_trainer_stages_batches_ahead_only_with_prefetch_to_device(
    monkeypatch, prefetch_to_device):
  # On a host without a GPU the batches end up on the CPU either way; the
  # staging shows in the work done ahead of the step. Loading is inline
  # (--prefetch=0), so the device prefetcher is the only thing that can run
  # ahead: by its depth, device_buffer_size(0) = 1 batch.
  prepared = count_prepared_samples(monkeypatch)
  config = train_config("--model=mlp", "--strategy=default",
                        "--batch_size=16", "--prefetch=0",
                        "--map_parallelism=1",
                        f"--prefetch_to_device={prefetch_to_device}")
  strategy = distribute.build_strategy(config.distribute)
  depth = datasets.device_buffer_size(config.data.prefetch)
  batch_size = config.data.batch_size
  batches = trainer._build_train_batches(  # pylint: disable=protected-access
      config, zoo.MODELS["mlp"], strategy, first_step=1)
  try:
    for taken in range(1, 4):
      images, _ = next(batches)
      assert images.device == strategy.device
      if prefetch_to_device:
        wait_until(lambda: prepared.value >= (taken + 1) * batch_size,  # pylint: disable=cell-var-from-loop
                   f"a batch staged after {taken} taken")
        # The staged batches wait in a queue of `depth`, plus one that the
        # thread may hold while the queue is full.
        assert prepared.value <= (taken + depth + 1) * batch_size
      else:
        assert prepared.value == taken * batch_size
  finally:
    if prefetch_to_device:
      batches.close()
      # close() lets the thread finish the batch it is preparing; left
      # running, it would count into the next test's counter.
      batches._thread.join(WAIT_S)  # pylint: disable=protected-access
