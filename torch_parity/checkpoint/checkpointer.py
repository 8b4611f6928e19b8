"""The checkpointer the PyTorch training loop calls, for every mode.

The same interface as `tfoverlap.checkpoint.Checkpointer`, and the same
class underneath (`overlap_core.checkpoint.checkpointer.Checkpointer`), so
the torch loop is the TensorFlow loop:

  checkpointer = Checkpointer(cfg, directory, model=m, optimizer=o)
  ... the loop of `overlap_core.checkpoint.checkpointer`

The modes:
  async  two-phase: the snapshot (`snapshot.SnapshotTaker`) is the stall, a
         background thread persists it.
  sync   the same snapshot and the same files, persisted on the training
         thread before `save` returns: the synchronous baseline. PyTorch has
         no checkpoint of its own to compare with (torch.save pickles and is
         itself synchronous), so the baseline is this format written
         inline, and sync and async differ only in where the persist runs.
  tf_async is TensorFlow's own and refused here.

In a multi-process run only rank 0 writes; every rank restores from rank
0's directory, so all resume at one step, and every rank runs the cadence
(agreeing through an all-reduce), so all agree on the steps that checkpoint.
"""

from overlap_core.checkpoint import checkpointer as shared
from overlap_core.checkpoint.files import LoadedCheckpoint
from overlap_core.runtime.config import CheckpointConfig
from torch_parity.checkpoint import snapshot


class Checkpointer(shared.Checkpointer):
  """Saves and restores model, optimizer, RNG states and data position.

  Args:
    cfg: the checkpoint configuration (mode sync or async).
    directory: where rank 0 writes and every rank restores from.
    model: the module (a DDP or torch.compile wrapper is looked through).
    optimizer: the optimizer that trains it (Horovod's wrapper included).
    **kwargs: is_chief, describe_state, agree, log: as
      `overlap_core.checkpoint.checkpointer.Checkpointer`.

  Raises:
    ConfigError: a mode other than sync or async.
    CheckpointError: a tensor of a dtype checkpoints cannot store.
    DirectoryInUseError: another writer holds `directory` (it is held from
      here to `close()`/`finish()`).
  """

  MODES = ("sync", "async")

  def __init__(self, cfg: CheckpointConfig, directory: str, *, model,
               optimizer, **kwargs):
    super().__init__(cfg, directory, **kwargs)
    self._model = model
    self._optimizer = optimizer
    # Only the writer copies; the other ranks keep no host buffers.
    self._taker = (snapshot.SnapshotTaker(model, optimizer) if self.is_chief
                   else None)
    self._start_engine(
        save_inline=self._write_now if cfg.mode == "sync" else None)

  def _take(self):
    return self._taker()

  def _to_host(self, value):
    return snapshot.to_host(value)

  def _assign(self, loaded: LoadedCheckpoint) -> None:
    snapshot.restore(loaded, model=self._model, optimizer=self._optimizer)


build_checkpointer = Checkpointer.for_run
