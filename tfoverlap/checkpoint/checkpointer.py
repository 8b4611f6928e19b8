"""The checkpointer the TensorFlow training loops call, for every mode.

One interface whatever the mode, so the loops and the ledger do not care:

  checkpointer = Checkpointer(cfg, directory, model=m, optimizer=o)
  ... the loop of `overlap_core.checkpoint.checkpointer`

The interface and its delegation to the engine (cadence, background
persist, failure and busy policies, the numbers for run.json) are
`overlap_core.checkpoint.checkpointer.Checkpointer`, shared with PyTorch;
this subclass supplies what only TensorFlow knows: the snapshot and its
restore (async), or the TensorFlow save (sync, tf_async).

In a multi-worker run only the chief writes. Every worker restores from the
chief's directory, so all resume at one step, and every worker runs the
cadence, so all agree on the steps that checkpoint. The TensorFlow baselines
are the exception that proves the rule: every worker must take part in a
`tf.train.Checkpoint` save of replicated variables, so the others save to a
scratch directory that `close` removes.
"""

import os
import shutil
from typing import Optional

from overlap_core.checkpoint import checkpointer as shared
from overlap_core.checkpoint.engine import ResumePoint
from overlap_core.checkpoint.files import LoadedCheckpoint
from overlap_core.runtime.config import CheckpointConfig
from tfoverlap.checkpoint import baseline, snapshot


class Checkpointer(shared.Checkpointer):
  """Saves and restores model, optimizer, seed states and data position.

  Args:
    cfg: the checkpoint configuration.
    directory: where the chief writes and every worker restores from.
    model, optimizer: built Keras objects (the optimizer's slots exist).
    worker_index: this worker's index (names a baseline's scratch directory).
    **kwargs: is_chief, describe_state (async mode only), agree, log: as
      `overlap_core.checkpoint.checkpointer.Checkpointer`.
  """

  MODES = ("sync", "tf_async", "async")

  def __init__(self, cfg: CheckpointConfig, directory: str, *, model,
               optimizer, worker_index: int = 0, **kwargs):
    super().__init__(cfg, directory, **kwargs)
    self._model = model
    self._optimizer = optimizer
    self._files = None
    self._scratch = None
    if cfg.mode == "async":
      self._taker = snapshot.SnapshotTaker(model.variables,
                                           optimizer.variables)
      self._start_engine()
      return
    if not self.is_chief:
      self._scratch = os.path.join(directory,
                                   f"scratch-worker-{worker_index}")
    write_dir = self._scratch or directory
    self._files = baseline.TFCheckpointFiles(
        write_dir, mode=cfg.mode, keep=cfg.keep, model=model,
        optimizer=optimizer)
    # Every worker saves: the save is a collective over replicated variables.
    self._start_engine(write_dir, is_writer=True,
                       save_inline=self._files.save)

  def _take(self):
    return self._taker(), {}

  def _to_host(self, value):
    return snapshot.to_host(value)

  def _assign(self, loaded: LoadedCheckpoint) -> None:
    snapshot.restore(loaded, model_variables=self._model.variables,
                     optimizer_variables=self._optimizer.variables)

  def _restore_point(self) -> Optional[ResumePoint]:
    if self._files is None:
      return super()._restore_point()
    step = self._files.restore_latest(self.directory)
    if not step:
      return None
    return ResumePoint(step=step, state={"step": step}, path=self.directory)

  def _release(self) -> None:
    if self._files is not None:
      self._files.wait()
    if self._scratch is not None:
      shutil.rmtree(self._scratch, ignore_errors=True)


build_checkpointer = Checkpointer.for_run
