"""The checkpointer the PyTorch training loop calls, for every mode.

The same interface as `tfoverlap.checkpoint.Checkpointer`, so the torch loop
is the TensorFlow loop:

  checkpointer = Checkpointer(cfg, checkpoint_dir(model_dir), model=m,
                              optimizer=o, is_chief=rank == 0)
  restored = checkpointer.restore_latest()     # None, or a ResumePoint
  for step in ...:
    train_step()
    if checkpointer.is_due(step):
      checkpointer.save(step)                  # the checkpoint stall
  checkpointer.finish(last_step)

The modes:
  async  two-phase: the snapshot (`snapshot.SnapshotTaker`) is the stall, a
         background thread persists it.
  sync   the same snapshot and the same files, persisted on the training
         thread before `save` returns: the synchronous baseline. PyTorch has
         no checkpoint of its own to compare with (torch.save pickles and is
         itself synchronous), so the baseline is this format written
         inline, and sync and async differ only in where the persist runs.
  tf_async is TensorFlow's own and refused here.

The framework-neutral work (cadence, background persist, failure and busy
policies, the numbers for run.json) is `core.checkpoint_engine.CheckpointEngine`.
In a multi-process run only rank 0 writes; every rank restores from rank
0's directory, so all resume at one step, and every rank runs the cadence
(agreeing through an all-reduce), so all agree on the steps that checkpoint.
"""

from typing import Callable, Optional

from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.checkpoint.cadence import Agree
from overlap_core.checkpoint.engine import ResumePoint, checkpoint_dir
from overlap_core.runtime.config import CheckpointConfig
from torch_parity.checkpoint import snapshot

MODES = ("sync", "async")


class Checkpointer:
  """Saves and restores model, optimizer, RNG states and data position.

  Args:
    cfg: the checkpoint configuration (mode sync or async).
    directory: where rank 0 writes and every rank restores from.
    model: the module (a DDP or torch.compile wrapper is looked through).
    optimizer: the optimizer that trains it (Horovod's wrapper included).
    is_chief: whether this process writes.
    describe_state: step -> JSON-able state stored with the checkpoint
      (epoch, data position).
    agree: the ranks' all-reduce maximum for the adaptive cadence; None in
      a single process.
    log: where cadence decisions and warnings go.

  Raises:
    ValueError: a mode other than sync or async.
    CheckpointError: a tensor of a dtype checkpoints cannot store.
  """

  def __init__(self, cfg: CheckpointConfig, directory: str, *, model,
               optimizer, is_chief: bool = True,
               describe_state: Callable[[int], dict] = lambda step: {},
               agree: Optional[Agree] = None,
               log: Callable[[str], None] = checkpoint_files.warn_to_stderr):
    if cfg.mode not in MODES:
      raise ValueError(f"mode={cfg.mode!r}: allowed: {', '.join(MODES)}")
    self._cfg = cfg
    self._model = model
    self._optimizer = optimizer
    self._describe_state = describe_state
    self._log = log
    self.directory = directory
    # Only the writer copies; the other ranks keep no host buffers.
    self._take = (snapshot.SnapshotTaker(model, optimizer) if is_chief
                  else None)
    common = dict(mode=cfg.mode, every_steps=cfg.every_steps,
                  max_overhead_frac=cfg.max_overhead_frac, keep=cfg.keep,
                  on_error=cfg.on_error, if_busy=cfg.if_busy, agree=agree,
                  is_writer=is_chief, log=log)
    if cfg.mode == "async":
      self.engine = checkpoint_engine.CheckpointEngine(
          directory, take_snapshot=self._snapshot, to_host=snapshot.to_host,
          **common)
    else:
      self.engine = checkpoint_engine.CheckpointEngine(
          directory, save_inline=self._save_inline, **common)

  def _snapshot(self, step: int) -> checkpoint_engine.Snapshot:
    groups, extra_state = self._take()
    state = {"step": step, **self._describe_state(step), **extra_state}
    return checkpoint_engine.Snapshot(step=step, groups=groups, state=state)

  def _save_inline(self, step: int) -> None:
    checkpoint_engine.write_snapshot(self.directory, self._snapshot(step),
                                 to_host=snapshot.to_host,
                                 keep=self._cfg.keep)

  def restore_latest(self) -> Optional[ResumePoint]:
    """Restores the newest good checkpoint; None when there is none.

    Raises:
      CheckpointError: checkpoints exist but none verifies.
      CheckpointMismatchError: the newest good one does not fit the model.
    """
    loaded = checkpoint_files.load_latest(self.directory, warn=self._log)
    if loaded is None:
      return None
    snapshot.restore(loaded, model=self._model, optimizer=self._optimizer)
    point = ResumePoint(step=loaded.step, state=loaded.state,
                        path=loaded.path)
    self.engine.resumed_from(point.step, point.path)
    return point

  def is_due(self, step: int) -> bool:
    return self.engine.is_due(step)

  def save(self, step: int) -> bool:
    return self.engine.save(step)

  def finish(self, last_step: int) -> None:
    """Saves the final state (unless just saved) and closes."""
    self.engine.finish(last_step)

  def close(self) -> None:
    """Waits for the last write; a failed one raises per on_error."""
    self.engine.close()

  def stats(self) -> dict:
    return self.engine.stats()


def build_checkpointer(cfg: CheckpointConfig, model_dir: str,
                       **kwargs) -> Optional[Checkpointer]:
  """The run's Checkpointer, or None for --checkpoint=none."""
  if cfg.mode == "none":
    return None
  return Checkpointer(cfg, checkpoint_dir(model_dir), **kwargs)
