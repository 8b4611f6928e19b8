"""Retention by trust, a directory that is not ours, and a final save that
never moves a finished run backwards."""

import json
import os

import numpy as np
import pytest

from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint.files import CheckpointDirectoryInUseError

from tests.helpers import checkpoint_config


def _arrays(step: int, version: int = 0) -> dict:
  return {"w": np.full((16, 8), 10 * step + version, np.float32)}


def _save(directory, step, *, keep, version=0):
  checkpoint_engine.write_snapshot(
      str(directory),
      checkpoint_engine.Snapshot(step, {"model": _arrays(step, version)},
                                 {"step": step, "version": version}),
      to_host=lambda value: value, keep=keep)


def _path(directory, step):
  return os.path.join(str(directory), checkpoint_files.checkpoint_dir_name(step))


def _flip_a_byte(directory, step):
  with open(os.path.join(_path(directory, step), "model.safetensors"),
            "r+b") as f:
    f.seek(-5, os.SEEK_END)
    byte = f.read(1)
    f.seek(-5, os.SEEK_END)
    f.write(bytes([byte[0] ^ 0x0F]))


def _good(directory):
  return [step for step in checkpoint_files.list_checkpoints(str(directory))
          if checkpoint_files.verifies(_path(directory, step))]


@pytest.fixture(autouse=True)
def _a_new_process_knows_no_corrupt_checkpoint():
  checkpoint_files._known_corrupt.clear()  # pylint: disable=protected-access


# --- retention -----------------------------------------------------------------


def test_keep1_after_falling_back_past_a_corrupt_newest_keeps_the_new_save(
    tmp_path):
  for step in (10, 30):
    _save(tmp_path, step, keep=5)
  _flip_a_byte(tmp_path, 30)
  warnings = []
  assert checkpoint_files.load_latest(str(tmp_path),
                                      warn=warnings.append).step == 10
  _save(tmp_path, 20, keep=1)  # the first save after the fallback
  assert _good(tmp_path) == [20]
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [20, 30]
  # The next restart falls back past 30 again, to the new save.
  assert checkpoint_files.load_latest(str(tmp_path),
                                      warn=warnings.append).step == 20


def test_only_checkpoints_that_look_complete_count_towards_keep(tmp_path):
  for step in (10, 20, 30):
    _save(tmp_path, step, keep=5)
  with open(os.path.join(_path(tmp_path, 30), "model.safetensors"),
            "r+b") as f:
    f.truncate(100)  # caught by the cheap check: the size is wrong
  _save(tmp_path, 40, keep=2)
  # The newest two by number would be 30 (bad) and 40: 20 would go.
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [20, 40]
  assert _good(tmp_path) == [20, 40]


def test_a_checkpoint_found_corrupt_on_load_does_not_count(tmp_path):
  for step in (10, 20, 30):
    _save(tmp_path, step, keep=5)
  _flip_a_byte(tmp_path, 30)  # the cheap check cannot see this one
  assert checkpoint_files.load_latest(str(tmp_path),
                                      warn=lambda m: None).step == 20
  _save(tmp_path, 25, keep=2)
  # Counting 30 would keep {25, 30} and delete the good 20.
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [20, 25, 30]
  assert _good(tmp_path) == [20, 25]
  # Once training passes it, the corrupt one goes like any older one.
  _save(tmp_path, 40, keep=2)
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [25, 40]


def test_the_checkpoint_just_committed_is_never_pruned(tmp_path):
  for step in (50, 60):
    _save(tmp_path, step, keep=5)
  # A save of an older step (say, after a restore of an older checkpoint)
  # with keep=1: the newer ones are not judged, the new one stays.
  _save(tmp_path, 40, keep=1)
  assert 40 in checkpoint_files.list_checkpoints(str(tmp_path))
  assert checkpoint_files.prune(str(tmp_path), 1, protect=40) == []


def test_a_newer_checkpoint_that_failed_to_load_once_is_not_deleted(
    tmp_path):
  # A file that could not be read at restart (a flaky mount, say) makes the
  # restore fall back; the newer checkpoint is not the retention's to judge.
  for step in (10, 30):
    _save(tmp_path, step, keep=5)
  model = os.path.join(_path(tmp_path, 30), "model.safetensors")
  os.rename(model, model + ".away")
  assert checkpoint_files.load_latest(str(tmp_path),
                                      warn=lambda m: None).step == 10
  os.rename(model + ".away", model)
  _save(tmp_path, 20, keep=1)
  assert _good(tmp_path) == [20, 30]


def test_nothing_is_pruned_when_nothing_verifies(tmp_path):
  for step in (10, 20):
    _save(tmp_path, step, keep=5)
  for step in (10, 20):
    with open(os.path.join(_path(tmp_path, step), "model.safetensors"),
              "r+b") as f:
      f.truncate(10)
  assert checkpoint_files.prune(str(tmp_path), 1) == []
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [10, 20]


# --- a run that does not restore -----------------------------------------------


def _engine(directory, snapshot_version=0, **kwargs):
  def take_snapshot(step):
    return checkpoint_engine.Snapshot(
        step, {"model": _arrays(step, snapshot_version)},
        {"step": step, "version": snapshot_version})
  kwargs.setdefault("log", lambda m: None)
  return checkpoint_engine.CheckpointEngine(
      str(directory), checkpoint_config(kwargs), take_snapshot=take_snapshot,
      **kwargs)


@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_a_run_that_does_not_restore_refuses_a_directory_with_checkpoints(
    tmp_path, on_error):
  for step in (10, 20):
    _save(tmp_path, step, keep=5)
  with pytest.raises(CheckpointDirectoryInUseError) as raised:
    _engine(tmp_path, every_steps=5, restoring=False, on_error=on_error)
  message = str(raised.value)
  assert "\n" not in message
  assert str(tmp_path) in message and "steps 10..20" in message
  assert "--model_dir" in message and "overwrite" in message
  assert _good(tmp_path) == [10, 20]  # untouched


def test_the_refusal_names_what_the_caller_says_resolves_it(tmp_path):
  _save(tmp_path, 10, keep=5)
  with pytest.raises(CheckpointDirectoryInUseError, match="pass restore=True"):
    _engine(tmp_path, restoring=False, resolve_hint="pass restore=True")


def test_overwrite_starts_over_and_a_later_restore_finds_the_new_run(tmp_path):
  for step in (40, 50):
    _save(tmp_path, step, keep=5)
  logged = []
  engine = _engine(tmp_path, snapshot_version=1, every_steps=5, keep=1,
                   restoring=False, overwrite=True, log=logged.append)
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == []
  assert any("removed the 2 checkpoint(s)" in m for m in logged)
  for step in range(1, 11):
    if engine.is_due(step):
      engine.save(step)
  engine.finish(10)
  loaded = checkpoint_files.load_latest(str(tmp_path))
  assert loaded.step == 10 and loaded.state["version"] == 1


def test_an_empty_directory_is_fine_for_a_run_that_does_not_restore(tmp_path):
  engine = _engine(tmp_path / "new", every_steps=2, restoring=False)
  engine.save(2)
  engine.close()
  assert checkpoint_files.list_checkpoints(str(tmp_path / "new")) == [2]


# --- the final save -------------------------------------------------------------


def _manifest(directory, step):
  with open(os.path.join(_path(directory, step),
                         checkpoint_files.MANIFEST_NAME), "rb") as f:
    return f.read()


def _finished_run(directory, last_step=12):
  engine = _engine(directory, every_steps=4, keep=2)
  for step in range(1, last_step + 1):
    if engine.is_due(step):
      engine.save(step)
  engine.finish(last_step)
  assert checkpoint_files.list_checkpoints(str(directory)) == [8, 12]
  return _manifest(directory, 12)


def test_a_finished_run_run_again_does_not_rewrite_its_final_checkpoint(
    tmp_path):
  before = _finished_run(tmp_path)
  for _ in range(3):  # a scheduler restarting a finished job, again and again
    # Another state (version 1, as a callback whose epoch was never set in
    # this process would describe it) must not replace the final one.
    engine = _engine(tmp_path, snapshot_version=1, every_steps=4, keep=2)
    engine.resumed_from(12, _path(tmp_path, 12))
    engine.finish(12)
    assert engine.stats()["num_saved"] == 0
  assert _manifest(tmp_path, 12) == before
  assert checkpoint_files.load_latest(str(tmp_path)).state["version"] == 0


def test_fewer_steps_than_restored_write_nothing_behind_it(tmp_path):
  before = _finished_run(tmp_path)
  logged = []
  engine = _engine(tmp_path, snapshot_version=1, every_steps=4, keep=2,
                   log=logged.append)
  engine.resumed_from(12, _path(tmp_path, 12))
  engine.finish(6)  # --train_steps=6 given to a run that did 12
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [8, 12]
  assert _manifest(tmp_path, 12) == before
  assert any("before the restored step 12" in m for m in logged)


def test_a_final_checkpoint_that_verifies_is_kept_even_without_a_restore(
    tmp_path):
  before = _finished_run(tmp_path)
  engine = _engine(tmp_path, snapshot_version=1, every_steps=4, keep=2)
  engine.finish(12)
  assert _manifest(tmp_path, 12) == before


def test_a_final_checkpoint_that_does_not_verify_is_replaced(tmp_path):
  _finished_run(tmp_path)
  _flip_a_byte(tmp_path, 12)
  engine = _engine(tmp_path, snapshot_version=1, every_steps=4, keep=2)
  engine.finish(12)
  loaded = checkpoint_files.load_checkpoint(_path(tmp_path, 12))
  assert loaded.state["version"] == 1
  assert json.dumps(engine.stats())
