"""Getting batches onto the training devices: device prefetch, or none at all.

`distribute_input` turns an input function into what the trainer iterates,
staging batches on the replicas' devices ahead of the step when
`--prefetch_to_device` is on. `make_resident_iterator` skips the input
pipeline altogether (`--synthetic_on_device`): one batch is placed on every
replica once and returned forever, as throughput benchmarks do, which bounds
what any input overlap can achieve; a run's steps without input
(`--paired_removal=input`) take several, read once, in turn.
"""

import dataclasses
import itertools
from typing import Optional, Sequence

import tensorflow as tf

from tfoverlap import distribute
from overlap_core.runtime import datasets
from overlap_core.runtime.config import DataConfig
# Shared with the PyTorch device prefetcher, so --prefetch sets one depth.
from overlap_core.runtime.datasets import (  # pylint: disable=unused-import
    AUTOTUNE_DEVICE_BUFFER, device_buffer_size)
from tfoverlap.data import pipeline


def distribute_input(strategy: tf.distribute.Strategy,
                     input_fn: pipeline.InputFn, cfg: DataConfig):
  """What the trainer iterates: per-replica batches, on device if asked.

  Under a real strategy (any strategy other than the default one) this is
  `strategy.distribute_datasets_from_function`, with device prefetch set
  through `tf.distribute.InputOptions`: applying
  `tf.data.experimental.prefetch_to_device` inside the input function has no
  effect there (tensorflow#94735). With `cfg.prefetch_to_device` off, the
  per-replica batches stay in host memory and each step copies its own.

  With the default strategy the plain dataset `input_fn(None)` is returned,
  ending with `prefetch_to_device` onto the default device when asked.

  Args:
    strategy: the run's strategy, or `tf.distribute.get_strategy()` for none.
    input_fn: from `make_input_fn`.
    cfg: the data configuration (prefetch depth, prefetch_to_device).

  Returns:
    A `tf.distribute.DistributedDataset`, or a `tf.data.Dataset` for the
    default strategy.
  """
  buffer_size = device_buffer_size(cfg.prefetch)
  if distribute.is_default_strategy(strategy):
    ds = input_fn(None)
    if cfg.prefetch_to_device:
      # Must be the last transformation: nothing may run after the copy.
      ds = ds.apply(tf.data.experimental.prefetch_to_device(
          distribute.default_device(), buffer_size))
    return ds
  options = tf.distribute.InputOptions(
      experimental_fetch_to_device=cfg.prefetch_to_device,
      experimental_per_replica_buffer_size=buffer_size)
  return strategy.distribute_datasets_from_function(input_fn, options=options)


class ResidentIterator:
  """Returns per-replica batches already on each device, in turn, forever:
  one batch (`--synthetic_on_device`), or several read once and repeated.

  Usage:

    batches = make_resident_iterator(strategy, cfg, task="classification",
                                     seed=0)
    images, labels = next(batches)  # PerReplica values under a strategy
  """

  def __init__(self, values: Sequence):
    self._values = itertools.cycle(values)
    self.num_batches = len(values)

  def __iter__(self) -> "ResidentIterator":
    return self

  def __next__(self):
    return next(self._values)

  def get_next(self):
    """Same as next(), as `tf.distribute.DistributedIterator` spells it."""
    return next(self._values)


def make_resident_iterator(strategy: tf.distribute.Strategy, cfg: DataConfig,
                           *, task: str, seed: int, upscale: int = 1,
                           start_batch: int = 0, count: int = 1,
                           max_bytes: Optional[int] = None
                           ) -> ResidentIterator:
  """Training batches from `start_batch` on, `count` of them (fewer where
  they would hold more than `max_bytes`), each placed on every replica
  once.

  The batches are the source's training batches (shuffled with `seed`),
  without preprocessing cost, cache, data service or prefetch: there is no
  input pipeline left to run while training.

  Args:
    strategy: the run's strategy (or the default strategy).
    cfg: the data configuration; batch_size is global.
    task, seed, upscale: as for `make_input_fn`.
    start_batch, count, max_bytes: which batches to hold
      (`datasets.take_resident`).

  Returns:
    An iterator whose next() is `strategy`'s distributed value of a batch
    (a plain tuple of tensors for the default strategy).

  Raises:
    ConfigError: batch_size does not divide over the replicas, or the
      source cannot be read (see `make_input_fn`).
  """
  num_replicas = strategy.num_replicas_in_sync
  datasets.per_replica_batch_size(cfg.batch_size, num_replicas)
  bare = dataclasses.replace(cfg, preprocess_cost_ms=0.0, data_service="",
                             cache=False, prefetch=0, prefetch_to_device=False)
  input_fn = pipeline.make_input_fn(bare, split="train", task=task, seed=seed,
                                    upscale=upscale, start_batch=start_batch)
  context = tf.distribute.InputContext(num_input_pipelines=1,
                                       input_pipeline_id=0,
                                       num_replicas_in_sync=num_replicas)
  held = datasets.take_resident(
      iter(input_fn(context)), count, max_bytes=max_bytes,
      nbytes=lambda batch: sum(t.numpy().nbytes
                               for t in tf.nest.flatten(batch)))
  devices = distribute.replica_devices(strategy)

  def place_on_replicas(batch):

    def place_on_replica(value_context):
      # The strategy calls this once per local replica but not under that
      # replica's device scope, so the copy is placed here.
      device = devices[value_context.replica_id_in_sync_group % len(devices)]
      with tf.device(device):
        return tf.nest.map_structure(tf.identity, batch)

    return strategy.experimental_distribute_values_from_function(
        place_on_replica)

  return ResidentIterator([place_on_replicas(batch) for batch in held])
