"""A replicated pipeline stage's gradient all-reduce, overlapped with backward.

With replicas, each stage's gradients must be averaged over the ranks that
hold it. They are final only when the last micro-batch's backward has
accumulated into them; before this module, the runtime all-reduced them
after the schedule's step, all of it exposed (`average_stage_gradients`).

Here every parameter counts its accumulations (autograd's
post-accumulate-grad hook fires once per micro-batch's backward); at the
M-th, its gradient is final, and when every parameter of a bucket is, the
bucket is flattened and handed to an asynchronous all-reduce while backward
goes on with earlier layers. After the schedule's step, `finish()` waits
for the buckets still in flight and writes the means back: that wait is
the step's exposed all-reduce.

Why not DDP with `no_sync` on all micro-batches but the last: a
DDP-wrapped stage failed its first forward under the pipelining schedule
(gloo, 2 stages x 2 replicas), which calls the stage module itself; and
DDP arms its all-reduce in a forward run outside `no_sync`, for the next
backward. Under 1F1B the last micro-batch's forward comes before earlier
micro-batches' backwards, so the armed backward would be the wrong one.
Counting accumulations marks the last, whatever the schedule.

Buckets are filled in reverse registration order, as DDP's: backward
reaches the last layers first. All replicas of a stage run the same graph,
so their buckets become ready in the same order, which the collectives on
their group require.

  reducer = OverlappedGradientReduce(modules, group, replicas=2,
                                     num_microbatches=4, bucket_mb=25.0)
  schedule.step(...)          # buckets all-reduce as backward finishes them
  exposed_s = reducer.finish()
"""

import threading
import time
from typing import Callable, List, Sequence

import torch
import torch.distributed as dist
from torch import nn


class _Bucket:
  __slots__ = ("params", "ready", "work", "flat")

  def __init__(self, params: List[nn.Parameter]):
    self.params = params
    self.ready = 0
    self.work = None
    self.flat = None


class OverlappedGradientReduce:
  """Averages a stage's gradients over its replicas, bucket by bucket, as
  the last micro-batch's backward makes them final."""

  def __init__(self, modules: Sequence[nn.Module], group, *, replicas: int,
               num_microbatches: int, bucket_mb: float,
               clock: Callable[[], float] = time.perf_counter):
    if replicas < 2 or num_microbatches < 1 or bucket_mb <= 0:
      raise ValueError(f"Invalid replicas/num_microbatches/bucket_mb: "
                       f"{replicas}, {num_microbatches}, {bucket_mb}; "
                       f"allowed: >= 2, >= 1, > 0")
    self._group = group
    self._replicas = replicas
    self._num_microbatches = num_microbatches
    self._clock = clock
    self._lock = threading.Lock()
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    bucket_bytes = int(bucket_mb * 2**20)
    self._buckets: List[_Bucket] = []
    current: List[nn.Parameter] = []
    size = 0
    for param in reversed(params):
      nbytes = param.numel() * param.element_size()
      if current and size + nbytes > bucket_bytes:
        self._buckets.append(_Bucket(current))
        current, size = [], 0
      current.append(param)
      size += nbytes
    if current:
      self._buckets.append(_Bucket(current))
    self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
    self._counts = {id(p): 0 for p in params}
    self._launched: List[_Bucket] = []
    # While True (the stage timed alone), backward hands nothing over and
    # nothing is counted, so no collective runs and `finish()` is skipped.
    self.paused = False
    self.last_launch_s = None  # when backward handed over its last bucket
    # Buckets the last step handed over during backward, not in finish().
    self.num_overlapped = 0
    self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                     for p in params]

  @property
  def num_buckets(self) -> int:
    return len(self._buckets)

  def _on_grad(self, param: nn.Parameter) -> None:
    if self.paused:
      return
    with self._lock:
      self._counts[id(param)] += 1
      if self._counts[id(param)] != self._num_microbatches:
        return
      bucket = self._bucket_of[id(param)]
      bucket.ready += 1
      if bucket.ready == len(bucket.params):
        self._launch(bucket)

  def _launch(self, bucket: _Bucket) -> None:
    grads = [p.grad for p in bucket.params if p.grad is not None]
    bucket.flat = torch.cat([g.reshape(-1) for g in grads]) if grads else None
    if bucket.flat is not None:
      bucket.work = dist.all_reduce(bucket.flat, group=self._group,
                                    async_op=True)
    self._launched.append(bucket)
    self.last_launch_s = self._clock()

  def finish(self) -> float:
    """Waits for every bucket, writes the replicas' means into .grad, and
    readies the next step; returns the seconds it waited (exposed).

    A bucket whose parameters did not all get M gradients (a layer the
    step did not use) is all-reduced here, in bucket order, the same on
    every replica.
    """
    start = self._clock()
    with self._lock:
      self.num_overlapped = len(self._launched)
      for bucket in self._buckets:
        if bucket not in self._launched:
          self._launch(bucket)
      launched, self._launched = self._launched, []
    for bucket in launched:
      if bucket.work is not None:
        bucket.work.wait()
        bucket.flat /= self._replicas
        offset = 0
        for param in bucket.params:
          if param.grad is None:
            continue
          grad = param.grad
          grad.copy_(bucket.flat[offset:offset + grad.numel()].view_as(grad))
          offset += grad.numel()
      bucket.ready, bucket.work, bucket.flat = 0, None, None
    for key in self._counts:
      self._counts[key] = 0
    return self._clock() - start

  def remove(self) -> None:
    """Takes the hooks off the parameters."""
    for handle in self._handles:
      handle.remove()
    self._handles = []
