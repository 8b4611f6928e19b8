"""A crash at every filesystem step of a checkpoint commit loses nothing.

Each scenario (a commit, an overwrite of the same step, a save after falling
back past a corrupt checkpoint, a first commit into a missing directory,
with keep=1 and keep=3) is run once to count its filesystem steps (every
step announces itself to `durable.failpoint`), then once per step in a
forked child that dies with `os._exit` just before that step: no
`finally`, no `except`, no clean-up runs, as in a SIGKILL or a power cut
(the data written so far was fsynced). Then the restart's recovery is
itself killed at each of its steps, and finally run to the end. After
every combination:

  - nothing is left but committed checkpoints;
  - the newest checkpoint that verifies is what `load_latest` returns, and
    it is no older than the newest good one before the save;
  - every checkpoint that verifies holds exactly the arrays written for its
    step (the old or the new version of an overwritten one, never a mix);
  - no more good checkpoints were lost than retention allows: at least
    min(keep, good ones before the save) verify;
  - once the commit's rename has happened, the new checkpoint survives.

A file torn mid-write is not a separate case: it can only be inside a
`.tmp-` directory, which nothing loads and recovery promotes only after
verifying every checksum, so it is the same as a crash before that write.
"""

import dataclasses
import os
import shutil
import traceback
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest

from overlap_core.checkpoint import durable
from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.checkpoint import files as checkpoint_files

_CRASHED = 77  # the exit status of a child killed at its failpoint


def _arrays(step: int, version: int) -> Dict[str, np.ndarray]:
  value = step * 10 + version
  return {"w": np.full((8, 4), value, np.float32),
          "n": np.array([value, -value], np.int64)}


def _save(directory: str, step: int, version: int, keep: int) -> None:
  """What the engine's persist thread runs: commit, then prune."""
  snapshot = checkpoint_engine.Snapshot(
      step=step, groups={"model": _arrays(step, version), "optimizer": {}},
      state={"step": step, "version": version})
  checkpoint_engine.write_snapshot(directory, snapshot,
                                   to_host=lambda value: value, keep=keep)


def _flip_a_byte(directory: str, step: int) -> None:
  path = os.path.join(directory, checkpoint_files.checkpoint_dir_name(step),
                      "model.safetensors")
  with open(path, "r+b") as f:
    f.seek(-3, os.SEEK_END)
    byte = f.read(1)
    f.seek(-3, os.SEEK_END)
    f.write(bytes([byte[0] ^ 0x55]))


@dataclasses.dataclass(frozen=True)
class Scenario:
  name: str
  keep: int
  good: Tuple[Tuple[int, int], ...]  # (step, version) committed before
  corrupt: Tuple[int, ...]  # steps committed, then damaged (a flipped byte)
  save: Tuple[int, int]  # (step, version) the action saves
  restore_first: bool  # the action loads first (and meets the corrupt ones)
  expect_listed: Tuple[int, ...]  # the checkpoints after a crash-free save
  subdir: str = "checkpoints"
  fresh_parent: bool = False  # the directory's parents do not exist yet

  def versions(self) -> Dict[int, set]:
    """step -> the versions a good checkpoint of that step may hold."""
    allowed = {}
    for step, version in self.good + (self.save,):
      allowed.setdefault(step, set()).add(version)
    return allowed


SCENARIOS = [
    Scenario("commit_keep1", 1, ((10, 0),), (), (20, 0), False, (20,)),
    Scenario("commit_keep3", 3, ((10, 0), (20, 0), (30, 0)), (), (40, 0),
             False, (20, 30, 40)),
    Scenario("overwrite_keep1", 1, ((10, 0),), (), (10, 1), False, (10,)),
    Scenario("overwrite_keep3", 3, ((10, 0), (20, 0)), (), (20, 1), False,
             (10, 20)),
    # Fell back past a corrupt ckpt-30 to 10; saving 20 keeps 20 (and the
    # newer, corrupt 30, which it does not judge).
    Scenario("fallback_keep1", 1, ((10, 0),), (30,), (20, 0), True,
             (20, 30)),
    Scenario("fallback_keep3", 3, ((10, 0), (20, 0)), (30,), (25, 0), True,
             (10, 20, 25, 30)),
    # The corrupt one is of the step being saved: it is overwritten.
    Scenario("overwrite_corrupt_keep1", 1, ((10, 0),), (20,), (20, 1), True,
             (20,)),
    Scenario("first_commit_new_parents", 1, (), (), (10, 0), False, (10,),
             subdir="a/b/checkpoints", fresh_parent=True),
]


def _build(template: str, scenario: Scenario) -> str:
  os.makedirs(template)
  directory = os.path.join(template, scenario.subdir)
  for step, version in scenario.good:
    _save(directory, step, version, keep=100)
  for step in scenario.corrupt:
    _save(directory, step, 0, keep=100)
    _flip_a_byte(directory, step)
  if scenario.fresh_parent:
    assert not os.path.exists(os.path.join(template, "a"))
  return directory


def _action(directory: str, scenario: Scenario) -> Callable[[], None]:
  def run():
    if scenario.restore_first:
      checkpoint_files.load_latest(directory, warn=lambda message: None)
    _save(directory, *scenario.save, keep=scenario.keep)
  return run


def _recovery(directory: str) -> Callable[[], None]:
  return lambda: checkpoint_files.recover(directory)


def _count_steps(run: Callable[[], None]) -> List[Tuple[str, str]]:
  steps = []
  durable.failpoint = lambda operation, path: steps.append((operation, path))
  try:
    run()
  finally:
    durable.failpoint = None
  return steps


def _run_killed_at(run: Callable[[], None], index: int) -> int:
  """Runs `run` in a forked child that dies before step `index`; its exit."""
  pid = os.fork()
  if pid == 0:  # the child: whatever happens, it ends here
    status = 0
    try:
      calls = [0]

      def die_at_index(operation, path):
        del operation, path
        if calls[0] == index:
          os._exit(_CRASHED)  # pylint: disable=protected-access
        calls[0] += 1

      durable.failpoint = die_at_index
      # A new process knows of no corrupt checkpoint until it loads one.
      checkpoint_files._known_corrupt.clear()  # pylint: disable=protected-access
      run()
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      status = 1
    os._exit(status)  # pylint: disable=protected-access
  _, wait_status = os.waitpid(pid, 0)
  return os.waitstatus_to_exitcode(wait_status)


def _good_steps(directory: str, scenario: Scenario) -> Dict[int, int]:
  """step -> version of every checkpoint that verifies in full."""
  good = {}
  for step in checkpoint_files.list_checkpoints(directory):
    path = os.path.join(directory, checkpoint_files.checkpoint_dir_name(step))
    try:
      loaded = checkpoint_files.load_checkpoint(path)
    except checkpoint_files.CorruptCheckpointError:
      assert step in scenario.corrupt, f"ckpt {step} went bad"
      continue
    version = loaded.state["version"]
    assert version in scenario.versions()[step], (step, version)
    for name, array in _arrays(step, version).items():
      np.testing.assert_array_equal(loaded.groups["model"][name], array)
    good[step] = version
  return good


def _check_restart(directory: str, scenario: Scenario,
                   good_before: Dict[int, int], committed: bool) -> None:
  """Recovery to the end, then everything the retention promise says."""
  checkpoint_files.recover(directory)
  leftovers = [n for n in os.listdir(directory) if n.startswith(".")] \
      if os.path.isdir(directory) else []
  assert not leftovers
  good = _good_steps(directory, scenario)
  assert len(good) >= min(scenario.keep, len(good_before)), (good,
                                                             good_before)
  if good_before:
    assert max(good) >= max(good_before)
  save_step, save_version = scenario.save
  if committed:
    assert good.get(save_step) == save_version, good
  loaded = checkpoint_files.load_latest(directory, warn=lambda message: None)
  if good:
    assert loaded.step == max(good)
  else:
    assert loaded is None


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_a_crash_at_any_step_of_save_or_recovery_loses_nothing(
    tmp_path, scenario):
  template = str(tmp_path / "template")
  _build(template, scenario)
  directory_in = lambda root: os.path.join(root, scenario.subdir)
  good_before = _good_steps(directory_in(template), scenario)

  # A crash-free save first: what it leaves, and how many steps it takes.
  clean = str(tmp_path / "clean")
  shutil.copytree(template, clean)
  checkpoint_files._known_corrupt.clear()  # pylint: disable=protected-access
  steps = _count_steps(_action(directory_in(clean), scenario))
  assert checkpoint_files.list_checkpoints(directory_in(clean)) == list(
      scenario.expect_listed)
  commit_index = next(
      i for i, (operation, path) in enumerate(steps)
      if operation == "rename"
      and os.path.basename(path).startswith(".tmp-ckpt-"))

  num_recovery_crashes = 0
  for index in range(len(steps)):
    trial = str(tmp_path / f"crash-{index}")
    shutil.copytree(template, trial)
    directory = directory_in(trial)
    assert _run_killed_at(_action(directory, scenario), index) == _CRASHED
    # The restart's own recovery, killed at each of its steps in turn.
    snapshot = trial + ".before-recovery"
    shutil.copytree(trial, snapshot)
    recovery_steps = _count_recovery(snapshot, scenario)
    for recovery_index in range(recovery_steps):
      again = f"{snapshot}-{recovery_index}"
      shutil.copytree(snapshot, again)
      assert _run_killed_at(_recovery(directory_in(again)),
                            recovery_index) == _CRASHED
      _check_restart(directory_in(again), scenario, good_before,
                     committed=index > commit_index)
      shutil.rmtree(again)
      num_recovery_crashes += 1
    _check_restart(directory, scenario, good_before,
                   committed=index > commit_index)
    shutil.rmtree(trial)
    shutil.rmtree(snapshot)
  # The scenario really crossed the interesting states.
  assert len(steps) > commit_index + 1
  if scenario.name.startswith("overwrite"):
    assert num_recovery_crashes > 0  # an overwrite cut between its renames


def _count_recovery(snapshot: str, scenario: Scenario) -> int:
  """The steps a recovery of a copy of `snapshot` takes."""
  probe = snapshot + "-count"
  shutil.copytree(snapshot, probe)
  try:
    return len(_count_steps(_recovery(os.path.join(probe, scenario.subdir))))
  finally:
    shutil.rmtree(probe)


def test_every_rename_and_new_directory_is_synced_where_it_lives(tmp_path):
  # A rename, or a new directory, is durable only once the directory that
  # holds its entry is fsynced: the checkpoints directory for a commit, and
  # each newly created parent for a first commit.
  directory = str(tmp_path / "new" / "checkpoints")
  steps = _count_steps(lambda: _save(directory, 10, 0, keep=1))
  steps += _count_steps(lambda: _save(directory, 10, 1, keep=1))
  steps += _count_steps(lambda: _save(directory, 20, 0, keep=1))
  for index, (operation, path) in enumerate(steps):
    if operation in ("rename", "mkdir"):
      parent = os.path.dirname(path)
      later = steps[index + 1:]
      assert ("fsync_dir", parent) in later[:1], (operation, path, later[:2])
  created = [path for operation, path in steps if operation == "mkdir"]
  assert str(tmp_path / "new") in created and directory in created
