"""A checkpoint is used only as verified: every malformed file falls back.

Each damaged checkpoint below is re-signed where the damage would otherwise
be caught by a checksum (the file's entry in the manifest, and the
manifest's own checksum, are recomputed), so what is tested is the check
named, not the checksum in front of it.
"""

import builtins
import hashlib
import json
import os
import struct
import zlib

import numpy as np
import pytest

from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint import tensor_file
from overlap_core.checkpoint.files import CorruptCheckpointError

MANIFEST = checkpoint_files.MANIFEST_NAME
STATE = checkpoint_files.STATE_NAME
MODEL = "model.safetensors"


def _arrays(step: int) -> dict:
  return {"layer/kernel": np.full((16, 8), step, np.float32),
          "layer/bias": np.arange(8, dtype=np.float64) + step}


def _write(directory, step):
  return checkpoint_files.write_checkpoint(
      str(directory), step, {"model": _arrays(step), "optimizer": {}},
      {"step": step, "epoch": 0})


def _read_json(path):
  with open(path, "rb") as f:
    return json.loads(f.read())


# The checksums of each manifest version, computed here without the
# library: crc32 (version 3) and sha256 (versions 1 and 2).
CHECKSUMS = {"crc32": lambda data: f"{zlib.crc32(data):08x}",
             "sha256": lambda data: hashlib.sha256(data).hexdigest()}


def _sign(checkpoint: str, manifest: dict, algorithm: str = "crc32") -> None:
  """Writes `manifest` with a correct manifest_<algorithm> of its body."""
  key = "manifest_" + algorithm
  body = {k: v for k, v in manifest.items() if not k.startswith("manifest_")}
  canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
  manifest = dict(body, **{key: CHECKSUMS[algorithm](canonical.encode())})
  with open(os.path.join(checkpoint, MANIFEST), "w", encoding="utf-8") as f:
    json.dump(manifest, f)


def _replace_signed(checkpoint: str, name: str, data: bytes) -> None:
  """Replaces file `name` and re-signs the manifest to match it."""
  with open(os.path.join(checkpoint, name), "wb") as f:
    f.write(data)
  manifest = _read_json(os.path.join(checkpoint, MANIFEST))
  manifest["files"][name] = {"crc32": CHECKSUMS["crc32"](data),
                             "bytes": len(data)}
  _sign(checkpoint, manifest)


def _rewrite_as_sha256_version(checkpoint: str, version: int) -> None:
  """Turns a new checkpoint's manifest into one that version wrote."""
  manifest = _read_json(os.path.join(checkpoint, MANIFEST))
  del manifest["checksum"]
  manifest["version"] = version
  for name, entry in manifest["files"].items():
    with open(os.path.join(checkpoint, name), "rb") as f:
      manifest["files"][name] = {"sha256": CHECKSUMS["sha256"](f.read()),
                                 "bytes": entry["bytes"]}
  _sign(checkpoint, manifest, "sha256")


def _edit_header(checkpoint: str, edit) -> None:
  """Rewrites model.safetensors with `edit(header)` as its header."""
  with open(os.path.join(checkpoint, MODEL), "rb") as f:
    blob = f.read()
  (length,) = struct.unpack("<Q", blob[:8])
  header = json.loads(blob[8:8 + length])
  header_bytes = edit(header)
  if not isinstance(header_bytes, bytes):
    header_bytes = json.dumps(header_bytes).encode()
  header_bytes += b" " * (-len(header_bytes) % 8)
  _replace_signed(checkpoint, MODEL, struct.pack("<Q", len(header_bytes))
                  + header_bytes + blob[8 + length:])


def _entry(header):
  return header["layer/kernel"]


def _manifest_edit(edit):
  def damage(checkpoint):
    manifest = _read_json(os.path.join(checkpoint, MANIFEST))
    edit(manifest)
    _sign(checkpoint, manifest)
  return damage


def _truncated_manifest(checkpoint):
  with open(os.path.join(checkpoint, MANIFEST), "wb") as f:
    f.write(b'{"format": "tfoverlap-')


def _unsigned_manifest_edit(checkpoint):
  manifest = _read_json(os.path.join(checkpoint, MANIFEST))
  manifest["files"][STATE]["bytes"] += 1  # and its checksum not updated
  with open(os.path.join(checkpoint, MANIFEST), "w", encoding="utf-8") as f:
    json.dump(manifest, f)


DAMAGES = {
    "manifest_not_json": (_truncated_manifest, "unreadable manifest"),
    "manifest_edited_unsigned": (_unsigned_manifest_edit,
                                 "manifest: checksum mismatch"),
    "manifest_missing_files": (_manifest_edit(lambda m: m.pop("files")),
                               "files does not list"),
    "manifest_file_entry_wrong_type": (
        _manifest_edit(lambda m: m["files"].update(
            {MODEL: {"crc32": 5, "bytes": "many"}})), "is not {crc32"),
    "manifest_unknown_checksum": (
        _manifest_edit(lambda m: m.update(checksum="md5")),
        "checksum 'md5'; this reader knows crc32, sha256"),
    "manifest_group_without_file": (
        _manifest_edit(lambda m: m["files"].pop(MODEL)), "has no file entry"),
    "manifest_step_not_the_name": (
        _manifest_edit(lambda m: m.update(step=21)),
        "manifest says step 21, the directory step 20"),
    "manifest_step_wrong_type": (_manifest_edit(lambda m: m.update(step="20")),
                                 "is not a step"),
    "manifest_newer_version": (_manifest_edit(lambda m: m.update(version=4)),
                               "version 4; this reader knows 1..3"),
    "state_step_differs": (
        lambda c: _replace_signed(c, STATE, b'{"step": 19, "epoch": 0}'),
        "state.json says step 19"),
    "state_not_json": (lambda c: _replace_signed(c, STATE, b'{"step": '),
                       "unreadable state.json"),
    "state_not_an_object": (lambda c: _replace_signed(c, STATE, b"[20]"),
                            "is not an object"),
    "header_not_json": (lambda c: _edit_header(c, lambda h: b"\xff{oops"),
                        "unreadable header"),
    "header_entry_missing_offsets": (
        lambda c: _edit_header(c, lambda h: (_entry(h).pop("data_offsets"),
                                             h)[1]),
        "data_offsets None is not"),
    "header_shape_wrong_type": (
        lambda c: _edit_header(c, lambda h: (_entry(h).update(shape="16x8"),
                                             h)[1]),
        "is not a list of sizes"),
    "header_unknown_dtype": (
        lambda c: _edit_header(c, lambda h: (_entry(h).update(dtype="F99"),
                                             h)[1]),
        "unknown dtype"),
    "header_shape_not_the_bytes": (
        lambda c: _edit_header(c, lambda h: (_entry(h).update(shape=[16, 9]),
                                             h)[1]),
        "do not hold shape"),
    "header_not_an_object": (lambda c: _edit_header(c, lambda h: [1, 2]),
                             "not a JSON object"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_any_malformed_file_falls_back_to_the_previous_checkpoint(
    tmp_path, damage):
  _write(tmp_path, 10)
  newest = _write(tmp_path, 20)
  apply, reason = DAMAGES[damage]
  apply(newest)
  warnings = []
  loaded = checkpoint_files.load_latest(str(tmp_path), warn=warnings.append)
  assert loaded.step == 10
  assert len(warnings) == 1, warnings
  assert "ckpt-0000000020" in warnings[0] and reason in warnings[0]
  with pytest.raises(CorruptCheckpointError, match="ckpt-0000000020"):
    checkpoint_files.load_checkpoint(newest)


def test_the_manifest_names_crc32_and_checksums_every_file_with_it(tmp_path):
  newest = _write(tmp_path, 10)
  manifest = _read_json(os.path.join(newest, MANIFEST))
  assert manifest["version"] == 3 and manifest["checksum"] == "crc32"
  for name, entry in manifest["files"].items():
    with open(os.path.join(newest, name), "rb") as f:
      assert entry["crc32"] == CHECKSUMS["crc32"](f.read())
  body = {k: v for k, v in manifest.items() if k != "manifest_crc32"}
  assert manifest["manifest_crc32"] == CHECKSUMS["crc32"](json.dumps(
      body, sort_keys=True, separators=(",", ":")).encode())


def test_a_sha256_version_2_checkpoint_still_loads_and_is_checked(tmp_path):
  newest = _write(tmp_path, 10)
  _rewrite_as_sha256_version(newest, 2)
  loaded = checkpoint_files.load_latest(
      str(tmp_path), warn=lambda m: pytest.fail(m))
  assert loaded.step == 10
  with open(os.path.join(newest, MODEL), "r+b") as f:
    f.seek(-1, os.SEEK_END)
    f.write(b"\x01")
  with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
    checkpoint_files.load_checkpoint(newest)
  manifest = _read_json(os.path.join(newest, MANIFEST))
  manifest["step"] = 11  # and the manifest_sha256 not updated
  with open(os.path.join(newest, MANIFEST), "w", encoding="utf-8") as f:
    json.dump(manifest, f)
  with pytest.raises(CorruptCheckpointError, match="manifest: checksum"):
    checkpoint_files.load_checkpoint(newest)


def test_a_checkpoint_without_a_manifest_checksum_still_loads(tmp_path):
  # Version 1, written before the manifest carried its own checksum: its
  # files are checked all the same, so it is loaded, not refused.
  newest = _write(tmp_path, 10)
  _rewrite_as_sha256_version(newest, 1)
  manifest = _read_json(os.path.join(newest, MANIFEST))
  del manifest["manifest_sha256"]
  with open(os.path.join(newest, MANIFEST), "w", encoding="utf-8") as f:
    json.dump(manifest, f)
  loaded = checkpoint_files.load_latest(
      str(tmp_path), warn=lambda m: pytest.fail(m))
  assert loaded.step == 10
  np.testing.assert_array_equal(loaded.groups["model"]["layer/bias"],
                                _arrays(10)["layer/bias"])
  # ... and its files are still checked.
  with open(os.path.join(newest, MODEL), "r+b") as f:
    f.seek(-1, os.SEEK_END)
    f.write(b"\x01")
  with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
    checkpoint_files.load_checkpoint(newest)


def test_the_bytes_checksummed_are_the_bytes_used(tmp_path, monkeypatch):
  # The model file changes after its first read (bit rot, or another writer
  # between two reads): a loader that checks one read and parses a second
  # one would return the second's arrays, unchecked.
  newest = _write(tmp_path, 20)
  model = os.path.join(newest, MODEL)
  swapped = str(tmp_path / "swapped.safetensors")
  tensor_file.write_tensor_file(swapped, _arrays(99),
                                metadata={"group": "model"})
  assert os.path.getsize(swapped) == os.path.getsize(model)
  opens = []
  real_open = builtins.open

  def open_that_changes(file, *args, **kwargs):
    if file == model:
      opens.append(file)
      if len(opens) > 1:
        file = swapped
    return real_open(file, *args, **kwargs)

  monkeypatch.setattr(builtins, "open", open_that_changes)
  loaded = checkpoint_files.load_checkpoint(newest)
  monkeypatch.undo()
  assert len(opens) == 1
  np.testing.assert_array_equal(loaded.groups["model"]["layer/kernel"],
                                _arrays(20)["layer/kernel"])
