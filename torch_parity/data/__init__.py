"""PyTorch input pipelines with every input-overlap knob, as in tfoverlap.data.

The same `DataConfig` gives the same examples, split, shard, batch shapes
and value ranges as the tf.data pipeline, in NCHW float32 layout; labels are
int64. Modules, one job each, named as on the TensorFlow side:
  sources          digits / synthetic / tfds / image_folder, read + decode
  preprocess_cost  calibrated, parallelizable CPU work per sample
  pipeline         make_loader: a DataLoader, the knob mapping, the order
  device           make_device_prefetcher, make_resident_iterator

TensorFlow and TFDS are imported only for --dataset=tfds and image_folder,
which are opened and checked by the TensorFlow side's own code.

What each knob becomes (TensorFlow's meaning kept):

  --map_parallelism  How many samples are preprocessed at once (decode,
                     cache fill, cost). N: N DataLoader worker processes,
                     each preparing one batch sample by sample; 1: a single
                     worker, sequential as TF's plain map; autotune: one
                     worker per core this process may use. With --prefetch=0
                     there are no workers and N threads prepare the samples
                     of each batch when the step asks for it (the cost's
                     NumPy math releases the GIL). TF's parallel map also
                     runs N samples ahead even then; these threads do not.
  --prefetch         How many batches are ready ahead of the step. 0: off,
                     the loader runs inline on the training thread when the
                     step asks for a batch (num_workers=0). P:
                     prefetch_factor = ceil(P / N), so the N workers keep
                     N * ceil(P / N) batches in flight: exactly P when N
                     divides P, else the next multiple of N; never fewer
                     than N, since every worker holds the batch it is
                     preparing. autotune: prefetch_factor 2, DataLoader's
                     default.
  --cache            Decoded samples are kept in memory, in one tensor
                     (shared memory when there are workers, which all fill
                     and read it): the first epoch decodes, later ones do
                     not; the cost still runs every epoch.
  --shuffle_buffer   0: no shuffling, file order. Otherwise a full
                     permutation seeded by (seed, epoch), new every epoch.
                     TensorFlow shuffles through a buffer of that many
                     samples instead: same examples per epoch, different
                     order, and a small buffer is not a more local shuffle
                     here.
  --preprocess_cost_ms  Real CPU work per training sample, calibrated in ms,
                     run where the sample is prepared (a worker, or a sample
                     thread), so it parallelizes with --map_parallelism.
  --prefetch_to_device  `make_device_prefetcher`: on CUDA, page-locked
                     batches copied non-blocking on a side stream,
                     `device_buffer_size(prefetch)` batches ahead; on CPU, a
                     background thread preparing that many batches ahead.
  --synthetic_on_device `make_resident_iterator`: one batch made once on
                     the device and returned every step.
  --data_service     No PyTorch meaning: refused by the compatibility
                     table (overlap_core.runtime.compat_table).

Distributed: rank r of w reads elements r, r + w, ... of each split (TF's
shard), with batches of batch_size / w (ConfigError if w does not divide
it). Exact resume: `skip_batches=K` yields what an uninterrupted loader
yields after its first K batches, preparing none of those K.

Usage in a trainer:

  info = describe(cfg.data)
  loader = make_loader(cfg.data, split="train", task=spec.task,
                       seed=cfg.run.seed, upscale=spec.upscale, rank=rank,
                       world_size=world_size, skip_batches=step)
  batches = iter(loader)
  if cfg.data.prefetch_to_device:
    depth = overlap_core.runtime.datasets.device_buffer_size(cfg.data.prefetch)
    batches = make_device_prefetcher(loader, device, depth)
"""

from overlap_core.runtime.datasets import DatasetInfo
from torch_parity.data.device import (make_device_prefetcher,
                                      make_resident_iterator)
from torch_parity.data.pipeline import make_loader
from torch_parity.data.sources import describe

__all__ = [
    "DatasetInfo",
    "describe",
    "make_device_prefetcher",
    "make_loader",
    "make_resident_iterator",
]
