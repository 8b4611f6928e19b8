"""The checkpoint directory: atomic commits, retention, crash recovery.

What one checkpoint holds, and how it is verified, is `layout`. Here is
what a directory of them may hold, and why a crash at any moment leaves a
good one:

  ckpt-<S, 10 digits>        a committed checkpoint of step S
  .tmp-ckpt-<S>-<id>         a write of step S in progress
  .old-ckpt-<S>-<id>         the previous ckpt-S while an overwrite of step S
                             puts the new one in place
  .trash-ckpt-<S>-<id>       a checkpoint being deleted
  .tmp-ckpt-probe-<id>       the probe file of `check_writable`

A commit writes and fsyncs every file under the temporary name, renames it
to `ckpt-S` and fsyncs the directory. An overwrite of an existing `ckpt-S`
first renames that one to the `.old-` name; the new one takes its place,
and only then is the old one deleted. A crash between the two renames leaves
no `ckpt-S` but two complete copies, and `remove_stale_temporaries`, which
every writer runs before it writes, promotes the new one (or, failing that,
the old one) back to `ckpt-S` after verifying it in full. A deletion first
renames the checkpoint to a `.trash-` name, so a half-deleted directory is
never taken for a checkpoint. Each step is one call in `durable`, where a
test can crash the process at any of them.

Retention is by trust, not by number: `prune` never removes the checkpoint
just committed, counts towards `keep` only checkpoints that pass a cheap
check (a sound manifest, every file of its stated size) and that this
process has not found corrupt on load, and never removes a checkpoint newer
than the one just committed. So it never leaves fewer good checkpoints than
min(keep, the good ones before the save).

Bit rot or truncation after the commit is caught on load: `load_latest`
skips such a checkpoint with a warning and falls back to the previous one.
"""

import collections
import dataclasses
import os
import re
import sys
import uuid
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np

from overlap_core.checkpoint import durable
from overlap_core.checkpoint import layout
# Re-exported: both framework sides import these from here.
from overlap_core.checkpoint.layout import (  # pylint: disable=unused-import
    FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, STATE_NAME, TENSOR_SUFFIX,
    CheckpointError, CheckpointMismatchError, CorruptCheckpointError,
    LoadedCheckpoint, read_manifest)

_CHECKPOINT_DIR = re.compile(r"^ckpt-(\d{10})$")
_PENDING = re.compile(r"^\.(tmp|old)-ckpt-(\d{10})-[0-9a-f]+$")
_TEMP_PREFIX = ".tmp-ckpt-"
_OLD_PREFIX = ".old-ckpt-"
_TRASH_PREFIX = ".trash-ckpt-"
DEFAULT_RESOLVE_HINT = ("give a different --model_dir, or overwrite them "
                        "explicitly (overwrite=True)")

# Checkpoints this process found corrupt on load (real path -> reason).
# A flipped byte passes retention's cheap check; this keeps such a
# checkpoint from counting as good until a new commit replaces it.
_known_corrupt: Dict[str, str] = {}


class CheckpointDirectoryInUseError(CheckpointError):
  """A run that does not restore found checkpoints where it would write."""


@dataclasses.dataclass(frozen=True)
class Recovery:
  """What `recover` did with what killed writers left behind."""
  promoted: List[str]  # complete copies renamed back to their ckpt-S
  removed: List[str]  # unfinished writes, leftover copies, trash


def checkpoint_dir_name(step: int) -> str:
  return f"ckpt-{step:010d}"


def _path(directory: str, step: int) -> str:
  return os.path.join(directory, checkpoint_dir_name(step))


def _side_name(prefix: str, step: int) -> str:
  return f"{prefix}{step:010d}-{uuid.uuid4().hex[:8]}"


def warn_to_stderr(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def check_writable(directory: str) -> None:
  """Creates `directory` and proves a file can be written and synced there.

  Raises:
    CheckpointError: naming the directory and the operating system's reason.
  """
  probe = os.path.join(directory, f"{_TEMP_PREFIX}probe-{uuid.uuid4().hex}")
  try:
    durable.makedirs(directory)
    with open(probe, "wb") as f:
      f.write(b"probe")
      f.flush()
      os.fsync(f.fileno())
    os.unlink(probe)
  except OSError as e:
    raise CheckpointError(f"cannot write checkpoints to {directory}: "
                          f"{e.strerror or e}") from e


def write_checkpoint(directory: str, step: int,
                     groups: Mapping[str, Mapping[str, np.ndarray]],
                     state: Mapping) -> str:
  """Writes and atomically commits (or overwrites) the checkpoint of `step`.

  Args:
    directory: the checkpoint directory (created if missing).
    step: the training step the arrays belong to.
    groups: group name -> (array name -> array).
    state: JSON-serializable state (step, epoch, data position, ...).

  Returns:
    The committed checkpoint's path.

  Raises:
    OSError: the write failed; nothing of it is left behind, and an
      existing checkpoint of `step` is still in place.
  """
  durable.makedirs(directory)
  temp = os.path.join(directory, _side_name(_TEMP_PREFIX, step))
  durable.mkdir(temp)
  try:
    layout.write_files(temp, step, groups, state)
    final = _path(directory, step)
    _commit(temp, final, step)
  except BaseException:
    durable.remove_tree(temp)
    raise
  _known_corrupt.pop(os.path.realpath(final), None)
  return final


def _commit(temp: str, final: str, step: int) -> None:
  """Puts the complete `temp` at `final`, keeping any old one until then."""
  if not os.path.lexists(final):
    durable.rename(temp, final)
    return
  # A directory cannot be renamed over a non-empty one. The old one moves
  # to a name recovery knows, and is deleted only once the new one is in.
  old = os.path.join(os.path.dirname(final), _side_name(_OLD_PREFIX, step))
  durable.rename(final, old)
  try:
    durable.rename(temp, final)
  except BaseException:
    if not os.path.lexists(final):
      durable.rename(old, final)
    raise
  durable.remove_tree(old)


def list_checkpoints(directory: str) -> List[int]:
  """Steps of the committed checkpoints in `directory`, oldest first."""
  if not os.path.isdir(directory):
    return []
  steps = []
  for name in os.listdir(directory):
    match = _CHECKPOINT_DIR.match(name)
    if match and os.path.exists(os.path.join(directory, name,
                                             layout.MANIFEST_NAME)):
      steps.append(int(match.group(1)))
  return sorted(steps)


def _step_of(path: str) -> Optional[int]:
  match = _CHECKPOINT_DIR.match(os.path.basename(os.path.normpath(path)))
  return int(match.group(1)) if match else None


def load_checkpoint(path: str) -> LoadedCheckpoint:
  """Reads one checkpoint directory, verifying everything in it.

  Raises:
    CorruptCheckpointError: a file is missing, truncated, altered or
      malformed, or the steps of name, manifest and state disagree.
  """
  try:
    return layout.read_checkpoint(path, expected_step=_step_of(path))
  except CorruptCheckpointError as e:
    _known_corrupt[os.path.realpath(path)] = str(e)
    raise
  except (KeyError, TypeError, ValueError) as e:
    # The reader checks each field before use; this net keeps any case it
    # missed a fallback, not a crash of the restore.
    _known_corrupt[os.path.realpath(path)] = str(e)
    raise CorruptCheckpointError(f"{path}: malformed: {e!r}") from e


def verifies(path: str) -> bool:
  """Whether the checkpoint at `path` loads and verifies in full."""
  if not os.path.isdir(path):
    return False
  try:
    load_checkpoint(path)
  except CorruptCheckpointError:
    return False
  return True


def load_latest(directory: str, *,
                warn: Callable[[str], None] = warn_to_stderr
                ) -> Optional[LoadedCheckpoint]:
  """The newest checkpoint that verifies, or None if there is none.

  A checkpoint that fails verification is skipped with a warning, and the
  one before it is tried: losing the newest checkpoint costs its steps,
  never the run.

  Raises:
    CheckpointError: checkpoints exist but none of them verifies.
  """
  failures = []
  for step in reversed(list_checkpoints(directory)):
    try:
      return load_checkpoint(_path(directory, step))
    except CorruptCheckpointError as e:
      failures.append(str(e))
      warn(f"warning: skipping corrupt checkpoint: {e}")
  if failures:
    raise CheckpointError(f"no checkpoint in {directory} verifies: "
                          + "; ".join(failures))
  return None


def _counts_as_good(directory: str, step: int) -> bool:
  path = _path(directory, step)
  return (os.path.realpath(path) not in _known_corrupt
          and layout.looks_complete(path, expected_step=step))


def prune(directory: str, keep: int, *,
          protect: Optional[int] = None) -> List[int]:
  """Deletes checkpoints beyond the newest `keep` good ones; their steps.

  Args:
    directory: the checkpoint directory.
    keep: how many good checkpoints to keep (< 1: delete nothing).
    protect: the step just committed: never deleted, and nothing newer is.

  Returns:
    The deleted steps. Nothing is deleted when no checkpoint is good.
  """
  steps = list_checkpoints(directory)
  if keep < 1 or not steps:
    return []
  kept = [protect] if protect in steps else []
  for step in reversed(steps):
    if len(kept) >= keep:
      break
    if step not in kept and _counts_as_good(directory, step):
      kept.append(step)
  if not kept:
    return []
  # What is newer than the commit is not judged here: it may be good on a
  # check this cheap one cannot make.
  limit = protect if protect is not None else max(kept)
  doomed = [step for step in steps if step not in kept and step < limit]
  for step in doomed:
    _remove_checkpoint(directory, step)
  return doomed


def _remove_checkpoint(directory: str, step: int) -> None:
  # Renamed away first: a half-deleted directory must not look committed.
  path = _path(directory, step)
  trash = os.path.join(directory, _side_name(_TRASH_PREFIX, step))
  durable.rename(path, trash)
  _known_corrupt.pop(os.path.realpath(path), None)
  durable.remove_tree(trash)


def recover(directory: str) -> Recovery:
  """Finishes or undoes what killed writers left; call before writing starts.

  Where a `ckpt-S` is missing but a complete copy of it is left (the new
  one of an interrupted overwrite, or a write killed just before its
  rename), the copy that verifies is promoted to `ckpt-S`, the newer write
  first. Everything else left over is deleted.
  """
  if not os.path.isdir(directory):
    return Recovery([], [])
  promoted, removed = [], []
  pending = collections.defaultdict(list)  # step -> [(kind, name)]
  for name in sorted(os.listdir(directory)):
    match = _PENDING.match(name)
    if match:
      pending[int(match.group(2))].append((match.group(1), name))
    elif name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)):
      durable.remove_tree(os.path.join(directory, name))
      removed.append(name)
  for step, entries in sorted(pending.items()):
    final = _path(directory, step)
    # A finished new write is newer than the old copy it was to replace.
    entries.sort(key=lambda entry: entry[0] != "tmp")
    for _, name in entries:
      source = os.path.join(directory, name)
      if not os.path.lexists(final) and _copy_verifies(source, step):
        durable.rename(source, final)
        promoted.append(name)
      else:
        durable.remove_tree(source)
        removed.append(name)
  return Recovery(promoted, removed)


def _copy_verifies(path: str, step: int) -> bool:
  try:
    layout.read_checkpoint(path, expected_step=step)
  except CorruptCheckpointError:
    return False
  return True


def remove_stale_temporaries(directory: str) -> List[str]:
  """`recover`, returning the names it deleted (kept for older callers)."""
  return recover(directory).removed


def refuse_existing_checkpoints(directory: str, *,
                                resolve: str = DEFAULT_RESOLVE_HINT) -> None:
  """Refuses a run that would not restore the checkpoints in `directory`.

  Its saves would mix with another run's checkpoints, and a later restore
  would silently resume whichever is newest.

  Raises:
    CheckpointDirectoryInUseError: one line naming the directory and
      `resolve`, what the user can do about it.
  """
  steps = list_checkpoints(directory)
  if steps:
    raise CheckpointDirectoryInUseError(
        f"{directory} already holds checkpoints (steps {steps[0]}.."
        f"{steps[-1]}) and this run does not restore them: {resolve}")


def prepare_directory(directory: str, *, restoring: bool = True,
                      overwrite: bool = False,
                      resolve: str = DEFAULT_RESOLVE_HINT,
                      log: Callable[[str], None] = warn_to_stderr) -> None:
  """Readies `directory` for a writer: writable, recovered, and, for a run
  that does not restore, free of another run's checkpoints.

  Args:
    directory: the checkpoint directory (created if missing).
    restoring: whether the run restores from it.
    overwrite: for a run that does not restore, delete the checkpoints there
      instead of refusing to start.
    resolve: what the refusal tells the user to do.
    log: where what was recovered or removed is reported.

  Raises:
    CheckpointError: not writable, or recovery failed.
    CheckpointDirectoryInUseError: see `refuse_existing_checkpoints`.
  """
  check_writable(directory)
  try:
    recovery = recover(directory)
  except OSError as e:
    raise CheckpointError(f"cannot recover the checkpoints in {directory}: "
                          f"{e}") from e
  if recovery.promoted:
    log(f"completed {len(recovery.promoted)} checkpoint commit(s) a killed "
        f"writer left in {directory}")
  if recovery.removed:
    log(f"removed {len(recovery.removed)} unfinished checkpoint write(s) "
        f"left in {directory}")
  if restoring:
    return
  if not overwrite:
    refuse_existing_checkpoints(directory, resolve=resolve)
    return
  removed = remove_checkpoints(directory)
  if removed:
    log(f"overwrite: removed the {len(removed)} checkpoint(s) of an earlier "
        f"run from {directory}")


def remove_checkpoints(directory: str) -> List[int]:
  """Deletes every committed checkpoint (an explicit overwrite); the steps."""
  steps = list_checkpoints(directory)
  for step in steps:
    _remove_checkpoint(directory, step)
  return steps
