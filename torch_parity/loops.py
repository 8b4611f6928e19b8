"""The measured training loop, feeding the same step ledger as TensorFlow's.

`run_custom_loop` times each phase separately, exactly as
`tfoverlap.loops.run_custom_loop` does: the wait for the next batch, the
step (forward, backward with the overlapped all-reduce, update), the
checkpoint. PyTorch has no `model.fit`, so there is one loop.
"""

import contextlib
import sys
import types
from typing import Optional

import torch

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.loop_context import (LoopContext, ScalarWindows,
                                               after_step, compute_phase,
                                               settle_split)


def _wait_for_step(device: torch.device,
                   stream: Optional["torch.cuda.Stream"]) -> None:
  if stream is not None:
    # Not the whole device: it also runs the background job's kernels,
    # which are no part of the step.
    stream.synchronize()
  elif device.type == "cuda":
    torch.cuda.synchronize(device)


@contextlib.contextmanager
def _on_stream(stream: Optional["torch.cuda.Stream"]):
  """Makes `stream` current for the enclosed steps, ordered after the work
  already queued (the model, a resident batch) and before what follows
  (evaluation, the final checkpoint)."""
  if stream is None:
    yield
    return
  before = torch.cuda.current_stream(stream.device)
  stream.wait_stream(before)
  try:
    with torch.cuda.stream(stream):
      yield
  finally:
    before.wait_stream(stream)


def run_custom_loop(ctx: LoopContext, *, train_step, iterator,
                    device: torch.device, split_compute=None,
                    stream: Optional["torch.cuda.Stream"] = None) -> float:
  """Runs steps first_step..last_step; returns the last step's loss.

  Args:
    split_compute: for a pipelined run, split_compute(start_s, end_s) ->
      [(phase, start_s, end_s), ...], the spans that replace the step's
      compute span in the ledger (`StageRecorder.end_step`); None records
      one compute span.
    stream: a CUDA stream to run every step on (the CUDA background job's
      highest-priority foreground stream), or None for the current one.
  """
  loss = float("nan")
  with _on_stream(stream):
    for step in range(ctx.first_step, ctx.last_step + 1):
      with ctx.ledger.phase(ledger_lib.DATA_WAIT):
        batch = next(iterator)
      with compute_phase(ctx.ledger, split_compute):
        loss_tensor = train_step(batch)
        # CUDA runs the step asynchronously: waiting here makes the span
        # cover the device work and not only its launch, as TensorFlow's
        # loop does by reading the loss.
        _wait_for_step(device, stream)
        loss = float(loss_tensor)
      after_step(ctx, step, loss)
  settle_split(ctx.ledger, split_compute)
  return loss


def _summary_writer_class():
  """torch's SummaryWriter, kept from importing TensorFlow.

  TensorBoard imports TensorFlow, when it is installed, for file I/O unless
  the module of its own `no_tensorflow` build target exists; pip's
  TensorBoard lacks that module, so an empty one stands in and TensorBoard
  writes through its built-in stub (local files, the same event format).
  """
  sys.modules.setdefault("tensorboard.compat.notf",
                         types.ModuleType("tensorboard.compat.notf"))
  from torch.utils import tensorboard  # pylint: disable=g-import-not-at-top
  return tensorboard.SummaryWriter


def make_scalar_writer(logdir: Optional[str], every_steps: int,
                       ledger: ledger_lib.StepLedger):
  """TensorBoard scalars every `every_steps` steps: loss, throughput, shares.

  The same tags as the TensorFlow side writes. Returns a `write(step,
  loss)` callable with a `close()` attribute; a no-op when `logdir` is None.
  """
  if logdir is None:
    write = lambda step, loss: None
    write.close = lambda: None
    return write
  writer = _summary_writer_class()(log_dir=logdir)
  windows = ScalarWindows(ledger, every_steps)

  def write(step: int, loss: float) -> None:
    scalars = windows.due(step)
    if scalars is None:
      return
    writer.add_scalar("loss", loss, step)
    for name, value in scalars.items():
      writer.add_scalar(f"steps/{name}", value, step)
    writer.flush()

  write.close = writer.close
  return write
