"""The checkpointer the TensorFlow training loops call, for every mode.

One interface whatever the mode, so the loops and the ledger do not care:

  checkpointer = Checkpointer(cfg, checkpoint_dir(model_dir), model=m,
                              optimizer=o, is_chief=True)
  restored = checkpointer.restore_latest()     # None, or a ResumePoint
  for step in ...:
    train_step()
    if checkpointer.is_due(step):
      checkpointer.save(step)                  # the checkpoint stall
  checkpointer.close()

The framework-neutral work (cadence, background persist, failure and busy
policies, the numbers for run.json) is `core.checkpoint_engine.CheckpointEngine`;
this module supplies what only TensorFlow knows: the snapshot (async) or the
TensorFlow save (sync, tf_async).

In a multi-worker run only the chief writes. Every worker restores from the
chief's directory, so all resume at one step, and every worker runs the
cadence, so all agree on the steps that checkpoint. The TensorFlow baselines
are the exception that proves the rule: every worker must take part in a
`tf.train.Checkpoint` save of replicated variables, so the others save to a
scratch directory that `close` removes.
"""

import os
import shutil
from typing import Callable, Optional

from tfoverlap.checkpoint import baseline, snapshot
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.checkpoint.cadence import Agree
# Shared with the PyTorch checkpointer, which has the same interface.
from overlap_core.checkpoint.engine import ResumePoint, checkpoint_dir
from overlap_core.runtime.config import CheckpointConfig


class Checkpointer:
  """Saves and restores model, optimizer, seed states and data position.

  Args:
    cfg: the checkpoint configuration.
    directory: where the chief writes and every worker restores from.
    model, optimizer: built Keras objects (the optimizer's slots exist).
    is_chief: whether this process writes.
    worker_index: this worker's index (names a baseline's scratch directory).
    describe_state: step -> JSON-able state stored with the checkpoint
      (epoch, data position); async mode only.
    agree: the workers' all-reduce maximum for the adaptive cadence.
    log: where cadence decisions and warnings go.
  """

  def __init__(self, cfg: CheckpointConfig, directory: str, *, model,
               optimizer, is_chief: bool = True, worker_index: int = 0,
               describe_state: Callable[[int], dict] = lambda step: {},
               agree: Optional[Agree] = None,
               log: Callable[[str], None] = checkpoint_files.warn_to_stderr):
    self._cfg = cfg
    self._model = model
    self._optimizer = optimizer
    self._describe_state = describe_state
    self._log = log
    self.directory = directory
    self._scratch = None
    common = dict(mode=cfg.mode, every_steps=cfg.every_steps,
                  max_overhead_frac=cfg.max_overhead_frac, keep=cfg.keep,
                  on_error=cfg.on_error, if_busy=cfg.if_busy, agree=agree,
                  log=log)
    if cfg.mode == "async":
      self._files = None
      self._take = snapshot.SnapshotTaker(model.variables,
                                          optimizer.variables)
      self.engine = checkpoint_engine.CheckpointEngine(
          self.directory, take_snapshot=self._snapshot,
          to_host=snapshot.to_host, is_writer=is_chief, **common)
    else:
      if not is_chief:
        self._scratch = os.path.join(directory,
                                     f"scratch-worker-{worker_index}")
      write_dir = self._scratch or self.directory
      self._files = baseline.TFCheckpointFiles(
          write_dir, mode=cfg.mode, keep=cfg.keep, model=model,
          optimizer=optimizer)
      self.engine = checkpoint_engine.CheckpointEngine(
          write_dir, save_inline=self._files.save, **common)

  def _snapshot(self, step: int) -> checkpoint_engine.Snapshot:
    state = {"step": step, **self._describe_state(step)}
    return checkpoint_engine.Snapshot(step=step, groups=self._take(), state=state)

  def restore_latest(self) -> Optional[ResumePoint]:
    """Restores the newest good checkpoint; None when there is none.

    Raises:
      CheckpointError: checkpoints exist but none verifies.
      CheckpointMismatchError: the newest good one does not fit the model.
    """
    if self._cfg.mode == "async":
      loaded = checkpoint_files.load_latest(self.directory, warn=self._log)
      if loaded is None:
        return None
      snapshot.restore(loaded, model_variables=self._model.variables,
                       optimizer_variables=self._optimizer.variables)
      point = ResumePoint(step=loaded.step, state=loaded.state,
                          path=loaded.path)
    else:
      step = self._files.restore_latest(self.directory)
      if not step:
        return None
      point = ResumePoint(step=step, state={"step": step},
                          path=self.directory)
    self.engine.resumed_from(point.step, point.path)
    return point

  def is_due(self, step: int) -> bool:
    return self.engine.is_due(step)

  def save(self, step: int) -> bool:
    return self.engine.save(step)

  def finish(self, last_step: int) -> None:
    """Saves the final state (unless just saved) and closes."""
    try:
      self.engine.finish(last_step)
    finally:
      self.close()

  def close(self) -> None:
    """Waits for the last write; a failed one raises per on_error."""
    try:
      self.engine.close()
    finally:
      if self._files is not None:
        self._files.wait()
      if self._scratch is not None:
        shutil.rmtree(self._scratch, ignore_errors=True)

  def stats(self) -> dict:
    return self.engine.stats()


def build_checkpointer(cfg: CheckpointConfig, model_dir: str,
                       **kwargs) -> Optional[Checkpointer]:
  """The run's Checkpointer, or None for --checkpoint=none."""
  if cfg.mode == "none":
    return None
  return Checkpointer(cfg, checkpoint_dir(model_dir), **kwargs)
