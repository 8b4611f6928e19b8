"""The PyTorch input pipeline: a DataLoader with every input-overlap knob.

The order of the work is TensorFlow's (`tfoverlap.data.pipeline`):

  read -> shard -> [per-epoch order] -> [skip, on resume] -> decode
       -> [cache] -> [preprocess cost] -> batch -> [low-res pairs]

- read and shard in the training process, when the loader is built: rank r
  of w keeps elements r, r + w, r + 2w, ... of the split, the elements
  `Dataset.shard(w, r)` keeps.
- the order of the endless training stream is fixed by (seed, epoch) alone
  (see `epoch_order`), so batch k of a run is computable without running
  batches 0..k-1: a resumed loader starts at batch k and prepares nothing
  before it.
- decode, cache, cost and the low-res pairs run where the batch is prepared:
  in a worker process, or inline on the training thread.
- the training stream is batched across epoch boundaries, as TensorFlow's
  repeat-then-batch does, so resuming is exact at every batch.

The knobs, and what each becomes, are described in `torch_parity.data`.
"""

import concurrent.futures
import dataclasses
import math
from typing import Iterator, List, Optional, Sequence

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils import data as torch_data

from overlap_core.runtime import cpu_clock
from overlap_core.runtime import datasets
from overlap_core.runtime.config import AUTOTUNE, ConfigError, DataConfig
from torch_parity.data import preprocess_cost, sources

# Batches each worker keeps in flight when --prefetch=autotune: DataLoader's
# own default, the depth PyTorch tunes its workers for.
AUTOTUNE_BATCHES_PER_WORKER = 2


@dataclasses.dataclass(frozen=True)
class LoaderSettings:
  """What `--prefetch` and `--map_parallelism` become in a DataLoader.

  Attributes:
    num_workers: DataLoader worker processes; 0 loads inline, on the
      training thread.
    prefetch_factor: batches in flight per worker; None when inline.
    sample_threads: threads preparing the samples of one batch inline (1
      inside a worker: there the parallelism is across workers).
  """
  num_workers: int
  prefetch_factor: Optional[int]
  sample_threads: int

  @property
  def batches_ahead(self) -> int:
    """Batches prepared, or being prepared, ahead of the training step."""
    return self.num_workers * (self.prefetch_factor or 0)


def loader_settings(cfg: DataConfig) -> LoaderSettings:
  """Maps `--prefetch` and `--map_parallelism` onto a DataLoader.

  map_parallelism N (samples preprocessed at once) becomes N worker
  processes, each preparing one batch sample by sample; prefetch P (batches
  ready ahead of the step) becomes ceil(P / N) batches in flight per worker.
  prefetch 0 loads inline, with N threads preparing each batch's samples.

  Raises:
    ConfigError: a knob outside its allowed values.
  """
  if cfg.map_parallelism != AUTOTUNE and cfg.map_parallelism < 1:
    raise ConfigError("map_parallelism", cfg.map_parallelism,
                      "allowed: autotune or an integer >= 1")
  if cfg.prefetch != AUTOTUNE and cfg.prefetch < 0:
    raise ConfigError("prefetch", cfg.prefetch,
                      "allowed: autotune or an integer >= 0")
  parallelism = (available_cores() if cfg.map_parallelism == AUTOTUNE
                 else cfg.map_parallelism)
  if cfg.prefetch == 0:
    return LoaderSettings(num_workers=0, prefetch_factor=None,
                          sample_threads=parallelism)
  per_worker = (AUTOTUNE_BATCHES_PER_WORKER if cfg.prefetch == AUTOTUNE
                else math.ceil(cfg.prefetch / parallelism))
  return LoaderSettings(num_workers=parallelism, prefetch_factor=per_worker,
                        sample_threads=1)


def available_cores() -> int:
  """CPU cores this process may run on: the autotuned parallelism."""
  return max(1, cpu_clock.usable_cores())


def epoch_order(num_examples: int, *, seed: int, epoch: int,
                shuffle: bool) -> np.ndarray:
  """Positions of one epoch of the training stream, in the order served.

  A full permutation seeded by (seed, epoch), where TensorFlow shuffles
  through a buffer of `--shuffle_buffer` samples: every epoch is reshuffled
  as there, but not into the same order, and a small buffer does not make
  the shuffle more local here.
  """
  if not shuffle:
    return np.arange(num_examples)
  key = [seed % (1 << 64), epoch]  # SeedSequence takes no negative seeds
  return np.random.default_rng(key).permutation(num_examples)


class TrainBatchOrder(torch_data.Sampler):
  """Endless batches of positions, from batch `first_batch` on.

  The stream is epoch after epoch of `epoch_order`, cut into batches of
  `batch_size` that may straddle two epochs, as TensorFlow's repeat before
  batch does. Iterating again starts again from `first_batch`.
  """

  def __init__(self, num_examples: int, *, batch_size: int, seed: int,
               shuffle: bool, first_batch: int = 0):
    super().__init__()
    self._num_examples = num_examples
    self._batch_size = batch_size
    self._seed = seed
    self._shuffle = shuffle
    self._first_batch = first_batch

  def __iter__(self) -> Iterator[List[int]]:
    n = self._num_examples
    epoch, offset = divmod(self._first_batch * self._batch_size, n)
    order = self._order(epoch)
    while True:
      batch = []
      while len(batch) < self._batch_size:
        take = min(self._batch_size - len(batch), n - offset)
        batch.extend(order[offset:offset + take].tolist())
        offset += take
        if offset == n:
          epoch, offset = epoch + 1, 0
          order = self._order(epoch)
      yield batch

  def _order(self, epoch: int) -> np.ndarray:
    return epoch_order(self._num_examples, seed=self._seed, epoch=epoch,
                       shuffle=self._shuffle)


class EvalBatchOrder(torch_data.Sampler):
  """One pass in order, from batch `first_batch` on; the last may be short."""

  def __init__(self, num_examples: int, *, batch_size: int,
               first_batch: int = 0):
    super().__init__()
    self._starts = range(first_batch * batch_size, num_examples, batch_size)
    self._num_examples = num_examples
    self._batch_size = batch_size

  def __iter__(self) -> Iterator[List[int]]:
    for start in self._starts:
      yield list(range(start, min(start + self._batch_size,
                                  self._num_examples)))

  def __len__(self) -> int:
    return len(self._starts)


class BatchSet(torch_data.Dataset):
  """Prepared batches of one shard, fetched by a list of positions.

  Fetching a whole batch per call is what lets a DataLoader worker prepare
  one batch while the others prepare theirs. With `cache`, decoded samples
  go to one tensor in shared memory, filled by whichever process decodes a
  sample first and read by all of them afterwards.
  """

  def __init__(self, elements: Sequence, labels: np.ndarray, *, decode,
               image_size: int, task: str, upscale: int, cost_iterations: int,
               cache: bool, shared: bool, sample_threads: int):
    self._elements = elements
    self._labels = labels
    self._decode = decode
    self._task = task
    self._upscale = upscale
    self._cost_iterations = cost_iterations
    self._sample_threads = sample_threads
    self._pool = None
    self._cache = self._cached = None
    if cache:
      self._cache = torch.empty(len(labels), 3, image_size, image_size)
      # A flag per sample, set after its pixels are written: a sample whose
      # flag is 0 is decoded (again), never read half-written.
      self._cached = torch.zeros(len(labels), dtype=torch.uint8)
      if shared:
        self._cache.share_memory_()
        self._cached.share_memory_()

  def __len__(self) -> int:
    return len(self._labels)

  def __getitem__(self, positions: List[int]):
    if self._sample_threads > 1 and len(positions) > 1:
      images = list(self._thread_pool().map(self._prepare, positions))
    else:
      images = [self._prepare(position) for position in positions]
    high_res = torch.stack(images)
    if self._task == "super_resolution":
      # Average pooling over u x u blocks: the area resize TensorFlow does.
      return F.avg_pool2d(high_res, self._upscale), high_res
    return high_res, torch.from_numpy(self._labels[positions])

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_pool"] = None  # threads do not cross processes
    return state

  def _prepare(self, position: int) -> torch.Tensor:
    image = self._decoded(position)
    return preprocess_cost.apply_cost(image, self._cost_iterations)

  def _decoded(self, position: int) -> torch.Tensor:
    if self._cache is None:
      return self._decode(self._elements[position])
    if self._cached[position]:
      return self._cache[position]
    image = self._decode(self._elements[position])
    self._cache[position] = image
    self._cached[position] = 1
    return image

  def _thread_pool(self) -> concurrent.futures.ThreadPoolExecutor:
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(
          self._sample_threads, thread_name_prefix="sample")
    return self._pool


def make_loader(cfg: DataConfig, *, split: str, task: str, seed: int,
                upscale: int = 1, rank: int = 0, world_size: int = 1,
                skip_batches: int = 0) -> torch_data.DataLoader:
  """Builds this rank's input pipeline for one split.

  The source is opened, read and sharded, and the preprocessing cost
  calibrated, now: errors surface before training starts.

  Args:
    cfg: the data configuration; `cfg.batch_size` is global.
    split: "train" (shuffled per epoch with `seed`, endless, cost applied,
      full batches) or "eval" (one pass, in order, no cost, the final
      partial batch kept).
    task: "classification" -> (images [B, 3, S, S] float32 in [0, 1],
      labels [B] int64); "super_resolution" -> (low_res [B, 3, S/u, S/u],
      high_res [B, 3, S, S]), low_res the area downscale of high_res.
    seed: shuffle seed of this run.
    upscale: super-resolution factor u; must divide cfg.image_size.
    rank: this process's rank; it reads only its shard of the split.
    world_size: processes sharing the global batch.
    skip_batches: batches a resumed run has already consumed: the loader
      yields what an uninterrupted one yields after its first
      `skip_batches` batches, without preparing those.

  Returns:
    A DataLoader of (inputs, targets) with B = batch_size / world_size.

  Raises:
    ConfigError: the data set is missing or unreadable; evaluation of a
      data set without an evaluation split; image_size not a multiple of
      upscale; batch_size not a multiple of world_size; a knob outside its
      allowed values.
    ValueError: unknown split or task, or a bad rank or skip_batches.
  """
  datasets.check_input_request(split=split, task=task,
                               image_size=cfg.image_size, upscale=upscale)
  if world_size < 1 or not 0 <= rank < world_size:
    raise ValueError(f"rank={rank}, world_size={world_size}: allowed: "
                     "world_size >= 1 and 0 <= rank < world_size")
  if skip_batches < 0:
    raise ValueError(f"skip_batches={skip_batches}: must be >= 0")
  batch_size = datasets.per_replica_batch_size(cfg.batch_size, world_size)
  settings = loader_settings(cfg)
  source = sources.load_source(cfg)
  if split == "eval" and not source.num_examples["eval"]:
    raise datasets.no_eval_split_error(source.name)
  training = split == "train"
  if source.user:
    return _make_user_loader(cfg, source.read(split)[0], training=training,
                             batch_size=batch_size, seed=seed, rank=rank,
                             world_size=world_size,
                             skip_batches=skip_batches, settings=settings)
  elements, labels = source.read(split)
  elements, labels = elements[rank::world_size], labels[rank::world_size]
  order = _batch_order(len(labels), cfg, dataset_name=source.name,
                       training=training, batch_size=batch_size, seed=seed,
                       world_size=world_size, skip_batches=skip_batches)
  cost_iterations = (preprocess_cost.iterations_for_cost(
      cfg.preprocess_cost_ms) if training else 0)
  batch_set = BatchSet(
      elements, labels, decode=source.decode, image_size=cfg.image_size,
      task=task, upscale=upscale, cost_iterations=cost_iterations,
      cache=cfg.cache, shared=settings.num_workers > 0,
      sample_threads=settings.sample_threads)
  return torch_data.DataLoader(
      batch_set, batch_size=None, sampler=order, collate_fn=_as_is,
      pin_memory=_pin_memory(cfg), **_worker_args(settings))


def _pin_memory(cfg: DataConfig) -> bool:
  # Page-locked batches are what lets the device prefetcher's copies run
  # asynchronously; on a host without CUDA there is nothing to pin for.
  return cfg.prefetch_to_device and torch.cuda.is_available()


def _worker_args(settings: LoaderSettings) -> dict:
  """The DataLoader's worker arguments; prefetch_factor only with workers,
  as DataLoader refuses it without."""
  extra = ({"prefetch_factor": settings.prefetch_factor}
           if settings.num_workers else {})
  return {"num_workers": settings.num_workers, **extra}


def _batch_order(num_examples: int, cfg: DataConfig, *, dataset_name: str,
                 training: bool, batch_size: int, seed: int,
                 world_size: int, skip_batches: int):
  """The order of this rank's shard of `num_examples`, for the zoo's
  sources and the user's map-style datasets alike.

  Raises:
    ConfigError: a training shard with no examples.
  """
  if training and not num_examples:
    raise ConfigError("batch_size", cfg.batch_size,
                      f"{dataset_name} has too few training examples for "
                      f"{world_size} ranks to each read a shard")
  if training:
    return TrainBatchOrder(num_examples, batch_size=batch_size, seed=seed,
                           shuffle=cfg.shuffle_buffer > 0,
                           first_batch=skip_batches)
  return EvalBatchOrder(num_examples, batch_size=batch_size,
                        first_batch=skip_batches)


def _make_user_loader(cfg: DataConfig, dataset, *, training: bool,
                      batch_size: int, seed: int, rank: int, world_size: int,
                      skip_batches: int, settings: LoaderSettings
                      ) -> torch_data.DataLoader:
  """The loader of the user's (x, y) Dataset, with the zoo's order.

  A map-style dataset is sharded, ordered and resumed exactly as the zoo's
  sources are (rank r keeps positions r, r + w, ...; `TrainBatchOrder`),
  its examples fetched by the loader's workers. An iterable one is
  repeated, sharded by position and shuffled through a buffer of
  --shuffle_buffer examples seeded by (seed, epoch), read inline: its
  iterator cannot be split over worker processes without the dataset's
  own help.
  """
  pin = _pin_memory(cfg)
  if isinstance(dataset, torch_data.IterableDataset):
    stream = _UserStream(dataset, training=training, rank=rank,
                         world_size=world_size, seed=seed,
                         shuffle_buffer=cfg.shuffle_buffer if training else 0,
                         skip=skip_batches * batch_size)
    return torch_data.DataLoader(stream, batch_size=batch_size,
                                 drop_last=training, collate_fn=_pair,
                                 pin_memory=pin)
  shard = torch_data.Subset(dataset, range(rank, len(dataset), world_size))
  order = _batch_order(len(shard), cfg, dataset_name=cfg.dataset,
                       training=training, batch_size=batch_size, seed=seed,
                       world_size=world_size, skip_batches=skip_batches)
  return torch_data.DataLoader(shard, batch_sampler=order, collate_fn=_pair,
                               pin_memory=pin, **_worker_args(settings))


class _UserStream(torch_data.IterableDataset):
  """The user's iterable dataset, as the trainer's training stream."""

  def __init__(self, dataset, *, training: bool, rank: int, world_size: int,
               seed: int, shuffle_buffer: int, skip: int):
    super().__init__()
    self._dataset = dataset
    self._training = training
    self._rank, self._world_size = rank, world_size
    self._seed = seed
    self._shuffle_buffer = shuffle_buffer
    self._skip = skip

  def __iter__(self):
    examples = self._examples()
    for _ in range(self._skip):
      next(examples, None)
    return examples

  def _examples(self):
    epoch = 0
    while True:
      shard = (example for i, example in enumerate(self._dataset)
               if i % self._world_size == self._rank)
      yield from self._shuffled(shard, epoch)
      if not self._training:
        return
      epoch += 1

  def _shuffled(self, examples, epoch: int):
    if not self._shuffle_buffer:
      yield from examples
      return
    rng = np.random.default_rng([self._seed % (1 << 64), epoch])
    buffer = []
    for example in examples:
      buffer.append(example)
      if len(buffer) == self._shuffle_buffer:
        yield buffer.pop(int(rng.integers(len(buffer))))
    while buffer:
      yield buffer.pop(int(rng.integers(len(buffer))))


def _pair(examples):
  """collate_fn of the user's (x, y) examples: one (inputs, targets)."""
  inputs, targets = torch_data.default_collate(list(examples))
  return inputs, targets


def _as_is(batch):
  """collate_fn: the batch is already built (the default would make the
  (inputs, targets) tuple a list)."""
  return batch
