"""Checkpoints on the TensorFlow side under SIGKILL: a plain Keras
`model.fit` with AsyncCheckpoint killed at any moment, and a second trainer
on a live run's model directory, the holder then killed.

Apart from tests/tfoverlap/test_checkpoint.py so that the two files, each
run by one test worker, take similar times.
"""

import random
import signal
import sys

import pytest

from tests import checkpoint_support, trainer_checkpoints
from tests.tfoverlap import keras_fit_job as fit_job

_identity = checkpoint_support.checkpoint_identity


class _KillAtProgress:
  """`kill_when` for keras_fit_job: after the n-th of a run's progress
  lines (its batches, then "train end"), n drawn once its start says where
  it restored."""

  def __init__(self, pick):
    self._pick = pick  # (number of lines the run will print) -> n
    self._left = None

  def __call__(self, line: str) -> bool:
    if line.startswith("start "):
      epochs_left = fit_job.EPOCHS - int(line.split()[2])
      self._left = self._pick(
          max(epochs_left, 0) * fit_job.BATCHES_PER_EPOCH + 1)
      return False
    if line.startswith(("batch ", "train end")):
      self._left -= 1
      return self._left == 0
    return False


def _check_position(state: dict, unknown_length: bool) -> None:
  """A checkpoint says where fit goes on: an epoch, and a batch in it."""
  epoch, batch = state["epoch"], state["batch_in_epoch"]
  assert 0 <= epoch <= fit_job.EPOCHS, state
  # An epoch's last batch ends it, once its length is known; a dataset of
  # unknown length tells it only at the end of the first epoch a process runs.
  assert 0 <= batch <= (fit_job.BATCHES_PER_EPOCH if unknown_length
                        else fit_job.BATCHES_PER_EPOCH - 1), state
  assert epoch < fit_job.EPOCHS or batch == 0, state


def _done(lines) -> tuple:
  """keras_fit_job's digests: (weights, all state)."""
  return tuple(lines[-1].split()[1:]) if lines[-1].startswith("done ") else ()


@pytest.mark.parametrize("unknown_length", [False, True],
                         ids=["known_length", "unknown_length"])
def test_callback_sigkilled_anywhere_loses_nothing_and_stays_finished(
    tmp_path, unknown_length):
  directory = str(tmp_path / "ckpts")
  command = [sys.executable, "-m", "tests.tfoverlap.keras_fit_job",
             directory, *(["--unknown_length"] if unknown_length else [])]
  rng = random.Random(11)
  # Kills after a random batch (checkpoints every 2, so about half land in
  # a persist), then right after the last batch, then once fit has ended,
  # in its final save. Keras restarts a restored epoch at its first batch,
  # so the runs after the first kill train from an epoch's start.
  picks = [lambda lines: rng.randint(1, max(lines - 2, 1)),
           lambda lines: max(lines - 1, 1), lambda lines: lines]
  landed = 0
  for pick in picks:
    returncode, _, stderr = checkpoint_support.run_killed_when(
        command, _KillAtProgress(pick), line_timeout_s=240)
    assert returncode in (0, -signal.SIGKILL), stderr[-3000:]
    landed += returncode == -signal.SIGKILL
    newest = checkpoint_support.newest_checkpoint(directory)
    if newest is not None:
      _check_position(newest.state, unknown_length)
  assert landed >= 2

  returncode, lines, stderr = checkpoint_support.run_killed_when(
      command, lambda line: False, line_timeout_s=240)
  assert returncode == 0, stderr[-3000:]
  final = checkpoint_support.newest_checkpoint(directory)
  assert (final.state["epoch"], final.state["batch_in_epoch"]) == (
      fit_job.EPOCHS, 0)
  weights, state = _done(lines)
  # The finished fit's checkpoint is its final state, the optimizer's
  # iteration count and the seed states included.
  assert state == fit_job.checkpoint_digest(final)
  identity = _identity(directory, final.step)

  # Started again, it trains nothing and writes nothing (the in-process
  # test_a_finished_fit_rerun_trains_nothing_and_writes_nothing reruns a
  # finished fit three times; one rerun here shows it after the kills).
  returncode, lines, stderr = checkpoint_support.run_killed_when(
      command, lambda line: False, line_timeout_s=240)
  assert returncode == 0, stderr[-3000:]
  assert lines[0] == f"start {final.step} {fit_job.EPOCHS}", lines
  assert not [line for line in lines if line.startswith("batch ")], lines
  assert _done(lines) == (weights, fit_job.checkpoint_digest(final))
  assert _identity(directory, final.step) == identity


def test_a_second_trainer_on_a_live_model_dir_is_refused(tmp_path):
  trainer_checkpoints.check_one_writer_per_model_dir(
      trainer_checkpoints.Trainer("tfoverlap.train"), tmp_path)
