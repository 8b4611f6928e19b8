"""`LedgerCallback`: the trainers' step ledger for any Keras `model.fit`.

Where each step's time goes (compute, the checkpoint stall of an
`AsyncCheckpoint` beside it, the rest), a progress line, and at the end
the breakdown table and `<directory>/run.json`, written by the same code as
the trainers' (`overlap_core.runtime.user_loop`), so that `overlap_compare`
reads it like a trainer's run. `tfoverlap.loops.run_fit_loop` drives the
trainer's own `model.fit` with the same timing (`FitStepTimer`).
"""

import dataclasses
import time
from typing import List, Optional, Sequence, Tuple

import keras

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.config import ArgumentError
from overlap_core.runtime.loop_context import LoopContext, after_execution
from overlap_core.runtime.user_loop import UserLoop
from tfoverlap import distribute, models
from tfoverlap.checkpoint.callback import AsyncCheckpoint

__all__ = ["FitStepTimer", "LedgerCallback"]

FRAMEWORK = "tensorflow"
# model.fit pulls its input inside the compiled step: its wait is compute.
PHASES_MEASURED = (ledger_lib.COMPUTE, ledger_lib.CHECKPOINT_STALL)
FIT_INPUT_NOTE = ("model.fit pulls its input inside the compiled step: "
                  "data wait is part of compute")


@dataclasses.dataclass(frozen=True)
class _Execution:
  """One call of the compiled step: its steps, losses and span."""
  first_step: int
  losses: Tuple[float, ...]
  start_s: float
  end_s: float


class FitStepTimer(keras.callbacks.Callback):
  """Times each `model.fit` execution into a `LoopContext`'s ledger.

  Keras calls it once per execution of `steps_per_execution` steps, with
  the execution's first and last batch index; at 1 that is every batch.
  An execution is closed (its steps ended in the ledger, the progress
  line printed, the context's checkpointer asked) when the next one
  begins or training ends, so that what other callbacks do after it (an
  `AsyncCheckpoint`'s snapshot) belongs to its last step.

  Usage (a trainer that keeps its own context):
    timer = FitStepTimer(ctx)
    model.fit(data, epochs=1, steps_per_epoch=n, callbacks=[timer])

  Args:
    ctx: the loop's bookkeeping (a subclass may set `_ctx` in
      on_train_begin instead).
    checkpoint: an `AsyncCheckpoint` of the same fit whose snapshots are
      recorded as checkpoint_stall, or None.
  """

  def __init__(self, ctx: Optional[LoopContext] = None, *,
               checkpoint: Optional[AsyncCheckpoint] = None):
    super().__init__()
    if checkpoint is not None and not isinstance(checkpoint, AsyncCheckpoint):
      raise ArgumentError("checkpoint", checkpoint,
                          "allowed: None or a tfoverlap.checkpoint."
                          "AsyncCheckpoint passed to the same fit")
    self._ctx = ctx
    self._checkpoint = checkpoint
    self._next_step = 1
    self._start_s = 0.0
    self._first_batch = 0
    self._pending: Optional[_Execution] = None
    self.last_loss = float("nan")

  def on_train_begin(self, logs=None):
    self._pending = None
    self._next_step = self._ctx.first_step
    if self._checkpoint is not None:
      self._checkpoint.take_stall_spans()  # none of them are this fit's

  def on_train_batch_begin(self, batch, logs=None):
    self._close_pending()
    self._first_batch = batch
    self._start_s = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    end_s = time.perf_counter()
    # Keras reports the running mean of the epoch's loss here, once per
    # execution: every step of it is given that value.
    self.last_loss = float(logs["loss"]) if logs else float("nan")
    num_steps = batch - self._first_batch + 1
    self._pending = _Execution(self._next_step,
                               (self.last_loss,) * num_steps,
                               self._start_s, end_s)
    self._next_step += num_steps

  def on_train_end(self, logs=None):
    self._close_pending()

  def _close_pending(self) -> None:
    execution, self._pending = self._pending, None
    if execution is None:
      return
    stalls = (self._checkpoint.take_stall_spans()
              if self._checkpoint is not None else [])
    after_execution(self._ctx, execution.first_step, execution.losses,
                    execution.start_s, execution.end_s,
                    split_compute=(_with_stalls(execution, stalls)
                                   if stalls else None))


def _with_stalls(execution: _Execution,
                 stalls: Sequence[Tuple[float, float]]):
  """`after_execution`'s split_compute: the checkpoint's snapshot spans
  go into the execution's last step as checkpoint_stall.

  A snapshot taken before this timer's batch end (the checkpoint listed
  first in `callbacks`) lies inside the timed span: it is carved from the
  end of the last step's compute. One taken after it lies between the span
  and the step's end (the next batch's begin), where it is added as is.
  """
  inside_s = sum(min(end, execution.end_s) - start
                 for start, end in stalls if start < execution.end_s)
  after = [(ledger_lib.CHECKPOINT_STALL, start, end)
           for start, end in stalls if start >= execution.end_s]

  shares_left = [len(execution.losses)]

  def split(start_s: float, end_s: float) -> List[tuple]:
    # Called once per step of the execution, in order.
    shares_left[0] -= 1
    if shares_left[0]:
      return [(ledger_lib.COMPUTE, start_s, end_s)]
    split_s = max(start_s, end_s - inside_s)
    return [(ledger_lib.COMPUTE, start_s, split_s),
            (ledger_lib.CHECKPOINT_STALL, split_s, end_s), *after]

  return split


class LedgerCallback(FitStepTimer):
  """The step ledger of the trainers, for any Keras `model.fit`.

  Records where each step's time goes: compute (forward, backward, update;
  `model.fit` reads its input inside the compiled step, so the data wait
  is part of it and shown as n/a), the checkpoint stall of an
  `AsyncCheckpoint` passed as `checkpoint`, and the rest (other callbacks,
  Keras' own work, validation). Prints a progress line every
  `log_every_steps` steps; when training ends, prints the per-step
  breakdown and writes `<directory>/run.json` in the trainers' schema,
  which `overlap_compare` reads. `record` holds it afterwards.

  Usage:
    ckpt = AsyncCheckpoint("ckpts", every="auto")
    model.fit(dataset, epochs=3, callbacks=[
        ckpt, LedgerCallback("runs/mine", batch_size=64, checkpoint=ckpt)])

  Steps are numbered from 1 in each fit, across its epochs. From
  `on_train_begin` to `on_train_end` the callback is `directory`'s one
  writer (a `DirectoryInUseError` refuses a second), so keep an
  `AsyncCheckpoint`'s directory apart from it.

  Args:
    directory: where run.json is written.
    batch_size: samples per step, the global batch (for samples/s).
    checkpoint: the `AsyncCheckpoint` in the same `callbacks`, to record
      its snapshots as checkpoint_stall and its stats in run.json.
    log_every_steps: a progress line every this many steps.
    progress: False prints no progress lines nor breakdown.
    stream: where they go (default: stdout).

  Raises:
    ValueError (an ArgumentError): at once, for an argument that is not
      allowed, naming it.
    DirectoryInUseError: in on_train_begin, when another writer holds
      `directory`.
  """

  def __init__(self, directory: str, *, batch_size: int,
               checkpoint: Optional[AsyncCheckpoint] = None,
               log_every_steps: int = 10, progress: bool = True,
               stream=None):
    super().__init__(None, checkpoint=checkpoint)
    self._loop = UserLoop(directory, framework=FRAMEWORK,
                          batch_size=batch_size,
                          log_every_steps=log_every_steps,
                          progress=progress, stream=stream)
    self._first_epoch: Optional[int] = None
    self.record: Optional[dict] = None

  @property
  def directory(self) -> str:
    return self._loop.directory

  def on_train_begin(self, logs=None):
    self.record = None
    self._first_epoch = None
    self._ctx = self._loop.begin(total_steps=None)
    super().on_train_begin(logs)

  def on_epoch_begin(self, epoch, logs=None):
    if self._first_epoch is None:
      # Known only now: a restoring AsyncCheckpoint moves the first epoch.
      self._first_epoch = epoch
      steps = (self.params or {}).get("steps")
      epochs = (self.params or {}).get("epochs", 1)
      if steps:
        self._loop.set_total_steps(steps * (epochs - epoch))

  def on_train_end(self, logs=None):
    super().on_train_end(logs)
    # Here, not at the top: the trainer's loops import this module.
    from tfoverlap import trainer  # pylint: disable=g-import-not-at-top
    strategy = self.model.distribute_strategy
    self.record = self._loop.write(
        model=self.model, model_name=self.model.name,
        num_params=models.num_params(self.model),
        weights_digest=trainer.weights_digest(self.model),
        environment=trainer.describe_environment(strategy),
        strategy={"name": "user", "class": type(strategy).__name__,
                  "num_replicas": strategy.num_replicas_in_sync,
                  "devices": distribute.replica_devices(strategy)},
        final={"train_loss": self.last_loss},
        phases_measured=PHASES_MEASURED,
        checkpoint_stats=(self._checkpoint.stats()
                          if self._checkpoint is not None else None),
        notes=[FIT_INPUT_NOTE])
