"""The Checkpointer both frameworks subclass, its settings and its checks.

The "framework" here is a dict of NumPy arrays trained by adding to them:
the shared class must work with any state a side supplies.
"""

import dataclasses
import os

import numpy as np
import pytest

from overlap_core.checkpoint import checkpointer as shared
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint import mismatch
from overlap_core.checkpoint.files import CheckpointMismatchError
from overlap_core.runtime import dir_lock
from overlap_core.runtime.config import (CHECKPOINT_AUTO, ArgumentError,
                                         CheckpointConfig, ConfigError,
                                         every_steps_from)


class _ArrayCheckpointer(shared.Checkpointer):
  """Checkpoints a dict of arrays, the way a framework side would."""

  def __init__(self, cfg, directory, *, weights, **kwargs):
    super().__init__(cfg, directory, **kwargs)
    self.weights = weights
    self._start_engine(
        save_inline=self._write_now if cfg.mode == "sync" else None)

  def _take(self):
    return {"model": {k: v.copy() for k, v in self.weights.items()}}, {}

  def _assign(self, loaded):
    mismatch.check_fits(
        loaded.path, "model tensor",
        mismatch.stored_specs(self.weights),
        mismatch.stored_specs(loaded.groups["model"]), compare_names=True)
    self.weights.update(loaded.groups["model"])


def _weights(value: float = 0.0) -> dict:
  return {"w": np.full((2, 3), value, np.float32),
          "b": np.full((3,), value, np.float64)}


def _train(checkpointer, steps) -> None:
  for step in steps:
    for array in checkpointer.weights.values():
      array += 1
    if checkpointer.is_due(step):
      checkpointer.save(step)


def _config(mode="async", every=2) -> CheckpointConfig:
  return CheckpointConfig(mode=mode, every_steps=every, keep=2)


def _quiet(message):
  del message


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_save_restore_and_finish_delegate_to_the_engine(tmp_path, mode):
  directory = str(tmp_path)
  first = _ArrayCheckpointer(_config(mode), directory, weights=_weights(),
                             log=_quiet)
  _train(first, range(1, 6))
  first.finish(5)  # step 5 is off the cadence: the final save writes it
  assert checkpoint_files.list_checkpoints(directory) == [4, 5]
  assert first.stats()["last_persisted_step"] == 5

  second = _ArrayCheckpointer(_config(mode), directory,
                              weights=_weights(-1.0), log=_quiet)
  point = second.restore_latest()
  assert point.step == 5 and point.state == {"step": 5}
  np.testing.assert_array_equal(second.weights["w"], np.full((2, 3), 5))
  assert second.stats()["restore"] == {"step": 5, "path": point.path}


def test_finish_after_a_restore_with_no_step_writes_nothing(tmp_path):
  # The shape of a finished job started again: restore, no step, finish.
  directory = str(tmp_path)
  first = _ArrayCheckpointer(_config(), directory, weights=_weights(),
                             log=_quiet)
  _train(first, range(1, 4))
  first.finish(3)
  before = os.stat(os.path.join(directory, "ckpt-0000000003"))
  for last_step in (3, 2, 7):
    again = _ArrayCheckpointer(_config(), directory, weights=_weights(),
                               log=_quiet)
    assert again.restore_latest().step == 3
    again.finish(last_step)
    assert again.stats()["num_saved"] == 0
    assert checkpoint_files.list_checkpoints(directory) == [2, 3]
  after = os.stat(os.path.join(directory, "ckpt-0000000003"))
  assert (after.st_ino, after.st_mtime_ns) == (before.st_ino,
                                               before.st_mtime_ns)


def test_a_side_refuses_a_mode_it_does_not_checkpoint_in(tmp_path):
  with pytest.raises(ConfigError, match="mode='tf_async': allowed here: "
                     "sync, async"):
    _ArrayCheckpointer(_config("tf_async"), str(tmp_path),
                       weights=_weights())
  assert _ArrayCheckpointer.for_run(_config("none"), str(tmp_path),
                                    weights=_weights()) is None


def test_a_checkpoint_that_does_not_fit_names_the_first_difference(
    tmp_path):
  directory = str(tmp_path)
  first = _ArrayCheckpointer(_config(), directory, weights=_weights(),
                             log=_quiet)
  _train(first, range(1, 3))
  first.close()
  loaded = checkpoint_files.load_latest(directory)
  stored = mismatch.stored_specs(loaded.groups["model"])
  wider = [("w", (2, 4), np.dtype(np.float32)), stored[1]]
  with pytest.raises(CheckpointMismatchError) as raised:
    mismatch.check_fits(loaded.path, "model tensor", wider, stored,
                        compare_names=True)
  assert str(raised.value) == (
      f"{loaded.path} does not fit: model tensor 0 of the model is 'w' "
      "(2, 4) float32, the checkpoint has 'w' (2, 3) float32")
  renamed = [("kernel", *stored[0][1:]), stored[1]]
  mismatch.check_fits(loaded.path, "model variable", renamed, stored,
                      compare_names=False)  # by position: it fits
  with pytest.raises(CheckpointMismatchError, match="model tensor 0 of"):
    mismatch.check_fits(loaded.path, "model tensor", renamed, stored,
                        compare_names=True)
  with pytest.raises(CheckpointMismatchError,
                     match=r"model tensor 2 'c' \(1,\) int64 is missing "
                     "from the checkpoint, which has 2 model tensors"):
    mismatch.check_fits(loaded.path, "model tensor",
                        [*stored, ("c", (1,), np.dtype(np.int64))], stored,
                        compare_names=True)
  with pytest.raises(CheckpointMismatchError,
                     match="the checkpoint has 2 model tensors, the model "
                     r"1; the first extra is 'b' \(3,\) float64"):
    mismatch.check_fits(loaded.path, "model tensor", stored[:1], stored,
                        compare_names=True)


def test_existing_checkpoints_are_refused_in_one_line_or_removed(tmp_path):
  directory = str(tmp_path / "ckpts")
  shared.refuse_existing_checkpoints(directory, "never mind")  # none there
  first = _ArrayCheckpointer(_config(), directory, weights=_weights(),
                             log=_quiet)
  _train(first, range(1, 7))
  first.close()
  with pytest.raises(shared.CheckpointsExistError) as refused:
    shared.refuse_existing_checkpoints(directory, "use another directory")
  assert str(refused.value) == (
      f"{directory} holds checkpoints of steps 4..6 (2 in all), and a run "
      "that does not restore would mix its checkpoints with them: use "
      "another directory")
  assert list(shared.remove_checkpoints(directory)) == [4, 6]
  assert checkpoint_files.list_checkpoints(directory) == []
  # Nothing half-deleted; the LOCK of the checkpointer that wrote stays.
  assert os.listdir(directory) == [dir_lock.LOCK_NAME]


# --- CheckpointConfig: the one place checkpoint settings are checked ------


@pytest.mark.parametrize("field, value, allowed", [
    ("mode", "often", "allowed: none, sync, tf_async, async"),
    ("every_steps", -1, "allowed: 0 (auto) or an integer >= 1"),
    ("every_steps", 2.0, "allowed: 0 (auto) or an integer >= 1"),
    ("keep", 0, "allowed: an integer >= 1"),
    ("keep", True, "allowed: an integer >= 1"),
    ("max_overhead_frac", 1.5, "allowed: a fraction between 0 and 1"),
    ("max_overhead_frac", 0, "allowed: a fraction between 0 and 1"),
    ("on_error", "ignore", "allowed: raise, warn"),
    ("if_busy", "later", "allowed: wait, skip"),
])
def test_config_names_the_setting_the_value_and_what_is_allowed(
    field, value, allowed):
  good = dict(mode="async", every_steps=3, keep=2)
  with pytest.raises(ArgumentError) as as_argument:
    CheckpointConfig(**{**good, field: value})
  assert str(as_argument.value).startswith(f"{field}={value!r}: {allowed}")
  with pytest.raises(ConfigError) as as_flag:
    CheckpointConfig(**{**good, field: value},
                     names={field: "--checkpoint_x"})
  assert not isinstance(as_flag.value, ArgumentError)
  assert as_flag.value.flag == "checkpoint_x"
  assert str(as_flag.value).startswith(f"--checkpoint_x={value}: {allowed}")
  assert isinstance(as_argument.value, ValueError)  # what Keras users catch


def test_config_is_frozen_and_round_trips():
  config = CheckpointConfig(mode="async", every_steps=CHECKPOINT_AUTO,
                            keep=3, names={"keep": "--checkpoint_keep"})
  assert dataclasses.asdict(config) == {
      "mode": "async", "every_steps": 0, "keep": 3,
      "max_overhead_frac": 0.03, "on_error": "raise", "if_busy": "wait"}
  assert dataclasses.replace(config, keep=1).keep == 1
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.keep = 5


@pytest.mark.parametrize("value, steps", [
    ("auto", CHECKPOINT_AUTO), (" AUTO ", CHECKPOINT_AUTO), ("7", 7), (7, 7)])
def test_every_steps_from_what_users_write(value, steps):
  assert every_steps_from(value) == steps


@pytest.mark.parametrize("value", ["0", 0, "-3", "often", 2.5, True, None])
def test_every_steps_refuses_the_rest_naming_the_setting(value):
  with pytest.raises(ConfigError, match=r'allowed: "auto" or an integer '):
    every_steps_from(value, "--checkpoint_every")
  with pytest.raises(ArgumentError, match=f"^every={value!r}: "):
    every_steps_from(value, "every")
