"""Tests of tfoverlap.data: real tf.data pipelines on the CPU.

Sources are real: the shipped UCI digits, a TFDS dataset this file writes with
TFDS's own writer, and PNG files it writes for an image folder. Distribution
runs MirroredStrategy over the two logical CPUs that conftest.py creates.
"""

import collections
import dataclasses
import functools
import os
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfoverlap import data, distribute
from overlap_core.runtime import datasets
from overlap_core.runtime.config import AUTOTUNE, ConfigError, DataConfig
from tests import fixtures
from tests.fixtures import TFDS_NAME, data_config, image_counter
from tests.helpers import PROGRESS_WAIT_S, wait_until
from tfoverlap.data import device, pipeline, preprocess_cost, sources

DIGITS_TRAIN, DIGITS_EVAL = 1437, 360
# Bounds a wait for work that a correct pipeline does at once; reached only
# when the behaviour under test is broken.
WAIT_S = PROGRESS_WAIT_S
# The smallest cost that still puts the per-sample cost map in the pipeline:
# the map is where the tests below count prepared samples.
COUNTED_COST_MS = 0.01
# Dataset ops that run work on threads of their own, ahead of the consumer.
ASYNC_OP_PREFIXES = ("Prefetch", "Parallel", "MapAndBatch")

# The settings test_knobs_keep_batches_correct runs: each knob off, set and
# autotuned, shuffling a part of the data and all of it.
KNOBS = fixtures.knob_settings(
    (0, 1, False, 0),
    (3, 4, True, 0),
    (AUTOTUNE, AUTOTUNE, False, 256),
    (0, AUTOTUNE, True, DIGITS_TRAIN),
    (3, 1, False, 64),
    (AUTOTUNE, 4, True, 256))


def make_cfg(**overrides) -> DataConfig:
  # tf.data's own defaults: AUTOTUNE prefetch and parallel maps.
  return data_config(**{"prefetch": AUTOTUNE, "map_parallelism": AUTOTUNE,
                        **overrides})


def first_batches(ds, count):
  return [tuple(t.numpy() for t in batch) for batch in ds.take(count)]


def one_pass(ds):
  """All (image, label) pairs of a finite dataset, concatenated."""
  images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
  return np.concatenate(images), np.concatenate(labels)


def digits_reference(split):
  """The source's own arrays, expanded to 3 channels as decode does."""
  images, labels = sources.load_digits_splits()[split]
  return np.repeat(images, 3, axis=-1), labels


class CallCounter:
  """Counts calls of a tf.data map function, from whichever thread runs it.

  `wrap(fn)` returns fn with a `tf.py_function` tick that its outputs depend
  on, so no rewrite can drop it. With `rendezvous=n`, each of the first n
  calls waits (up to WAIT_S) until all n have begun: only a map that runs n
  calls at once gets past them.
  """

  def __init__(self, rendezvous: int = 0):
    self._lock = threading.Lock()
    self.count = 0
    self._barrier = (threading.Barrier(rendezvous, timeout=WAIT_S)
                     if rendezvous else None)

  def _tick(self):
    with self._lock:
      self.count += 1
      meets = self._barrier is not None and self.count <= self._barrier.parties
    if meets:
      self._barrier.wait()  # BrokenBarrierError fails the pipeline
    return np.int64(0)

  def wrap(self, fn):

    def counted(*args):
      outputs = fn(*args)
      tick = tf.py_function(self._tick, [], tf.int64)
      with tf.control_dependencies([tick]):
        return tf.nest.map_structure(tf.identity, outputs)

    return counted


def count_cost_map_calls(monkeypatch, rendezvous: int = 0) -> CallCounter:
  """Counts the training samples a pipeline prepares: its cost map's calls.

  The cost map runs once per sample after shuffle and repeat, right before
  batch, so the count is what batching has pulled (cfg needs
  preprocess_cost_ms > 0 for the map to exist).
  """
  counter = CallCounter(rendezvous)
  make_cost_fn = preprocess_cost.make_cost_fn
  monkeypatch.setattr(preprocess_cost, "make_cost_fn",
                      lambda cost_ms: counter.wrap(make_cost_fn(cost_ms)))
  return counter


def count_decode_calls(monkeypatch) -> CallCounter:
  """Counts the samples the source decodes (the map before the cache)."""
  counter = CallCounter()
  load_source = sources.load_source

  def counting_source(cfg):
    source = load_source(cfg)
    return dataclasses.replace(source, decode=counter.wrap(source.decode))

  monkeypatch.setattr(sources, "load_source", counting_source)
  return counter



def iterated_dataset_ops(ds) -> list:
  """The dataset ops an iterator of `ds` runs, after tf.data's rewrites.

  Creating an iterator finalizes the dataset: its options, default graph
  optimizations included, are applied then. FinalizeDataset does the same,
  and the graph it returns is the one an iterator would run.
  """
  specs = tf.nest.flatten(ds.element_spec)
  finalized = tf.raw_ops.FinalizeDataset(
      input_dataset=ds._variant_tensor,  # pylint: disable=protected-access
      output_types=[spec.dtype for spec in specs],
      output_shapes=[spec.shape for spec in specs])
  graph = graph_pb2.GraphDef()
  graph.ParseFromString(tf.raw_ops.DatasetToGraphV2(
      # 1 is IGNORE: the counting tf.py_function holds state of its own.
      input_dataset=finalized, external_state_policy=1).numpy())
  return [node.op for node in graph.node if "Dataset" in node.op]


def async_ops(ops) -> list:
  return [op for op in ops if op.startswith(ASYNC_OP_PREFIXES)]


def dataset_chain(ds) -> list:
  """Class names of `ds` and of every dataset it reads from."""
  names = []
  pending = [ds]
  while pending:
    current = pending.pop()
    names.append(type(current).__name__)
    pending.extend(current._inputs())  # pylint: disable=protected-access
  return names


# --- sources -----------------------------------------------------------------


def test_digits_describe_and_batches():
  cfg = make_cfg()
  assert data.describe(cfg) == data.DatasetInfo(
      num_classes=10, num_train_examples=DIGITS_TRAIN,
      num_eval_examples=DIGITS_EVAL, image_size=8, channels=3)
  ds = data.make_input_fn(cfg, split="train", task="classification",
                          seed=0)(None)
  assert ds.element_spec[0].shape == (16, 8, 8, 3)
  assert ds.element_spec[0].dtype == tf.float32
  assert ds.element_spec[1].shape == (16,)
  assert ds.element_spec[1].dtype == tf.int32
  images, labels = (np.concatenate(parts)
                    for parts in zip(*first_batches(ds, 20)))
  assert images.min() >= 0.0 and images.max() <= 1.0 and images.max() > 0.9
  assert set(labels) == set(range(10))


def test_digits_train_and_eval_partition_the_data_set():
  cfg = make_cfg(shuffle_buffer=0, batch_size=DIGITS_TRAIN)
  train_images, train_labels = first_batches(
      data.make_input_fn(cfg, split="train", task="classification",
                         seed=0)(None), 1)[0]
  eval_images, eval_labels = one_pass(
      data.make_input_fn(cfg, split="eval", task="classification", seed=0)(
          None))
  assert len(train_labels) == DIGITS_TRAIN and len(eval_labels) == DIGITS_EVAL
  pixels, _ = datasets._read_digits()  # pylint: disable=protected-access
  everything = np.repeat(pixels.reshape(-1, 8, 8, 1) / 16.0, 3, axis=-1)
  # Together exactly the whole data set: no example is in both splits.
  assert (image_counter(np.concatenate([train_images, eval_images]), 16) ==
          image_counter(everything, 16))


def test_digits_order_follows_the_seed():
  cfg = make_cfg(shuffle_buffer=512)

  def labels(seed):
    ds = data.make_input_fn(cfg, split="train", task="classification",
                            seed=seed)(None)
    return np.concatenate([b[1] for b in first_batches(ds, 8)])

  np.testing.assert_array_equal(labels(1), labels(1))
  assert not np.array_equal(labels(1), labels(2))


def test_synthetic_pool_is_fixed_and_the_seed_only_orders_it():
  cfg = fixtures.synthetic_pool_config(make_cfg, data.describe)
  epochs = {}
  for seed in (1, 2):
    ds = data.make_input_fn(cfg, split="train", task="classification",
                            seed=seed)(None)
    epochs[seed] = first_batches(ds, 1)[0]
  eval_images, _ = one_pass(data.make_input_fn(
      cfg, split="eval", task="classification", seed=1)(None))
  fixtures.check_synthetic_pool(epochs, eval_images, (6, 6, 3))


def test_tfds_reads_a_locally_prepared_dataset(tfds_dir):
  root, written = tfds_dir
  cfg = make_cfg(dataset="tfds", data_dir=root, tfds_name=TFDS_NAME,
                 image_size=12, batch_size=4)
  assert data.describe(cfg) == data.DatasetInfo(3, 20, 8, 12, 3)
  images, labels = one_pass(data.make_input_fn(
      cfg, split="eval", task="classification", seed=0)(None))
  expected_images = np.repeat(written["test"][0] / 255.0, 3, axis=-1)
  assert (image_counter(images, levels=255) ==
          image_counter(expected_images, levels=255))
  assert sorted(labels) == sorted(written["test"][1])
  train = data.make_input_fn(dataclasses.replace(cfg, image_size=8),
                             split="train", task="classification", seed=0)
  images, labels = first_batches(train(None), 1)[0]
  assert images.shape == (4, 8, 8, 3) and labels.dtype == np.int32


def write_png(path, color, height=10, width=6):
  pixels = np.tile(np.array(color, np.uint8), (height, width, 1))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tf.io.write_file(path, tf.io.encode_png(pixels))


def test_image_folder_reads_pngs(tmp_path):
  colors = {"cat": (255, 0, 0), "dog": (0, 0, 255)}
  for split, count in (("train", 5), ("validation", 2)):
    for label, color in colors.items():
      for i in range(count):
        write_png(str(tmp_path / split / label / f"{i}.png"), color)
  cfg = make_cfg(dataset="image_folder", data_dir=str(tmp_path),
                 batch_size=4)
  assert data.describe(cfg) == data.DatasetInfo(2, 10, 4, 8, 3)
  images, labels = one_pass(data.make_input_fn(
      cfg, split="eval", task="classification", seed=0)(None))
  assert images.shape == (4, 8, 8, 3)
  assert sorted(labels) == [0, 0, 1, 1]
  for image, label in zip(images, labels):  # labels sort: cat 0, dog 1
    expected = np.array(colors[["cat", "dog"][label]]) / 255.0
    np.testing.assert_allclose(image, np.broadcast_to(expected, image.shape),
                               atol=1e-6)


def test_cache_keeps_decoded_samples_after_the_files_are_gone(tmp_path):
  for label, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
    for i in range(3):
      write_png(str(tmp_path / "train" / label / f"{i}.png"), color)
  for cache in (True, False):
    # No read-ahead: the second epoch starts only after the files are gone.
    cfg = make_cfg(dataset="image_folder", data_dir=str(tmp_path),
                   batch_size=6, shuffle_buffer=0, prefetch=0,
                   map_parallelism=1, cache=cache)
    batches = iter(data.make_input_fn(cfg, split="train",
                                      task="classification", seed=0)(None))
    _, first_labels = next(batches)
    if cache:
      files = sorted(tmp_path.glob("train/*/*.png"))
      contents = {path: path.read_bytes() for path in files}
      for path in files:
        path.unlink()
      _, second_labels = next(batches)  # served from memory
      np.testing.assert_array_equal(first_labels, second_labels)
      for path, content in contents.items():
        path.write_bytes(content)
    else:
      for path in tmp_path.glob("train/*/*.png"):
        path.unlink()
      with pytest.raises(tf.errors.NotFoundError):
        next(batches)  # without the cache the second epoch reads files


def test_input_pipelines_read_disjoint_shards():
  cfg = make_cfg(batch_size=16)
  input_fn = data.make_input_fn(cfg, split="eval", task="classification",
                                seed=0)
  shards = []
  for pipeline_id in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2,
                                         input_pipeline_id=pipeline_id,
                                         num_replicas_in_sync=4)
    ds = input_fn(context)
    assert ds.element_spec[0].shape.as_list() == [None, 8, 8, 3]
    images, labels = one_pass(ds)
    assert len(labels) == DIGITS_EVAL // 2
    assert max(len(y) for _, y in ds) == 4  # 16 over 4 replicas
    shards.append(image_counter(images, 16))
  assert shards[0] + shards[1] == image_counter(digits_reference("eval")[0],
                                                16)


# --- task shapes -------------------------------------------------------------


def test_super_resolution_pairs_are_area_downscales():
  cfg = make_cfg(image_size=16, shuffle_buffer=0)
  ds = data.make_input_fn(cfg, split="train", task="super_resolution",
                          seed=0, upscale=2)(None)
  low, high = first_batches(ds, 1)[0]
  assert low.shape == (16, 8, 8, 3) and high.shape == (16, 16, 16, 3)
  block_means = high.reshape(16, 8, 2, 8, 2, 3).mean(axis=(2, 4))
  np.testing.assert_allclose(low, block_means, atol=1e-6)
  with pytest.raises(ConfigError, match="image_size"):
    data.make_input_fn(cfg, split="train", task="super_resolution", seed=0,
                       upscale=3)


# --- knobs -------------------------------------------------------------------

@pytest.mark.parametrize("knobs", KNOBS)
def test_knobs_keep_batches_correct(knobs):
  cfg = make_cfg(**knobs, batch_size=DIGITS_TRAIN)
  train = data.make_input_fn(cfg, split="train", task="classification",
                             seed=3)(None)
  # The second epoch comes from the cache.
  fixtures.check_knobs_kept_batches(
      first_batches(train, 2),
      data.make_input_fn(dataclasses.replace(cfg, batch_size=100),
                         split="eval", task="classification", seed=3)(None),
      digits_reference, shuffled=bool(knobs["shuffle_buffer"]))
  # "Off" also keeps tf.data's default rewrites from adding the overlap
  # back: no injected prefetch, no map+batch fusion (which computes batches
  # ahead) and no parallelized plain map.
  optimization = train.options().experimental_optimization
  assert (optimization.inject_prefetch is False) == (knobs["prefetch"] == 0)
  assert (optimization.map_and_batch_fusion is False) == (
      knobs["prefetch"] == 0)
  assert (optimization.map_parallelization is False) == (
      knobs["map_parallelism"] == 1)


# --- knobs, by their effect ----------------------------------------------
# Each test counts the samples a pipeline really prepares; none reads back
# the value of the knob it is about.


def test_prefetch_0_prepares_nothing_ahead_of_the_step(monkeypatch):
  prepared = count_cost_map_calls(monkeypatch)
  cfg = make_cfg(prefetch=0, map_parallelism=1,
                 preprocess_cost_ms=COUNTED_COST_MS)
  ds = data.make_input_fn(cfg, split="train", task="classification",
                          seed=0)(None)
  # Nothing in what the iterator runs has a thread of its own (tf.data's
  # default rewrites would add a prefetch or a fused map-and-batch), so the
  # counts below cannot grow behind the test's back.
  assert not async_ops(iterated_dataset_ops(ds))
  fixtures.check_nothing_prepared_ahead(ds, lambda: prepared.count,
                                        cfg.batch_size)


def test_prefetch_n_prepares_n_batches_ahead_of_the_step(monkeypatch):
  depth = 3
  prepared = count_cost_map_calls(monkeypatch)
  cfg = make_cfg(prefetch=depth, map_parallelism=1,
                 preprocess_cost_ms=COUNTED_COST_MS)
  batches = iter(data.make_input_fn(cfg, split="train",
                                    task="classification", seed=0)(None))
  next(batches)
  # With the consumer idle, only work done ahead can grow the count.
  wait_until(lambda: prepared.count >= (1 + depth) * cfg.batch_size,
             f"{depth} batches prepared ahead")


def test_map_parallelism_n_prepares_n_samples_at_once(monkeypatch):
  # The first two samples wait for each other: a map that prepares one
  # sample at a time would stop there until the wait breaks.
  prepared = count_cost_map_calls(monkeypatch, rendezvous=2)
  cfg = make_cfg(prefetch=0, map_parallelism=2,
                 preprocess_cost_ms=COUNTED_COST_MS)
  ds = data.make_input_fn(cfg, split="train", task="classification",
                          seed=0)(None)
  next(iter(ds))
  assert prepared.count >= cfg.batch_size
  # 1 is sequential: no parallel map is left in what the iterator runs.
  sequential = data.make_input_fn(
      dataclasses.replace(cfg, map_parallelism=1), split="train",
      task="classification", seed=0)(None)
  assert "ParallelMapDatasetV2" in iterated_dataset_ops(ds)
  assert not async_ops(iterated_dataset_ops(sequential))


@pytest.mark.parametrize("cache, decodes_per_sample", [(True, 1),
                                                       (False, 2)])
def test_cache_decodes_each_sample_once_across_epochs(monkeypatch, cache,
                                                      decodes_per_sample):
  decoded = count_decode_calls(monkeypatch)
  # One batch is one epoch; nothing runs ahead, so the count is exact.
  cfg = make_cfg(cache=cache, batch_size=DIGITS_TRAIN, shuffle_buffer=0,
                 prefetch=0, map_parallelism=1)
  batches = iter(data.make_input_fn(cfg, split="train",
                                    task="classification", seed=0)(None))
  first, second = next(batches), next(batches)
  np.testing.assert_array_equal(first[0].numpy(), second[0].numpy())
  assert decoded.count == decodes_per_sample * DIGITS_TRAIN


def test_preprocess_cost_iterations_scale_with_cost():
  fixtures.check_cost_iterations_scale(preprocess_cost)


def test_preprocess_cost_runs_inside_tf_data():
  iterations = preprocess_cost.iterations_for_cost(0.5)
  ds = tf.data.Dataset.range(4).map(
      lambda i: preprocess_cost.burn(tf.cast(i, tf.float32), iterations),
      num_parallel_calls=2)
  for rounds, checksum in ds:
    assert rounds.numpy() == iterations
    assert np.isfinite(checksum.numpy())


def test_preprocess_cost_leaves_samples_unchanged():
  cfg = make_cfg(shuffle_buffer=0, map_parallelism=2)
  plain = data.make_input_fn(cfg, split="train", task="classification",
                             seed=0)(None)
  costly = data.make_input_fn(
      dataclasses.replace(cfg, preprocess_cost_ms=0.2), split="train",
      task="classification", seed=0)(None)
  for (x1, y1), (x2, y2) in zip(first_batches(plain, 3),
                                first_batches(costly, 3)):
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)


def test_data_service_serves_the_same_examples():
  cfg = make_cfg(batch_size=32)
  direct_images, direct_labels = one_pass(data.make_input_fn(
      cfg, split="eval", task="classification", seed=0)(None))
  with data.start_data_service() as service:
    assert service.address.startswith("grpc://localhost:")
    served_cfg = dataclasses.replace(cfg, data_service=service.address)
    served_images, served_labels = one_pass(data.make_input_fn(
        served_cfg, split="eval", task="classification", seed=0)(None))
    # A second evaluation pipeline gets its own job and again a full pass.
    again = one_pass(data.make_input_fn(
        served_cfg, split="eval", task="classification", seed=0)(None))[1]
    train = data.make_input_fn(served_cfg, split="train",
                               task="super_resolution", seed=0,
                               upscale=2)(None)
    low, high = first_batches(train, 2)[1]
  assert collections.Counter(served_labels) == collections.Counter(
      direct_labels)
  assert image_counter(served_images) == image_counter(direct_images)
  assert collections.Counter(again) == collections.Counter(direct_labels)
  assert low.shape == (32, 4, 4, 3) and high.shape == (32, 8, 8, 3)
  with pytest.raises(ValueError, match="local"):
    data.make_input_fn(dataclasses.replace(cfg, data_service="local"),
                       split="train", task="classification", seed=0)


# --- devices -----------------------------------------------------------------


@pytest.mark.parametrize("prefetch_to_device", [True, False])
def test_mirrored_replicas_get_half_batches(two_cpu_devices,
                                            prefetch_to_device):
  strategy = distribute.mirrored_strategy(two_cpu_devices)
  cfg = make_cfg(batch_size=16, prefetch_to_device=prefetch_to_device)
  input_fn = data.make_input_fn(cfg, split="eval", task="classification",
                                seed=0)
  batches = data.distribute_input(strategy, input_fn, cfg)
  assert isinstance(batches, tf.distribute.DistributedDataset)
  labels, devices = [], set()
  for step, (images, batch_labels) in enumerate(batches):
    per_replica = strategy.experimental_local_results(images)
    assert len(per_replica) == 2
    if step == 0:
      assert [x.shape for x in per_replica] == [(8, 8, 8, 3)] * 2
      devices = [x.device for x in per_replica]
    labels.extend(np.concatenate(
        [y.numpy() for y in strategy.experimental_local_results(batch_labels)]))
  # The replicas together see every evaluation example exactly once.
  assert collections.Counter(labels) == collections.Counter(
      digits_reference("eval")[1])
  if prefetch_to_device:  # InputOptions staged each half on its own device
    assert devices[0].endswith("CPU:0") and devices[1].endswith("CPU:1")
  else:  # both halves wait in host memory for the step to copy them
    assert all(d.endswith("CPU:0") for d in devices)


@pytest.mark.parametrize("prefetch_to_device", [True, False])
def test_default_strategy_stages_a_batch_on_the_device_ahead(
    monkeypatch, prefetch_to_device):
  # On a host without a GPU the target device is the CPU the batches are
  # made on, so where a batch lies cannot tell the knob's states apart. The
  # staging can: host prefetch is off here, so the only work done ahead of
  # the step is the device buffer's.
  prepared = count_cost_map_calls(monkeypatch)
  strategy = tf.distribute.get_strategy()
  assert distribute.is_default_strategy(strategy)
  cfg = make_cfg(prefetch_to_device=prefetch_to_device, prefetch=0,
                 map_parallelism=1, preprocess_cost_ms=COUNTED_COST_MS)
  input_fn = data.make_input_fn(cfg, split="train", task="classification",
                                seed=0)
  ds = data.distribute_input(strategy, input_fn, cfg)
  assert isinstance(ds, tf.data.Dataset)
  staged = "_CopyToDeviceDataset" in dataset_chain(ds)
  assert staged == prefetch_to_device
  if not prefetch_to_device:  # nothing that could run ahead, as above
    assert not async_ops(iterated_dataset_ops(ds))
  target = tf.DeviceSpec.from_string(distribute.default_device())
  batches = iter(ds)
  for taken in range(1, 4):
    images, labels = next(batches)
    assert images.shape == (16, 8, 8, 3) and labels.shape == (16,)
    if prefetch_to_device:
      placed = tf.DeviceSpec.from_string(images.device)
      assert ((placed.device_type, placed.device_index) ==
              (target.device_type, target.device_index))
      ahead = taken + device.device_buffer_size(cfg.prefetch)
      wait_until(lambda: prepared.count >= ahead * cfg.batch_size,  # pylint: disable=cell-var-from-loop
                 f"{ahead} batches prepared after {taken} taken")
    else:
      assert prepared.count == taken * cfg.batch_size
  assert device.device_buffer_size(AUTOTUNE) == 2
  assert device.device_buffer_size(0) == 1


def test_resident_batches_are_identical_on_every_replica(two_cpu_devices):
  strategy = distribute.mirrored_strategy(two_cpu_devices)
  cfg = make_cfg(dataset="synthetic", synthetic_on_device=True,
                 batch_size=8)
  batches = data.make_resident_iterator(strategy, cfg,
                                        task="classification", seed=0)
  first, second = next(batches), next(batches)
  assert first is second  # no pipeline: the very same tensors every step
  images = strategy.experimental_local_results(first[0])
  labels = strategy.experimental_local_results(first[1])
  assert [x.device[-5:] for x in images] == ["CPU:0", "CPU:1"]
  assert [y.device[-5:] for y in labels] == ["CPU:0", "CPU:1"]
  assert images[0].shape == (4, 8, 8, 3)
  np.testing.assert_array_equal(images[0].numpy(), images[1].numpy())
  np.testing.assert_array_equal(labels[0].numpy(), labels[1].numpy())
  sr = data.make_resident_iterator(tf.distribute.get_strategy(), cfg,
                                   task="super_resolution", seed=0,
                                   upscale=2).get_next()
  assert sr[0].shape == (8, 4, 4, 3) and sr[1].shape == (8, 8, 8, 3)



def test_resident_batches_from_a_start_are_the_sources_in_turn():
  cfg = make_cfg(dataset="synthetic", batch_size=8)
  source = data.make_input_fn(cfg, split="train", task="classification",
                              seed=0)(None)
  # 8 images of 8 x 8 x 3 float32 and 8 int32 labels: 6176 bytes a batch.
  fixtures.check_resident_batches_in_turn(
      functools.partial(data.make_resident_iterator,
                        tf.distribute.get_strategy(), cfg,
                        task="classification", seed=0),
      first_batches(source, 5)[2:5], batch_bytes=6176)

# --- errors ------------------------------------------------------------------


def test_missing_tfds_dataset_names_the_flag(tfds_dir, tmp_path):
  fixtures.check_missing_tfds_names_the_flag(
      make_cfg, data.describe, tfds_dir[0], str(tmp_path))


def test_tfds_without_eval_split_refuses_evaluation(tmp_path):
  cfg = fixtures.train_only_tfds_config(
      make_cfg, data.describe, "train_only", str(tmp_path))
  with pytest.raises(ConfigError, match="--evaluate"):
    data.make_input_fn(cfg, split="eval", task="classification", seed=0)


def test_bad_image_folders_name_data_dir(tmp_path):
  cases = {}
  cases["missing"] = str(tmp_path / "does_not_exist")
  (tmp_path / "empty").mkdir()
  cases["empty"] = str(tmp_path / "empty")
  (tmp_path / "no_train" / "test" / "cat").mkdir(parents=True)
  write_png(str(tmp_path / "no_train" / "test" / "cat" / "0.png"), (1, 2, 3))
  cases["no_train"] = str(tmp_path / "no_train")
  (tmp_path / "no_images" / "train" / "cat").mkdir(parents=True)
  cases["no_images"] = str(tmp_path / "no_images")
  for case, path in cases.items():
    with pytest.raises(ConfigError) as error:
      data.describe(make_cfg(dataset="image_folder", data_dir=path))
    assert error.value.flag == "data_dir", case
    assert str(error.value).startswith("--data_dir="), case
  garbage = tmp_path / "garbage" / "train" / "cat" / "0.png"
  garbage.parent.mkdir(parents=True)
  garbage.write_bytes(b"this is not a png")
  with pytest.raises(ConfigError, match="cannot decode") as error:
    data.make_input_fn(make_cfg(dataset="image_folder",
                                data_dir=str(tmp_path / "garbage")),
                       split="train", task="classification", seed=0)
  assert error.value.flag == "data_dir"


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="split"):
    data.make_input_fn(make_cfg(), split="validation",
                       task="classification", seed=0)
  with pytest.raises(ValueError, match="task"):
    data.make_input_fn(make_cfg(), split="train", task="detection", seed=0)
  assert pipeline.TASKS == ("classification", "super_resolution")
