"""`AsyncCheckpoint`: two-phase checkpoints for any Keras `model.fit`."""

import dataclasses
from typing import Callable, Optional, Union

import keras

from tfoverlap.checkpoint.checkpointer import Checkpointer
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.runtime.config import CHECKPOINT_AUTO, CheckpointConfig


@dataclasses.dataclass(frozen=True)
class ResumePosition:
  """Where a restored `model.fit` goes on."""
  step: int  # batches trained in all, over every epoch
  epoch: int  # the epoch to continue in
  batch: int  # batches of that epoch already trained on


def _invalid(name: str, value, allowed: str) -> ValueError:
  return ValueError(f"Invalid value for argument `{name}`. Expected {allowed}."
                    f" Received: {name}={value!r}")


class AsyncCheckpoint(keras.callbacks.Callback):
  """Checkpoints a `model.fit` in two phases: snapshot now, write later.

  At each due batch the model's variables (weights, statistics, seed
  states) and the optimizer's are copied between two updates (the only time training waits),
  and a background thread writes them atomically, with checksums, keeping
  the newest `keep`. With `every="auto"` the interval is the smallest that
  keeps checkpoint overhead under `max_overhead_frac`, measured as training
  runs. A fit that finds checkpoints in `directory` restores the newest one
  that verifies (model, optimizer, seeds) and continues from its epoch.

  Usage:
    model.fit(dataset, epochs=10, callbacks=[
        AsyncCheckpoint("ckpts", every="auto", max_overhead_frac=0.03)])

  Restoring mid-epoch, Keras restarts that epoch from its first batch; to
  continue with exactly the next batch, skip `resume_position(directory)
  .batch` batches of that epoch in your dataset.

  The weights load into plain Keras without tfoverlap: see the README,
  "Loading a checkpoint without tfoverlap".

  Args:
    directory: where checkpoints are written and restored from.
    every: a number of batches, or "auto".
    max_overhead_frac: the overhead bound of `every="auto"` (0.03 = 3%).
    keep: how many of the newest checkpoints to keep.
    on_error: "raise" or "warn" when a save fails.
    if_busy: "wait" or "skip" when the previous write is still running.
    restore: restore the newest checkpoint when training begins.
    log: where cadence decisions and warnings go (default: stderr).
  """

  def __init__(self, directory: str, *, every: Union[int, str] = "auto",
               max_overhead_frac: float = 0.03, keep: int = 3,
               on_error: str = "raise", if_busy: str = "wait",
               restore: bool = True,
               log: Callable[[str], None] = checkpoint_files.warn_to_stderr):
    super().__init__()
    if every == "auto":
      every_steps = CHECKPOINT_AUTO
    elif isinstance(every, int) and not isinstance(every, bool) and every > 0:
      every_steps = every
    else:
      raise _invalid("every", every, '"auto" or an integer >= 1')
    if not 0 < max_overhead_frac < 1:
      raise _invalid("max_overhead_frac", max_overhead_frac,
                     "a fraction between 0 and 1")
    if not isinstance(keep, int) or keep < 1:
      raise _invalid("keep", keep, "an integer >= 1")
    if on_error not in checkpoint_engine.ON_ERROR_POLICIES:
      raise _invalid("on_error", on_error, '"raise" or "warn"')
    if if_busy not in checkpoint_engine.IF_BUSY_POLICIES:
      raise _invalid("if_busy", if_busy, '"wait" or "skip"')
    self.directory = directory
    self._config = CheckpointConfig(
        mode="async", every_steps=every_steps, keep=keep,
        max_overhead_frac=max_overhead_frac, on_error=on_error,
        if_busy=if_busy)
    self._restore = restore
    self._log = log
    self._checkpointer: Optional[Checkpointer] = None
    self._step = 0
    self._epoch = 0
    self._batch = 0
    self.restored_from: Optional[ResumePosition] = None

  @staticmethod
  def resume_position(directory: str) -> Optional[ResumePosition]:
    """Where a fit restored from `directory` would go on; None if nowhere."""
    loaded = checkpoint_files.load_latest(directory)
    return None if loaded is None else _position(loaded.state)

  def on_train_begin(self, logs=None):
    optimizer = self.model.optimizer
    if not optimizer.built:
      # The slots must exist before a restore can fill them.
      optimizer.build(self.model.trainable_variables)
    self._checkpointer = Checkpointer(
        self._config, self.directory, model=self.model, optimizer=optimizer,
        describe_state=self._describe_state, log=self._log)
    resume = self._checkpointer.restore_latest() if self._restore else None
    if resume is not None:
      position = _position(resume.state)
      self.restored_from = position
      self._step = position.step
      self.model._initial_epoch = position.epoch  # pylint: disable=protected-access
      if position.batch:
        self._log(f"restored step {position.step}: epoch {position.epoch} "
                  f"restarts at its first batch; {position.batch} of its "
                  "batches were trained on before the checkpoint")

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch
    self._batch = 0

  def on_train_batch_end(self, batch, logs=None):
    self._step += 1
    self._batch = batch + 1
    if self._checkpointer.is_due(self._step):
      self._checkpointer.save(self._step)

  def on_train_end(self, logs=None):
    # The final state too: a finished fit resumes as finished.
    self._checkpointer.finish(self._step)

  def _describe_state(self, step: int) -> dict:
    epoch_done = self._batch == (self.params or {}).get("steps")
    return {"epoch": self._epoch + 1 if epoch_done else self._epoch,
            "batch_in_epoch": 0 if epoch_done else self._batch}

  def wait_until_finished(self) -> None:
    """Blocks until the last checkpoint is written (or its error raised)."""
    if self._checkpointer is not None:
      self._checkpointer.close()

  def stats(self) -> dict:
    """Counts, stall and persist times, and the cadence decisions."""
    return self._checkpointer.stats() if self._checkpointer else {}


def _position(state: dict) -> ResumePosition:
  return ResumePosition(step=int(state["step"]), epoch=int(state["epoch"]),
                        batch=int(state.get("batch_in_epoch", 0)))
