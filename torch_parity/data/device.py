"""Getting batches onto the training device: device prefetch, or none at all.

`make_device_prefetcher` is `--prefetch_to_device`: it stages the next
batches on the device while the current step runs. On CUDA it copies from
page-locked memory with non-blocking copies on a side stream; elsewhere a
background thread prepares (and moves) the next batches.
`make_resident_iterator` is `--synthetic_on_device`: one batch placed on the
device once and returned forever, which bounds what any input overlap can
achieve; a run's steps without input (`--paired_removal=input`) take
several, read once, in turn.
"""

import collections
import dataclasses
import itertools
import queue
import threading
import time
from typing import Iterable, Iterator, Optional, Sequence, Tuple

import torch

from overlap_core.runtime import datasets
from overlap_core.runtime.config import DataConfig
from torch_parity.data import pipeline

Batch = Tuple[torch.Tensor, ...]

_BATCH, _END, _ERROR = "batch", "end", "error"
_PUT_POLL_S = 0.1  # how soon a blocked producer notices close()
_GET_POLL_S = 0.1  # how soon a waiting consumer notices a dead producer
# The longest the training thread waits for the next batch before the run
# fails. One batch of a slow pipeline takes seconds (256 samples at
# --preprocess_cost_ms=100 on one worker: 26 s), DataLoader workers start in
# seconds even on a loaded host; a pipeline silent for 10 minutes is hung
# (a stuck worker or source), and is reported instead of waited on forever.
BATCH_TIMEOUT_S = 600.0


def make_device_prefetcher(batches: Iterable[Batch], device, depth: int, *,
                           timeout_s: float = BATCH_TIMEOUT_S
                           ) -> Iterator[Batch]:
  """Yields `batches` in order, on `device`, with `depth` staged ahead.

  Args:
    batches: tuples of CPU tensors, e.g. a `make_loader` DataLoader.
    device: where the step runs ("cuda", "cuda:1", "cpu", ...).
    depth: batches staged ahead of the one being consumed, >= 1; the
      trainer passes `overlap_core.runtime.datasets.device_buffer_size(prefetch)`,
      the depth TensorFlow's device prefetch uses.
    timeout_s: the longest `next()` waits for the background thread's next
      batch before it raises TimeoutError (not on CUDA, where `next()`
      pulls from `batches` itself).

  Returns:
    An iterator with `close()`, which stops staging.

  Raises:
    ValueError: depth < 1 or timeout_s <= 0.
  """
  if depth < 1:
    raise ValueError(f"depth={depth}: must be >= 1")
  if not timeout_s > 0:
    raise ValueError(f"timeout_s={timeout_s}: must be > 0")
  device = torch.device(device)
  if device.type == "cuda":
    if device.index is None:
      device = torch.device("cuda", torch.cuda.current_device())
    return CudaPrefetcher(batches, device, depth)
  return ThreadPrefetcher(batches, device, depth, timeout_s=timeout_s)


class CudaPrefetcher:
  """Copies the next batches to a GPU on a side stream, ahead of the step.

  Each batch is page-locked (DataLoader does it when `pin_memory` is on),
  copied with `non_blocking=True` on a side stream, and an event marks the
  end of its copies. Handing it out makes the consumer's stream wait for that
  event only: `wait_stream` would also wait for the copies of the batches
  staged after it. `record_stream` then tells the caching allocator that
  the consumer's stream uses memory allocated on the side stream, so it is
  not reused before the step that reads it has run.

  Usage:

    batches = CudaPrefetcher(loader, torch.device("cuda", 0), depth=2)
    for images, labels in batches:
      loss = model(images) ...  # the next copies overlap this step
  """

  def __init__(self, batches: Iterable[Batch], device: torch.device,
               depth: int):
    self._batches = iter(batches)
    self._device = device
    self._depth = depth
    self._stream = torch.cuda.Stream(device=device)
    self._staged = collections.deque()
    self._exhausted = False
    self._stage()

  def __iter__(self) -> "CudaPrefetcher":
    return self

  def __next__(self) -> Batch:
    if not self._staged:
      raise StopIteration
    # The host copy stays referenced until now, so its page-locked memory
    # cannot be reused while the copy may still be reading it.
    _, on_device, copied = self._staged.popleft()
    consumer = torch.cuda.current_stream(self._device)
    consumer.wait_event(copied)
    for tensor in on_device:
      tensor.record_stream(consumer)
    self._stage()  # these copies run while the caller's step runs
    return on_device

  def close(self) -> None:
    """Stops staging; batches already staged are dropped."""
    self._exhausted = True
    self._staged.clear()

  def _stage(self) -> None:
    while not self._exhausted and len(self._staged) < self._depth:
      try:
        host = next(self._batches)
      except StopIteration:
        self._exhausted = True
        return
      host = tuple(t if t.is_pinned() else t.pin_memory() for t in host)
      with torch.cuda.stream(self._stream):
        on_device = tuple(t.to(self._device, non_blocking=True)
                          for t in host)
        copied = torch.cuda.Event()
        copied.record(self._stream)
      self._staged.append((host, on_device, copied))


class ThreadPrefetcher:
  """Prepares the next `depth` batches on a background thread.

  The thread pulls from `batches` (running an inline loader's
  preprocessing, or waiting on its workers) and moves each batch to
  `device` while the caller's step runs. Errors of the source are raised by
  the caller's next(). Every wait is bounded: next() raises TimeoutError
  when no batch comes within `timeout_s`, and RuntimeError at once when the
  thread is gone without handing over a batch, an end or an error.

  Usage:

    batches = ThreadPrefetcher(loader, torch.device("cpu"), depth=2)
    images, labels = next(batches)
  """

  def __init__(self, batches: Iterable[Batch], device: torch.device,
               depth: int, *, timeout_s: float = BATCH_TIMEOUT_S):
    self._queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._done = False
    self._timeout_s = timeout_s
    # The thread gets the queue and the flag, not self: then dropping the
    # prefetcher without close() still reaches __del__ and stops it.
    self._thread = threading.Thread(
        target=_produce, args=(iter(batches), device, self._queue,
                               self._stop),
        name="device-prefetch", daemon=True)
    self._thread.start()

  def __iter__(self) -> "ThreadPrefetcher":
    return self

  def __next__(self) -> Batch:
    if self._done:
      raise StopIteration
    try:
      kind, value = self._get()
    except (TimeoutError, RuntimeError):
      self._done = True
      raise
    if kind == _BATCH:
      return value
    self._done = True
    if kind == _ERROR:
      raise value
    raise StopIteration

  def _get(self):
    """The thread's next item, waiting at most `timeout_s`."""
    deadline = time.monotonic() + self._timeout_s
    while True:
      try:
        return self._queue.get(timeout=_GET_POLL_S)
      except queue.Empty:
        pass
      if not self._thread.is_alive():
        try:  # its last item may have come in just before it ended
          return self._queue.get_nowait()
        except queue.Empty:
          raise RuntimeError(
              "device prefetch: the prefetch thread ended without a batch, "
              "an end or an error") from None
      if time.monotonic() >= deadline:
        raise TimeoutError(
            f"device prefetch: no batch from the input pipeline in "
            f"{self._timeout_s:g} s; it is hung (a stuck DataLoader worker "
            "or data source)")

  def close(self) -> None:
    """Stops the thread once its current batch is ready; drops the rest."""
    self._stop.set()
    self._done = True

  def __del__(self):
    self.close()


def _produce(batches: Iterator[Batch], device: torch.device,
             out: queue.Queue, stop: threading.Event) -> None:
  """The prefetch thread: moves batches into `out` until the end or stop."""

  def put(item) -> bool:
    while not stop.is_set():
      try:
        out.put(item, timeout=_PUT_POLL_S)
        return True
      except queue.Full:
        pass
    return False

  try:
    for batch in batches:
      if not put((_BATCH, tuple(t.to(device) for t in batch))):
        return
    put((_END, None))
  except BaseException as e:  # pylint: disable=broad-except
    # Whatever ends the thread is re-raised on the caller's thread; there,
    # not here, is where the run can stop.
    put((_ERROR, e))


class ResidentIterator:
  """Returns batches already on the device, in turn, forever: one batch
  (`--synthetic_on_device`), or several read once and repeated.

  Usage:

    batches = make_resident_iterator(cfg, task="classification", seed=0,
                                     upscale=1, device="cuda")
    images, labels = next(batches)
  """

  def __init__(self, batches: Sequence[Batch]):
    self._batches = itertools.cycle(batches)
    self.num_batches = len(batches)

  def __iter__(self) -> "ResidentIterator":
    return self

  def __next__(self) -> Batch:
    return next(self._batches)


def make_resident_iterator(cfg: DataConfig, *, task: str, seed: int,
                           upscale: int, device, rank: int = 0,
                           world_size: int = 1, start_batch: int = 0,
                           count: int = 1,
                           max_bytes: Optional[int] = None
                           ) -> ResidentIterator:
  """This rank's training batches from `start_batch` on, `count` of them
  (fewer where they would hold more than `max_bytes`), each placed on
  `device` once.

  The batches are those `make_loader` would yield this rank (shuffled with
  `seed`), without preprocessing cost, cache or prefetch: there is no
  input pipeline left to run while training. Unlike TensorFlow's, where
  every replica gets pipeline 0's batch, each rank gets batches of its own
  shard.

  Args:
    cfg: the data configuration; batch_size is global.
    task, seed, upscale, rank, world_size: as for `make_loader`.
    device: where the step runs.
    start_batch, count, max_bytes: which batches to hold
      (`datasets.take_resident`).

  Raises:
    ConfigError: as `make_loader`.
  """
  bare = dataclasses.replace(cfg, preprocess_cost_ms=0.0, cache=False,
                             prefetch=0, prefetch_to_device=False,
                             map_parallelism=1)
  loader = pipeline.make_loader(bare, split="train", task=task, seed=seed,
                                upscale=upscale, rank=rank,
                                world_size=world_size,
                                skip_batches=start_batch)
  held = datasets.take_resident(
      iter(loader), count, max_bytes=max_bytes,
      nbytes=lambda batch: sum(t.nbytes for t in batch))
  return ResidentIterator([tuple(t.to(device) for t in batch)
                           for batch in held])
