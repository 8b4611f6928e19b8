"""`AsyncCheckpoint`: two-phase checkpoints for any Keras `model.fit`."""

import dataclasses
import time
from typing import Callable, List, Optional, Tuple, Union

import keras

from overlap_core.checkpoint import checkpointer as shared
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.runtime.config import (ArgumentError, CheckpointConfig,
                                         every_steps_from)
from tfoverlap.checkpoint.checkpointer import Checkpointer


@dataclasses.dataclass(frozen=True)
class ResumePosition:
  """Where a restored `model.fit` goes on."""
  step: int  # batches trained in all, over every epoch
  epoch: int  # the epoch to continue in
  batch: int  # batches of that epoch already trained on


# Where state.json keeps the length of an epoch of unknown length, once known.
_EPOCH_LENGTH_KEY = "batches_per_epoch"


class AsyncCheckpoint(keras.callbacks.Callback):
  """Checkpoints a `model.fit` in two phases: snapshot now, write later.

  At each due batch the model's variables (weights, statistics, seed
  states) and the optimizer's are copied between two updates (the only time
  training waits), and a background thread writes them atomically, with
  checksums, keeping the newest `keep`. With `every="auto"` the interval is
  the smallest that keeps checkpoint overhead under `max_overhead_frac`,
  measured as training runs. A fit that finds checkpoints in `directory`
  restores the newest one that verifies (model, optimizer, seeds) and
  continues from its epoch; a fit that had finished stays finished.

  Usage:
    model.fit(dataset, epochs=10, callbacks=[
        AsyncCheckpoint("ckpts", every="auto", max_overhead_frac=0.03)])

  Beside a `tfoverlap.ledger.LedgerCallback(..., checkpoint=this)` in the
  same `callbacks`, each snapshot's wait is that step's checkpoint_stall in
  the step ledger and run.json.

  Restoring mid-epoch, Keras restarts that epoch from its first batch; to
  continue with exactly the next batch, skip `resume_position(directory)
  .batch` batches of that epoch in your dataset. Datasets of unknown length
  work: the epoch's length is learnt when an epoch ends, and kept in the
  checkpoints.

  The weights load into plain Keras without tfoverlap: see
  docs/your-own-model.md, "Loading a checkpoint without tfoverlap".

  From `on_train_begin` to `on_train_end` the callback is `directory`'s one
  writer: another fit on it, in this process or another, is refused when
  it begins, with a `DirectoryInUseError` naming the holder (pid, host,
  start time).

  Args:
    directory: where checkpoints are written and restored from.
    every: a number of batches, or "auto".
    max_overhead_frac: the overhead bound of `every="auto"` (0.03 = 3%).
    keep: how many of the newest checkpoints to keep.
    on_error: "raise" or "warn" when a save fails.
    if_busy: "wait" or "skip" when the previous write is still running.
    restore: restore the newest checkpoint when training begins. With
      False, a `directory` that holds checkpoints is refused, unless
      `overwrite`.
    overwrite: with restore=False, delete the checkpoints in `directory`
      when training begins and start over.
    log: where cadence decisions and warnings go (default: stderr).

  Raises:
    ValueError (a ConfigError): at once, for an argument that is not
      allowed, naming it, the value received and what is allowed.
    DirectoryInUseError (a ConfigError): in on_train_begin, when another
      writer holds `directory`.
  """

  def __init__(self, directory: str, *, every: Union[int, str] = "auto",
               max_overhead_frac: float = 0.03, keep: int = 3,
               on_error: str = "raise", if_busy: str = "wait",
               restore: bool = True, overwrite: bool = False,
               log: Callable[[str], None] = checkpoint_files.warn_to_stderr):
    super().__init__()
    self._config = CheckpointConfig(
        mode="async", every_steps=every_steps_from(every, "every"),
        keep=keep, max_overhead_frac=max_overhead_frac, on_error=on_error,
        if_busy=if_busy, names={"every_steps": "every"})
    if overwrite and restore:
      raise ArgumentError("overwrite", overwrite,
                          "allowed: False when restore=True (overwrite=True "
                          "starts over, which needs restore=False)")
    self.directory = directory
    self._restore = restore
    self._overwrite = overwrite
    self._log = log
    self._checkpointer: Optional[Checkpointer] = None
    self._open = False  # between on_train_begin and on_train_end
    self._step = 0  # batches trained in all, the restored ones included
    self._epoch = 0  # the epoch the next batch belongs to
    self._batch = 0  # batches of that epoch trained on
    self._batches_per_epoch: Optional[int] = None
    self._length_unknown = False
    self._saved_step: Optional[int] = None  # the last step this fit saved
    self._pending_step: Optional[int] = None  # due, saved at the epoch's end
    self.restored_from: Optional[ResumePosition] = None
    # (start_s, end_s) on time.perf_counter of each wait for a snapshot,
    # until `take_stall_spans`.
    self._stall_spans: List[Tuple[float, float]] = []

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
    self._step, self._epoch, self._batch = 0, 0, 0
    self._saved_step = self._pending_step = None
    self.restored_from = None
    self._stall_spans = []
    # None for a dataset of unknown length, until an epoch of it ends.
    self._batches_per_epoch = (self.params or {}).get("steps")
    self._length_unknown = self._batches_per_epoch is None
    if self._open:
      # A fit of this callback that raised, so never reached on_train_end,
      # still holds the directory.
      self._open = False
      self._checkpointer.close()
    # First: the checkpointer holds the directory from here on, so what
    # follows (deleting with overwrite=True, restoring) happens under it.
    checkpointer = Checkpointer(
        self._config, self.directory, model=self.model, optimizer=optimizer,
        describe_state=self._describe_state, log=self._log)
    try:
      if not self._restore:
        self._start_over()
      resume = checkpointer.restore_latest() if self._restore else None
    except BaseException:
      # Keras calls no on_train_end after a failed on_train_begin.
      checkpointer.close()
      raise
    self._checkpointer, self._open = checkpointer, True
    if resume is not None:
      self._go_on_from(resume.state)

  def _start_over(self) -> None:
    """restore=False: refuses another run's checkpoints, or deletes them."""
    if not self._overwrite:
      shared.refuse_existing_checkpoints(
          self.directory, "pass restore=True to go on from them, "
          "overwrite=True to delete them and start over, or another "
          "directory")
      return
    removed = shared.remove_checkpoints(self.directory)
    if removed:
      self._log(f"overwrite=True: deleted the {len(removed)} checkpoints "
                f"in {self.directory}, steps {removed[0]}..{removed[-1]}")

  def _go_on_from(self, state: dict) -> None:
    position = self.restored_from = _position(state)
    # Where training is until a batch runs: a fit with nothing left to do
    # ends where the checkpoint said, not at epoch 0.
    self._step, self._epoch, self._batch = (position.step, position.epoch,
                                            position.batch)
    if self._length_unknown:
      self._batches_per_epoch = state.get(_EPOCH_LENGTH_KEY)
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
    if not self._checkpointer.is_due(self._step):
      return
    if self._length_unknown and self._batch == self._batches_per_epoch:
      # After the last batch of data of unknown length, Keras runs one more
      # step that finds no data but still advances the optimizer's
      # iteration count and the seed states: the state to go on from is
      # the one at the epoch's end.
      self._pending_step = self._step
      return
    self._save(self._step)

  def on_epoch_end(self, epoch, logs=None):
    learnt = (self._batches_per_epoch is None and self._batch > 0
              # Stopped early, the epoch may not have ended its data.
              and not self.model.stop_training)
    if learnt:
      self._batches_per_epoch = self._batch
    if self._batch == self._batches_per_epoch:
      self._epoch, self._batch = epoch + 1, 0
    if self._pending_step is not None:
      self._save(self._pending_step)
    elif learnt and self._saved_step == self._step:
      # Its last batch was saved before this process knew it was the last,
      # as a position inside the epoch; a rerun would train the epoch
      # again. Saved again, in place, as the start of the next epoch.
      self._checkpointer.wait_until_finished()
      self._save(self._step)

  def _save(self, step: int) -> None:
    self._pending_step = None
    start_s = time.perf_counter()
    try:
      if self._checkpointer.save(step):
        self._saved_step = step
    finally:
      self._stall_spans.append((start_s, time.perf_counter()))

  def take_stall_spans(self) -> List[Tuple[float, float]]:
    """The spans training waited for snapshots since the last call.

    (start_s, end_s) on `time.perf_counter`, for a step ledger
    (`tfoverlap.ledger.LedgerCallback` records them as checkpoint_stall).
    """
    spans, self._stall_spans = self._stall_spans, []
    return spans

  def on_train_end(self, logs=None):
    # The final state too: a finished fit resumes as finished. (A fit that
    # trained no batch writes nothing: its state is the restored one.)
    self._open = False
    self._checkpointer.finish(self._step)

  def _describe_state(self, step: int) -> dict:
    # The last batch of an epoch ends it: a restore goes on with the next.
    epoch_done = self._batch > 0 and self._batch == self._batches_per_epoch
    state = {"epoch": self._epoch + 1 if epoch_done else self._epoch,
             "batch_in_epoch": 0 if epoch_done else self._batch}
    if self._length_unknown and self._batches_per_epoch:
      # A process that restores this knows the length from the start.
      state[_EPOCH_LENGTH_KEY] = self._batches_per_epoch
    return state

  def wait_until_finished(self) -> None:
    """Blocks until the last checkpoint is written (or its error raised)."""
    if self._checkpointer is not None:
      self._checkpointer.wait_until_finished()

  def stats(self) -> dict:
    """Counts, stall and persist times, and the cadence decisions."""
    return self._checkpointer.stats() if self._checkpointer else {}


def _position(state: dict) -> ResumePosition:
  return ResumePosition(step=int(state["step"]), epoch=int(state["epoch"]),
                        batch=int(state.get("batch_in_epoch", 0)))
