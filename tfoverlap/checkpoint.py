"""Checkpoints during training: the synchronous and TensorFlow-async baselines.

  sync      tf.train.CheckpointManager.save(): training waits for the write.
  tf_async  the same with CheckpointOptions(enable_async=True): the values
            are copied on the training thread and written in the background;
            the next save blocks until the previous write has finished.

Either way the time the training loop is blocked is the checkpoint stall the
ledger records. Checkpoints restore with plain `tf.train.Checkpoint`.
"""

import os
import shutil

import tensorflow as tf

from tfoverlap.core.config import CheckpointConfig

CHECKPOINT_DIR_NAME = "checkpoints"


def raw_variables(variables) -> dict:
  """The tf.Variables behind Keras 3 variables, keyed by variable path.

  TensorFlow's async save copies each trackable to the CPU inside a
  tf.function, and Keras 3 variables create a new tf.Variable there, which
  tf.function refuses on the second save; the raw variables copy cleanly.
  Keying by path also makes a checkpoint independent of object structure.
  """
  return {v.path.replace("/", "."): v.value for v in variables}


class Checkpointer:
  """Saves model, optimizer and step every `every_steps` steps.

  In a multi-worker run every worker must take part in the save (reading
  replicated variables may all-reduce), but only the chief's files are kept:
  the others write to a scratch directory that is removed afterwards. Every
  worker restores from the chief's checkpoints, so all resume at one step.

  Usage:
    checkpointer = Checkpointer(cfg, model_dir, model=m, optimizer=o,
                                is_chief=True)
    start_step = checkpointer.restore_latest()
    ...
    if checkpointer.is_due(step):
      checkpointer.save(step)
    checkpointer.close()
  """

  def __init__(self, cfg: CheckpointConfig, model_dir: str, *, model,
               optimizer, is_chief: bool, worker_index: int = 0):
    self._cfg = cfg
    self._is_chief = is_chief
    self._chief_directory = os.path.join(model_dir, CHECKPOINT_DIR_NAME)
    if is_chief:
      self.directory = self._chief_directory
    else:
      self.directory = os.path.join(model_dir, f"worker-{worker_index}",
                                    "checkpoint-scratch")
    self._checkpoint = tf.train.Checkpoint(
        model=raw_variables(model.weights),
        optimizer=raw_variables(optimizer.variables))
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, self.directory, max_to_keep=cfg.keep)
    self._options = tf.train.CheckpointOptions(
        enable_async=cfg.mode == "tf_async")
    self.num_saves = 0

  def restore_latest(self) -> int:
    """Restores the newest checkpoint, if any; returns its step (or 0)."""
    latest = tf.train.latest_checkpoint(self._chief_directory)
    if latest is None:
      return 0
    self._checkpoint.restore(latest).assert_existing_objects_matched()
    return int(latest.rsplit("-", 1)[1])

  def is_due(self, step: int) -> bool:
    """Whether `step` is on the checkpoint cadence."""
    return step % self._cfg.every_steps == 0

  def save(self, step: int) -> None:
    """Saves now; blocks for the whole write (sync) or the copy (tf_async)."""
    self._manager.save(checkpoint_number=step, options=self._options)
    self.num_saves += 1

  def close(self) -> None:
    """Waits for a background write, then drops a non-chief's scratch."""
    self._checkpoint.sync()
    if not self._is_chief:
      shutil.rmtree(self.directory, ignore_errors=True)


def build_checkpointer(cfg: CheckpointConfig, model_dir: str, **kwargs):
  """A Checkpointer, or None for --checkpoint=none."""
  if cfg.mode == "none":
    return None
  return Checkpointer(cfg, model_dir, **kwargs)
