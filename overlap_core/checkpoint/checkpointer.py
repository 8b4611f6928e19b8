"""What both frameworks' Checkpointers share: the delegation to the engine.

A framework side subclasses `Checkpointer` with only what it knows: how to
copy its training state (`_take`), how to restore a loaded checkpoint into
it (`_assign`), and how its engine persists (`_start_engine`). Everything
else, the interface the training loops call, is here once:

  checkpointer = SomeCheckpointer(cfg, directory, model=m, optimizer=o)
  restored = checkpointer.restore_latest()     # None, or a ResumePoint
  for step in ...:
    train_step()
    if checkpointer.is_due(step):
      checkpointer.save(step)                  # the checkpoint stall
  checkpointer.finish(last_step)               # the final state, then close

The writer holds its directory (`dir_lock`) from the engine's start to
`close()`: a second checkpointer on it, in this process or another, is
refused with the holder named (`DirectoryInUseError`). A trainer holds its
whole model directory instead (`for_run`).

A run that does not restore must not write into a directory that holds
another run's checkpoints (retention and the next restore would mix the
two): `refuse_existing_checkpoints` says so in one line, and
`remove_checkpoints` is the explicit way to start over there.
"""

import os
import shutil
import uuid
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint.cadence import Agree
from overlap_core.checkpoint.engine import ResumePoint, checkpoint_dir
from overlap_core.checkpoint.files import CheckpointError, LoadedCheckpoint
from overlap_core.runtime import dir_lock
from overlap_core.runtime.config import CheckpointConfig, setting_error

# A deleted checkpoint is renamed to the files' trash name first, so that a
# kill mid-delete leaves no half `ckpt-*`, only what the engine removes when
# it starts (`remove_stale_temporaries`).
_DELETING_PREFIX = checkpoint_files._TRASH_PREFIX  # pylint: disable=protected-access


class CheckpointsExistError(CheckpointError):
  """A run that does not restore found checkpoints where it would write."""


class CheckpointNotSharedError(CheckpointError):
  """Workers of one run found different checkpoints to resume from."""


class Checkpointer:
  """Saves and restores training state; the framework supplies the state.

  Args:
    cfg: the checkpoint configuration (validated when it was built).
    directory: where the chief writes and every worker restores from.
    is_chief: whether this process writes.
    describe_state: step -> JSON-able state stored with the checkpoint
      (epoch, data position).
    agree: the workers' all-reduce maximum for the adaptive cadence; None
      in a single process.
    log: where cadence decisions and warnings go.
    lock_directory: whether the writer holds `directory` (False where the
      caller holds a directory that contains it).

  Raises:
    ConfigError: a mode this framework does not checkpoint in (`MODES`).
    DirectoryInUseError: (when the engine starts) another writer holds
      `directory`.
  """

  MODES: Sequence[str] = ("sync", "async")

  def __init__(self, cfg: CheckpointConfig, directory: str, *,
               is_chief: bool = True,
               describe_state: Callable[[int], dict] = lambda step: {},
               agree: Optional[Agree] = None,
               log: Callable[[str], None] = checkpoint_files.warn_to_stderr,
               lock_directory: bool = True):
    if cfg.mode not in self.MODES:
      raise setting_error("mode", cfg.mode,
                          f"allowed here: {', '.join(self.MODES)}")
    self._cfg = cfg
    self.directory = directory
    self.is_chief = is_chief
    self._describe_state = describe_state
    self._agree = agree
    self._log = log
    self._ran_a_step = False
    self._lock_directory = lock_directory
    self._held: Optional[dir_lock.DirectoryLock] = None
    self.engine: Optional[checkpoint_engine.CheckpointEngine] = None

  @classmethod
  def for_run(cls, cfg: CheckpointConfig, model_dir: str,
              **kwargs) -> Optional["Checkpointer"]:
    """The run's checkpointer in `<model_dir>/checkpoints`; None for "none"."""
    if cfg.mode == "none":
      return None
    # The run holds model_dir (`outputs.hold_worker_dir`), checkpoints/
    # included, from before the model is built to after run.json.
    return cls(cfg, checkpoint_dir(model_dir), lock_directory=False,
               **kwargs)

  # --- What a framework side supplies ------------------------------------

  def _take(self) -> Tuple[Dict[str, Dict[str, Any]], dict]:
    """Copies the training state now: (group -> name -> value, extra state
    for state.json). Values are what `_to_host` turns into arrays."""
    raise NotImplementedError

  def _to_host(self, value) -> Any:
    """Runs on the persist thread: one value of `_take` as a NumPy array."""
    return value

  def _assign(self, loaded: LoadedCheckpoint) -> None:
    """Restores a loaded checkpoint into the model and optimizer.

    Raises:
      CheckpointMismatchError: it does not fit; nothing has changed then.
    """
    raise NotImplementedError

  def _release(self) -> None:
    """Frees what the side holds beyond the engine; runs after close."""

  # --- Shared ----------------------------------------------------------

  def _start_engine(self, write_dir: Optional[str] = None, *,
                    is_writer: Optional[bool] = None,
                    save_inline: Optional[Callable[[int], None]] = None
                    ) -> None:
    """Builds the engine: two-phase (`_take`, then a background persist)
    unless `save_inline` is given; writes to `directory` unless told."""
    cfg = self._cfg
    how = ({"save_inline": save_inline} if save_inline is not None else
           {"take_snapshot": self._snapshot, "to_host": self._to_host})
    if self.is_chief and self._lock_directory:
      # Here, where the writes begin, and after everything a subclass's
      # constructor may refuse: nothing is left held by a failed start.
      self._held = dir_lock.acquire(self.directory, log=self._log)
    try:
      self.engine = checkpoint_engine.CheckpointEngine(
          write_dir or self.directory, cfg,
          is_writer=self.is_chief if is_writer is None else is_writer,
          agree=self._agree, log=self._log, **how)
    except BaseException:
      if self._held is not None:
        self._held.release()
      raise

  def _snapshot(self, step: int) -> checkpoint_engine.Snapshot:
    groups, extra_state = self._take()
    state = {"step": step, **self._describe_state(step), **extra_state}
    return checkpoint_engine.Snapshot(step=step, groups=groups, state=state)

  def _write_now(self, step: int) -> None:
    """A synchronous checkpoint in the two-phase files: both phases here."""
    checkpoint_engine.write_snapshot(self.directory, self._snapshot(step),
                                     to_host=self._to_host,
                                     keep=self._cfg.keep)

  def _restore_point(self) -> Optional[ResumePoint]:
    """Loads the newest good checkpoint of the two-phase files, assigns it."""
    loaded = checkpoint_files.load_latest(self.directory, warn=self._log)
    if loaded is None:
      return None
    self._assign(loaded)
    return ResumePoint(step=loaded.step, state=loaded.state, path=loaded.path)

  def restore_latest(self) -> Optional[ResumePoint]:
    """Restores the newest good checkpoint; None when there is none.

    In a multi-worker run every worker must call it: the workers compare
    the step each found (a collective), so that none starts from scratch
    beside others that resume.

    Raises:
      CheckpointError: checkpoints exist but none verifies.
      CheckpointMismatchError: the newest good one does not fit the model.
      CheckpointNotSharedError: the workers found different checkpoints.
    """
    point = self._restore_point()
    check_every_worker_sees(point.step if point else 0, self.directory,
                            self._agree)
    if point is not None:
      self.engine.resumed_from(point.step, point.path)
    return point

  def is_due(self, step: int) -> bool:
    """Whether to checkpoint after `step`; call once per step, every worker."""
    self._ran_a_step = True
    return self.engine.is_due(step)

  def save(self, step: int) -> bool:
    """Checkpoints `step`; blocks only for the stall. False if skipped."""
    return self.engine.save(step)

  def wait_until_finished(self) -> None:
    """Blocks until the running persist, if any, is on disk."""
    self.engine.wait_until_finished()

  def finish(self, last_step: int) -> None:
    """Saves the final state (unless just saved) and closes.

    A process that ran no step, a rerun of a finished job for instance,
    saves nothing: what it holds is the restored checkpoint, already on
    disk, and a save would rewrite it with this process's idea of where
    training is.
    """
    try:
      if self._ran_a_step:
        self.engine.finish(last_step)
    finally:
      self.close()

  def close(self) -> None:
    """Waits for the last write, then lets the directory go; a failed
    write raises per on_error."""
    try:
      self.engine.close()
    finally:
      try:
        self._release()
      finally:
        if self._held is not None:
          self._held.release()

  def stats(self) -> dict:
    """What run.json reports about checkpoints."""
    return self.engine.stats()


def check_every_worker_sees(step: int, directory: str,
                            agree: Optional[Agree]) -> None:
  """Raises unless every worker found the checkpoint of `step` (0: none).

  Only the chief writes; a worker on another host restores from the same
  path, which must therefore be a directory every host reads. A worker
  that sees nothing there must not start from scratch while the others
  resume: the replicas would train from different states.

  Args:
    step: the step this worker restores (0 when it found none).
    directory: where this worker looked.
    agree: the workers' all-reduce maximum (a collective every worker calls
      here); None in a single process.

  Raises:
    CheckpointNotSharedError: one line naming `directory` and both steps.
  """
  if agree is None:
    return
  # One maximum gives both extremes: max(-x) is -min(x).
  highest, negated_lowest = agree([float(step), -float(step)])
  highest, lowest = int(highest), int(-negated_lowest)
  if highest == lowest:
    return
  if step < highest:
    raise CheckpointNotSharedError(
        f"{directory}: this worker sees {_seen(step)}, another resumes from "
        f"{_seen(highest)}; the chief's checkpoint directory must be one "
        "every host reads (a shared filesystem), so no worker starts from "
        "scratch")
  raise CheckpointNotSharedError(
      f"{directory}: this worker resumes from {_seen(step)}, another sees "
      f"{_seen(lowest)} there; the chief's checkpoint directory must be one "
      "every host reads (a shared filesystem)")


def refuse_existing_checkpoints(directory: str, resolve: str) -> None:
  """Raises unless `directory` holds no committed checkpoint.

  Args:
    directory: where a run that does not restore would write.
    resolve: how the user resolves it, in their terms (an argument or flag).

  Raises:
    CheckpointsExistError: one line naming the directory, its checkpoints
      and `resolve`.
  """
  steps = checkpoint_files.list_checkpoints(directory)
  if steps:
    raise CheckpointsExistError(
        f"{directory} holds checkpoints of steps {steps[0]}..{steps[-1]} "
        f"({len(steps)} in all), and a run that does not restore would mix "
        f"its checkpoints with them: {resolve}")


def remove_checkpoints(directory: str) -> Sequence[int]:
  """Deletes every committed checkpoint in `directory`; their steps.

  Each is renamed away before it is deleted: a kill mid-way leaves a
  directory the engine removes when it starts, never a half checkpoint.
  """
  steps = checkpoint_files.list_checkpoints(directory)
  for step in steps:
    doomed = os.path.join(directory, _DELETING_PREFIX + uuid.uuid4().hex[:8])
    os.rename(os.path.join(directory,
                           checkpoint_files.checkpoint_dir_name(step)), doomed)
    shutil.rmtree(doomed, ignore_errors=True)
  return steps


def _seen(step: int) -> str:
  return f"the checkpoint of step {step}" if step else "no checkpoint"
