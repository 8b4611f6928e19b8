"""The baselines: TensorFlow's own checkpoint, synchronous or async.

  sync      tf.train.CheckpointManager.save(): training waits for the write.
  tf_async  the same with CheckpointOptions(enable_async=True): the values
            are copied on the training thread and written in the background;
            the next save blocks until the previous write has finished.

Either way the time the training loop is blocked is the checkpoint stall the
ledger records. These checkpoints restore with plain `tf.train.Checkpoint`.
"""

import tensorflow as tf

BASELINE_MODES = ("sync", "tf_async")


def raw_variables(variables) -> dict:
  """The tf.Variables behind Keras 3 variables, keyed by variable path.

  TensorFlow's async save copies each trackable to the CPU inside a
  tf.function, and Keras 3 variables create a new tf.Variable there, which
  tf.function refuses on the second save; the raw variables copy cleanly.
  Keying by path also makes a checkpoint independent of object structure.
  """
  return {v.path.replace("/", "."): v.value for v in variables}


class TFCheckpointFiles:
  """tf.train.Checkpoint of model and optimizer, saved by step number.

  `model.variables` rather than `model.weights`: the layers' random-seed
  states are variables too, and a resumed run must continue their streams.
  """

  def __init__(self, directory: str, *, mode: str, keep: int, model,
               optimizer):
    if mode not in BASELINE_MODES:
      raise ValueError(f"mode={mode!r}: allowed: {', '.join(BASELINE_MODES)}")
    self.directory = directory
    self._checkpoint = tf.train.Checkpoint(
        model=raw_variables(model.variables),
        optimizer=raw_variables(optimizer.variables))
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, directory, max_to_keep=keep)
    self._options = tf.train.CheckpointOptions(
        enable_async=mode == "tf_async")

  def save(self, step: int) -> None:
    self._manager.save(checkpoint_number=step, options=self._options)

  def restore_latest(self, directory: str) -> int:
    """Restores the newest checkpoint in `directory`; its step, or 0."""
    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
      return 0
    self._checkpoint.restore(latest).assert_existing_objects_matched()
    return int(latest.rsplit("-", 1)[1])

  def wait(self) -> None:
    """Waits for a background (tf_async) write."""
    self._checkpoint.sync()
