"""One checkpoint directory's files: written with checksums, read verified.

  <group>.safetensors   one per group of arrays ("model", "optimizer", ...)
  state.json            step, epoch, data position and the like
  MANIFEST.json         written last: format, version, checksum algorithm,
                        step, each file's size and checksum, and
                        `manifest_<algorithm>`, the checksum of the
                        manifest's own canonical JSON without that key

A reader trusts nothing it has not checked: each file is read once, its
size and checksum are compared with the manifest, and it is parsed from the
very bytes that were checked. The manifest's step must agree with the
directory's name and with state.json's step. Whatever is wrong (a flipped
byte, a truncated file, malformed JSON, a bad safetensors header, a key
missing or of the wrong type) is one CorruptCheckpointError, so the caller
can fall back to an older checkpoint.

Version 3 names its algorithm (CRC-32, see `checksum`). Versions 1 and 2
used SHA-256 and still load. Version 1 manifests, written before the
manifest carried its own checksum, have their files checksummed all the
same, and a damaged v1 manifest fails its structure checks or its files'
checksums.
"""

import dataclasses
import json
import os
from typing import Dict, Mapping, Optional

import numpy as np

from overlap_core.checkpoint import checksum
from overlap_core.checkpoint import durable
from overlap_core.checkpoint import tensor_file

MANIFEST_NAME = "MANIFEST.json"
STATE_NAME = "state.json"
TENSOR_SUFFIX = ".safetensors"
FORMAT_NAME = "tfoverlap-checkpoint"
FORMAT_VERSION = 3
# Versions before 3 do not name their algorithm; they all used this one.
_UNNAMED_CHECKSUM = "sha256"


class CheckpointError(RuntimeError):
  """A checkpoint could not be written, or none could be read."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint whose files are damaged, malformed or inconsistent."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint whose variables do not fit the model being restored."""


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
  step: int
  path: str
  groups: Dict[str, Dict[str, np.ndarray]]  # group -> name -> array
  state: dict


def _self_digest_key(algorithm: str) -> str:
  return "manifest_" + algorithm


def _canonical_digest(body: Mapping, algorithm: str) -> str:
  return checksum.of_bytes(json.dumps(
      body, sort_keys=True, separators=(",", ":")).encode(), algorithm)


def _write_bytes(path: str, data: bytes) -> tuple:
  durable.reach("write", path)
  with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  return checksum.of_bytes(data), len(data)


def _json_bytes(payload) -> bytes:
  return (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()


def write_files(directory: str, step: int,
                groups: Mapping[str, Mapping[str, np.ndarray]],
                state: Mapping) -> None:
  """Writes and fsyncs a checkpoint's files into the existing `directory`.

  Raises:
    ValueError: `state` says another step.
    OSError, tensor_file.TensorFileError: the write failed.
  """
  if "step" in state and state["step"] != step:
    raise ValueError(f"state step {state['step']!r} is not the checkpoint's "
                     f"step {step}")
  files = {}
  for group, arrays in groups.items():
    name = group + TENSOR_SUFFIX
    path = os.path.join(directory, name)
    durable.reach("write", path)
    digest, size = tensor_file.write_tensor_file(path, arrays,
                                                 metadata={"group": group})
    files[name] = {checksum.WRITTEN: digest, "bytes": size}
  digest, size = _write_bytes(os.path.join(directory, STATE_NAME),
                              _json_bytes(dict(state)))
  files[STATE_NAME] = {checksum.WRITTEN: digest, "bytes": size}
  body = {"format": FORMAT_NAME, "version": FORMAT_VERSION,
          "checksum": checksum.WRITTEN, "step": step,
          "groups": sorted(groups), "files": files}
  manifest = dict(body, **{_self_digest_key(checksum.WRITTEN):
                           _canonical_digest(body, checksum.WRITTEN)})
  # Last: a directory with a manifest has all of its files.
  _write_bytes(os.path.join(directory, MANIFEST_NAME), _json_bytes(manifest))
  durable.fsync_dir(directory)


def read_manifest(path: str) -> dict:
  """The checked manifest of checkpoint directory `path`.

  Raises:
    CorruptCheckpointError: unreadable, malformed, or its checksum differs.
  """
  try:
    with open(os.path.join(path, MANIFEST_NAME), "rb") as f:
      manifest = json.loads(f.read())
  except (OSError, ValueError) as e:
    raise CorruptCheckpointError(f"{path}: unreadable manifest: {e}") from e
  _check_manifest(path, manifest)
  return manifest


def _check_manifest(path: str, manifest) -> None:
  def bad(what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{path}: manifest: {what}")

  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
    raise bad(f"not a {FORMAT_NAME} manifest")
  version = manifest.get("version")
  if not _is_int(version) or not 1 <= version <= FORMAT_VERSION:
    raise bad(f"version {version!r}; this reader knows 1..{FORMAT_VERSION}")
  algorithm = checksum_algorithm(manifest)
  if algorithm not in checksum.KNOWN:
    raise bad(f"checksum {algorithm!r}; this reader knows "
              f"{', '.join(checksum.KNOWN)}")
  self_key = _self_digest_key(algorithm)
  if self_key in manifest or version >= 2:
    body = {k: v for k, v in manifest.items() if k != self_key}
    if manifest.get(self_key) != _canonical_digest(body, algorithm):
      raise bad("checksum mismatch")
  if not _is_int(manifest.get("step")) or manifest["step"] < 0:
    raise bad(f"step {manifest.get('step')!r} is not a step")
  groups, files = manifest.get("groups"), manifest.get("files")
  if not (isinstance(groups, list)
          and all(isinstance(g, str) for g in groups)):
    raise bad("groups is not a list of names")
  if not isinstance(files, dict) or STATE_NAME not in files:
    raise bad(f"files does not list {STATE_NAME}")
  for name, entry in files.items():
    if not (isinstance(entry, dict) and isinstance(entry.get(algorithm), str)
            and _is_int(entry.get("bytes"))):
      raise bad(f"entry of {name!r} is not {{{algorithm}, bytes}}")
  for group in groups:
    if group + TENSOR_SUFFIX not in files:
      raise bad(f"group {group!r} has no file entry")


def checksum_algorithm(manifest: Mapping) -> str:
  """The algorithm a manifest's checksums were computed with."""
  version = manifest.get("version")
  if _is_int(version) and version >= 3:
    return manifest.get("checksum")
  return _UNNAMED_CHECKSUM


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _verified_bytes(path: str, name: str, expected: dict,
                    algorithm: str) -> bytes:
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
  if checksum.of_bytes(data, algorithm) != expected[algorithm]:
    raise CorruptCheckpointError(f"{file_path}: checksum mismatch")
  return data


def _check_step(path: str, manifest_step: int,
                expected_step: Optional[int]) -> None:
  if expected_step is not None and manifest_step != expected_step:
    raise CorruptCheckpointError(
        f"{path}: the manifest says step {manifest_step}, the directory "
        f"step {expected_step}")


def read_checkpoint(path: str, *,
                    expected_step: Optional[int] = None) -> LoadedCheckpoint:
  """Reads and verifies one checkpoint directory.

  Args:
    path: the directory.
    expected_step: the step its name says; the manifest must agree.

  Raises:
    CorruptCheckpointError: anything missing, damaged or inconsistent.
  """
  manifest = read_manifest(path)
  step = manifest["step"]
  _check_step(path, step, expected_step)
  algorithm = checksum_algorithm(manifest)
  groups = {}
  for group in manifest["groups"]:
    name = group + TENSOR_SUFFIX
    data = _verified_bytes(path, name, manifest["files"][name], algorithm)
    try:
      groups[group], _ = tensor_file.parse_tensor_bytes(
          data, source=os.path.join(path, name))
    except tensor_file.TensorFileError as e:
      raise CorruptCheckpointError(str(e)) from e
  try:
    state = json.loads(_verified_bytes(path, STATE_NAME,
                                       manifest["files"][STATE_NAME],
                                       algorithm))
  except ValueError as e:
    raise CorruptCheckpointError(f"{path}: unreadable {STATE_NAME}: {e}") from e
  if not isinstance(state, dict):
    raise CorruptCheckpointError(f"{path}: {STATE_NAME} is not an object")
  if "step" in state and state["step"] != step:
    raise CorruptCheckpointError(
        f"{path}: {STATE_NAME} says step {state['step']!r}, the manifest "
        f"step {step}")
  return LoadedCheckpoint(step=step, path=path, groups=groups, state=state)


def looks_complete(path: str, *, expected_step: Optional[int] = None) -> bool:
  """A cheap check: a sound manifest, and every file of its stated size.

  Reads the manifest only, not the tensors: retention calls it on every
  checkpoint after every save. Damage inside a file is found by
  `read_checkpoint`.
  """
  try:
    manifest = read_manifest(path)
    _check_step(path, manifest["step"], expected_step)
  except CorruptCheckpointError:
    return False
  for name, entry in manifest["files"].items():
    try:
      if os.path.getsize(os.path.join(path, name)) != entry["bytes"]:
        return False
    except OSError:
      return False
  return True
