"""The on-disk checkpoint: atomic commits, checksums, retention, fallback.

A checkpoint of step S is one directory, `ckpt-<S, 10 digits>/`:

  <group>.safetensors   one per group of arrays ("model", "optimizer", ...)
  state.json            step, epoch, data position and the like
  MANIFEST.json         written last: step, and each file's size and SHA-256

It is written under a temporary name, every file is fsynced, then the
directory is renamed into place and its parent fsynced. A directory named
`ckpt-*` is therefore complete or absent, whatever moment the writer is
killed at; what a kill can leave behind is a `.tmp-*` directory, which
`remove_stale_temporaries` deletes. Bit rot or truncation after the commit
is caught by the checksums: `load_latest` skips such a checkpoint, with a
warning, and falls back to the previous one.

Retention keeps the newest K complete checkpoints; pruning runs only after a
commit, so the last complete checkpoint is never removed before a newer one
is complete.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import uuid
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np

from overlap_core.checkpoint import tensor_file

MANIFEST_NAME = "MANIFEST.json"
STATE_NAME = "state.json"
TENSOR_SUFFIX = ".safetensors"
FORMAT_NAME = "tfoverlap-checkpoint"
FORMAT_VERSION = 1
_CHECKPOINT_DIR = re.compile(r"^ckpt-(\d{10})$")
_TEMP_PREFIX = ".tmp-ckpt-"
_TRASH_PREFIX = ".trash-ckpt-"


class CheckpointError(RuntimeError):
  """A checkpoint could not be written, or none could be read."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint whose files do not match its manifest."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint whose variables do not fit the model being restored."""


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
  step: int
  path: str
  groups: Dict[str, Dict[str, np.ndarray]]  # group -> name -> array
  state: dict


def checkpoint_dir_name(step: int) -> str:
  return f"ckpt-{step:010d}"


def _fsync_dir(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _write_json(path: str, payload) -> tuple:
  data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
  with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  return hashlib.sha256(data).hexdigest(), len(data)


def check_writable(directory: str) -> None:
  """Creates `directory` and proves a file can be written and synced there.

  Raises:
    CheckpointError: naming the directory and the operating system's reason.
  """
  probe = os.path.join(directory, f"{_TEMP_PREFIX}probe-{uuid.uuid4().hex}")
  try:
    os.makedirs(directory, exist_ok=True)
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
  """Writes and atomically commits the checkpoint of `step`.

  Args:
    directory: the checkpoint directory (created if missing).
    step: the training step the arrays belong to.
    groups: group name -> (array name -> array).
    state: JSON-serializable state (step, epoch, data position, ...).

  Returns:
    The committed checkpoint's path.

  Raises:
    OSError: the write failed; nothing of it is left behind.
  """
  os.makedirs(directory, exist_ok=True)
  final = os.path.join(directory, checkpoint_dir_name(step))
  temp = os.path.join(directory,
                      f"{_TEMP_PREFIX}{step:010d}-{uuid.uuid4().hex[:8]}")
  os.mkdir(temp)
  try:
    files = {}
    for group, arrays in groups.items():
      name = group + TENSOR_SUFFIX
      digest, size = tensor_file.write_tensor_file(
          os.path.join(temp, name), arrays, metadata={"group": group})
      files[name] = {"sha256": digest, "bytes": size}
    digest, size = _write_json(os.path.join(temp, STATE_NAME), dict(state))
    files[STATE_NAME] = {"sha256": digest, "bytes": size}
    _write_json(os.path.join(temp, MANIFEST_NAME), {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "step": step,
        "groups": sorted(groups), "files": files})
    _fsync_dir(temp)
    _replace_dir(temp, final)
  except BaseException:
    shutil.rmtree(temp, ignore_errors=True)
    raise
  _fsync_dir(directory)
  return final


def _replace_dir(source: str, target: str) -> None:
  """Renames `source` to `target`, moving an existing `target` aside first.

  A directory cannot be renamed over a non-empty one; the old one is moved
  to a trash name (not a `ckpt-*` name, so never loaded) and deleted after.
  """
  if not os.path.exists(target):
    os.rename(source, target)
    return
  trash = os.path.join(os.path.dirname(target),
                       _TRASH_PREFIX + uuid.uuid4().hex[:8])
  os.rename(target, trash)
  os.rename(source, target)
  shutil.rmtree(trash, ignore_errors=True)


def list_checkpoints(directory: str) -> List[int]:
  """Steps of the committed checkpoints in `directory`, oldest first."""
  if not os.path.isdir(directory):
    return []
  steps = []
  for name in os.listdir(directory):
    match = _CHECKPOINT_DIR.match(name)
    if match and os.path.exists(os.path.join(directory, name, MANIFEST_NAME)):
      steps.append(int(match.group(1)))
  return sorted(steps)


def read_manifest(path: str) -> dict:
  try:
    with open(os.path.join(path, MANIFEST_NAME), encoding="utf-8") as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise CorruptCheckpointError(f"{path}: unreadable manifest: {e}") from e
  if manifest.get("format") != FORMAT_NAME:
    raise CorruptCheckpointError(f"{path}: not a {FORMAT_NAME} manifest")
  return manifest


def _verified_bytes(path: str, name: str, expected: dict) -> bytes:
  file_path = os.path.join(path, name)
  try:
    with open(file_path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise CorruptCheckpointError(f"{file_path}: {e.strerror or e}") from e
  if len(data) != expected["bytes"]:
    raise CorruptCheckpointError(
        f"{file_path}: {len(data)} bytes, the manifest says "
        f"{expected['bytes']} (truncated?)")
  if hashlib.sha256(data).hexdigest() != expected["sha256"]:
    raise CorruptCheckpointError(f"{file_path}: checksum mismatch")
  return data


def load_checkpoint(path: str) -> LoadedCheckpoint:
  """Reads one checkpoint directory, verifying every checksum.

  Raises:
    CorruptCheckpointError: a file is missing, truncated or altered.
  """
  manifest = read_manifest(path)
  groups = {}
  for group in manifest["groups"]:
    name = group + TENSOR_SUFFIX
    _verified_bytes(path, name, manifest["files"].get(name, {"bytes": -1,
                                                             "sha256": ""}))
    try:
      groups[group], _ = tensor_file.read_tensor_file(
          os.path.join(path, name))
    except tensor_file.TensorFileError as e:
      raise CorruptCheckpointError(str(e)) from e
  state = json.loads(_verified_bytes(path, STATE_NAME,
                                     manifest["files"][STATE_NAME]))
  return LoadedCheckpoint(step=int(manifest["step"]), path=path,
                          groups=groups, state=state)


def warn_to_stderr(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


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
  steps = list_checkpoints(directory)
  failures = []
  for step in reversed(steps):
    path = os.path.join(directory, checkpoint_dir_name(step))
    try:
      loaded = load_checkpoint(path)
    except CorruptCheckpointError as e:
      failures.append(str(e))
      warn(f"warning: skipping corrupt checkpoint: {e}")
      continue
    return loaded
  if failures:
    raise CheckpointError(f"no checkpoint in {directory} verifies: "
                          + "; ".join(failures))
  return None


def prune(directory: str, keep: int) -> List[int]:
  """Deletes all but the newest `keep` committed checkpoints; their steps."""
  steps = list_checkpoints(directory)
  doomed = steps[:-keep] if keep > 0 else []
  for step in doomed:
    # Renamed away first: a half-deleted directory must not look committed.
    path = os.path.join(directory, checkpoint_dir_name(step))
    trash = os.path.join(directory, _TRASH_PREFIX + uuid.uuid4().hex[:8])
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
  return doomed


def remove_stale_temporaries(directory: str) -> List[str]:
  """Deletes what killed writers left behind; call before writing starts."""
  if not os.path.isdir(directory):
    return []
  removed = []
  for name in os.listdir(directory):
    if name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)):
      path = os.path.join(directory, name)
      if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        os.unlink(path)
      removed.append(name)
  return removed
