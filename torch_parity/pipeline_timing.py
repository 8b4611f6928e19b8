"""Timing a torch.distributed.pipelining schedule, and run.json's pipeline section.

A schedule's step on one rank is its stage's forward and backward chunks,
interleaved with point-to-point traffic to its neighbours. The schedules
post that traffic with `schedules._batch_p2p` (isend/irecv of one batch of
P2POps) and block on it with `schedules._wait_batch_p2p`, both looked up
as module globals at call time; while a step runs, `P2PTimer.timing()`
puts timed stand-ins there that call the originals. That separates:

  transfer  the posting (`_batch_p2p`: buffers handed to gloo, a send's
            bytes queued), and a wait on a *send* (until its bytes have
            left for the neighbour);
  bubble    a wait on a *receive*: the neighbour's activation or gradient
            has not arrived, because that neighbour is still computing.

What it cannot separate on gloo: the wire time of a received tensor. gloo
moves the bytes on its own I/O thread, so a receive's wait holds both the
neighbour's lateness and the copy's arrival; over loopback the copy is
small beside the lateness, and it is counted as bubble. A send's wait can
likewise hold back-pressure from a neighbour that has not posted its
receive yet; that counts as transfer. Everything else in the step is the
stage computing (`pipeline_stats.partition_span` fills the gaps).

The stand-ins are installed only for the duration of one step of one
rank's schedule and restored after, so nothing else in the process sees
them. Should a torch release rename the two functions, `timing()` times
nothing (the step is then all stage_compute) instead of failing the run.
"""

import contextlib
import threading
import time
from typing import Callable, Dict

import torch.distributed as dist

from overlap_core.planning import split as split_lib
from overlap_core.runtime.pipeline_stats import (BUBBLE, EXPOSED_COMM, LOSS,
                                                 POSTING, STAGE_COMPUTE,
                                                 TRANSFER, UPDATE,
                                                 StageRecorder,
                                                 pipeline_section,
                                                 stage_entry)

# run.json repeats these, as the TensorFlow side does its own, so that a
# comparison can tell a timed figure from a derived one.
MEASUREMENT_SOURCES = {
    STAGE_COMPUTE:
        "measured: the step's time outside timed sends and waits, on the "
        "stage's own rank: its forward and backward chunks, the loss and "
        "the update",
    UPDATE: "measured: optimizer.step() timed on the host",
    TRANSFER:
        "measured: posting sends and receives, and waits on sends, timed "
        "in the step",
    BUBBLE:
        "measured: waits on receives timed in the step (a received "
        "tensor's wire time included), and the wait for the last stage's "
        "loss",
    POSTING: "measured: the part of transfer spent posting sends and "
             "receives (the rest is waits on sends)",
    LOSS: "measured: the last stage's loss of each micro-batch, timed "
          "around the schedule's loss function",
    EXPOSED_COMM:
        "measured: with replicas, the wait after the schedule's step for "
        "the gradient all-reduce backward did not hide",
    "saved_activation_peak_bytes":
        "counted: bytes of tensors saved for backward (saved-tensor "
        "hooks), parameters and buffers left out, the most held at once",
}
_BATCH = "_batch_p2p"
_WAIT = "_wait_batch_p2p"
# One schedule step at a time per process: the stand-ins are globals.
_INSTALL_LOCK = threading.Lock()


def _schedules():
  """torch's schedules module, imported on first use: a trainer that runs
  no pipeline never pays for torch.distributed.pipelining's import."""
  from torch.distributed.pipelining import schedules  # pylint: disable=g-import-not-at-top
  return schedules


def hooks_available() -> bool:
  """Whether this torch release has the two functions the timer wraps."""
  schedules = _schedules()
  return callable(getattr(schedules, _BATCH, None)) and callable(
      getattr(schedules, _WAIT, None))


class P2PTimer:
  """Records a schedule's posting and waiting into a `StageRecorder`.

  Usage:
    timer = P2PTimer(recorder)
    with timer.timing():
      schedule.step(...)
  """

  def __init__(self, recorder: StageRecorder,
               clock: Callable[[], float] = time.perf_counter):
    self._recorder = recorder
    self._clock = clock
    # id(work) -> TRANSFER for a send, BUBBLE for a receive; a work is
    # held by the schedule until it is waited on, so its id is not reused
    # in between.
    self._kind_of: Dict[int, str] = {}

  @contextlib.contextmanager
  def timing(self):
    """Installs the timed stand-ins for the enclosed schedule step."""
    if not hooks_available():
      yield
      return
    schedules = _schedules()
    with _INSTALL_LOCK:
      batch, wait = getattr(schedules, _BATCH), getattr(schedules, _WAIT)
      setattr(schedules, _BATCH, self._timed_batch(batch))
      setattr(schedules, _WAIT, self._timed_wait(wait))
      try:
        yield
      finally:
        setattr(schedules, _BATCH, batch)
        setattr(schedules, _WAIT, wait)
        self._kind_of.clear()

  def record(self, phase: str, start_s: float, end_s: float) -> None:
    """An interval timed outside the schedule (the loss all-reduce)."""
    self._recorder.record(phase, start_s, end_s)

  def _timed_batch(self, batch):
    def timed_batch(p2p_ops, *args, **kwargs):
      start = self._clock()
      works = batch(p2p_ops, *args, **kwargs)
      end = self._clock()
      self._recorder.record(TRANSFER, start, end)
      self._recorder.record_posting(start, end)
      # gloo returns one work per op, in order (no coalescing); when a
      # backend coalesces, the works cannot be told apart and count as
      # receives.
      if len(works) == len(p2p_ops):
        for op, work in zip(p2p_ops, works):
          self._kind_of[id(work)] = (TRANSFER if op.op is dist.isend
                                     else BUBBLE)
      return works
    return timed_batch

  def _timed_wait(self, wait):
    def timed_wait(works):
      for work in works:
        start = self._clock()
        wait([work])
        self._recorder.record(self._kind_of.pop(id(work), BUBBLE), start,
                              self._clock())
    return timed_wait


def _local_row(runtime, device, warmup_steps: int) -> dict:
  """This rank's measured medians and its stages' predictions."""
  plan = runtime.split
  stages = [plan.stages[i] for i in runtime.stage_indices] if plan else []
  microbatches = runtime.schedule._n_microbatches  # pylint: disable=protected-access
  predicted_ms = predicted_update_ms = predicted_mb = None
  if runtime.has_predictions:
    predicted_ms, predicted_update_ms, predicted_mb = (
        split_lib.stage_predictions(stages, num_microbatches=microbatches))
  return {"stage": runtime.mesh.stage, "replica": runtime.mesh.replica,
          "layers": [layer for s in stages for layer in s.layers],
          "device": str(device), "predicted_ms": predicted_ms,
          "predicted_update_ms": predicted_update_ms,
          "predicted_memory_mb": predicted_mb,
          "saved_activation_peak_bytes": runtime.memory.peak_bytes,
          "medians_ms": runtime.recorder.medians_ms(warmup_steps)}


def gather_pipeline_section(runtime, cfg, device, *,
                            warmup_steps: int) -> dict:
  """run.json's `pipeline` section, the same on every rank.

  A collective over the world: every rank sends its row, and the rows of
  replica 0 (one per pipeline rank) become `per_stage`. With virtual
  stages a row is one rank's stages together: they share its timeline.
  """
  row = _local_row(runtime, device, warmup_steps)
  rows = [None] * dist.get_world_size()
  dist.all_gather_object(rows, row)
  per_stage = [stage_entry(r["stage"], layers=r["layers"], device=r["device"],
                           medians_ms=r["medians_ms"],
                           predicted_ms=r["predicted_ms"],
                           predicted_update_ms=r["predicted_update_ms"],
                           predicted_memory_mb=r["predicted_memory_mb"],
                           saved_activation_peak_bytes=r[
                               "saved_activation_peak_bytes"])
               for r in rows if r["replica"] == 0]
  section = pipeline_section(
      schedule=cfg.schedule, stages=cfg.stages,
      micro_batches=cfg.microbatches, virtual_stages=cfg.virtual_stages,
      replicas=runtime.mesh.dims.data_parallel, split=cfg.split,
      cut_layers=runtime.cut_layers, per_stage=per_stage,
      all_reduce_overlapped=(runtime.reducer is not None
                             if runtime.mesh.dims.data_parallel > 1
                             else None))
  section["sources"] = dict(MEASUREMENT_SOURCES)
  return section
