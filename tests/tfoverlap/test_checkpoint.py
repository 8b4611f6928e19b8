"""Checkpoints on the TensorFlow side: real training processes, real files.

Resume exactness, SIGKILLs at random moments, corrupt and mismatched
checkpoints, full disks and unwritable directories through the trainer; the
AsyncCheckpoint callback in a plain Keras `model.fit`. The callback's jobs
killed at any moment, and a second trainer on a live model directory, are
in test_checkpoint_kills.py.
"""

import glob
import os
import socket
import textwrap

import keras
import numpy as np
import pytest

from tfoverlap.checkpoint import (AsyncCheckpoint, CheckpointsExistError,
                                  DirectoryInUseError)
from overlap_core.checkpoint import files as checkpoint_files

from tests import checkpoint_support, trainer_checkpoints
from tests.tfoverlap import keras_fit_job as fit_job

# The trainer-run claims both sides share: each runs here on `trainer`.
from tests.trainer_checkpoints import (  # pylint: disable=unused-import
    stopped_at_20, test_async_stopped_and_resumed_run_ends_bit_identical,
    test_corrupt_newest_checkpoint_falls_back_to_the_previous,
    test_full_disk_applies_the_policy_and_keeps_the_good_checkpoint,
    test_sigkills_at_random_moments_lose_nothing, uninterrupted_digest)

TRAINER = trainer_checkpoints.Trainer("tfoverlap.train")


@pytest.fixture(scope="module")
def trainer():
  return TRAINER


@pytest.mark.parametrize("mode", ["sync", "tf_async"])
def test_stopped_and_resumed_run_ends_bit_identical(tmp_path, mode,
                                                    uninterrupted_digest):
  """TensorFlow's own checkpoints are written at the cadence, kept as
  asked, stall the steps that save, and resume exactly."""
  args = [f"--checkpoint={mode}", "--checkpoint_every=5",
          "--checkpoint_keep=2"]
  TRAINER.run(tmp_path, *args, "--train_steps=15")
  kept = sorted(os.path.basename(p) for p in glob.glob(
      str(tmp_path / "checkpoints" / "ckpt-*.index")))
  assert kept == ["ckpt-10.index", "ckpt-15.index"]
  assert trainer_checkpoints.record(
      tmp_path)["phases"]["checkpoint_stall"]["total"] > 0
  trainer_checkpoints.check_resume_ends_bit_identical(
      TRAINER, tmp_path, args, uninterrupted_digest, stopped_at=15)


def test_restoring_into_another_model_names_the_first_difference(
    tmp_path, stopped_at_20):
  last = trainer_checkpoints.check_another_model_is_refused(
      TRAINER, stopped_at_20, tmp_path)
  assert "kernel" in last  # Keras names a Dense layer's weights so


def test_unwritable_checkpoint_directory_is_one_line(tmp_path):
  (tmp_path / "checkpoints").write_text("a file where the directory goes")
  result = TRAINER.run(tmp_path, "--checkpoint=async", "--train_steps=5",
                       expect_ok=False)
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert "cannot write checkpoints to" in last


# Enough steps that the probe checkpoint's persist (of step 10) is measured
# before the run ends on a host whose fsyncs are slow: the cadence plans
# once it is, at one of the attempts every 10 steps. Steps of this MLP take
# milliseconds; 80 of them gave some loaded runs no decision at all.
AUTO_STEPS = 300


def test_auto_cadence_records_its_decisions_and_stays_in_bound(tmp_path):
  TRAINER.run(tmp_path, "--checkpoint=async", "--checkpoint_every=auto",
              f"--train_steps={AUTO_STEPS}")
  stats = trainer_checkpoints.record(tmp_path)["checkpoint"]
  assert stats["every_steps"] == "auto"
  assert stats["decisions"], stats
  decision = stats["decisions"][0]
  assert decision["every_steps"] >= 1
  assert decision["predicted_overhead_frac"] <= 0.03
  assert "overhead" in decision["reason"]
  # The final state is saved.
  assert stats["last_persisted_step"] == AUTO_STEPS


# --- AsyncCheckpoint in a plain Keras model.fit -----------------------------

# Named layers, so paths match in any process however many models it built
# before (Keras numbers unnamed layers per process).
_keras_model = fit_job.build_model
_identity = checkpoint_support.checkpoint_identity


def _keras_data():
  rng = np.random.default_rng(0)
  return (rng.normal(size=(256, 8)).astype(np.float32),
          rng.integers(0, 3, size=256))


def _fit(model, epochs: int, *callbacks) -> None:
  """Fits the 256 examples in order, 8 batches an epoch."""
  x, y = _keras_data()
  model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
            callbacks=list(callbacks))


def _quiet(message):
  del message


class _CountBatches(keras.callbacks.Callback):

  def __init__(self):
    super().__init__()
    self.num_batches = 0

  def on_train_batch_end(self, batch, logs=None):
    self.num_batches += 1


def test_callback_in_a_plain_fit_saves_restores_and_resumes_exactly(
    tmp_path):
  reference = _keras_model()
  _fit(reference, 4)

  directory = str(tmp_path / "ckpts")
  first = _keras_model()
  callback = AsyncCheckpoint(directory, every=8, keep=2, log=_quiet)
  _fit(first, 2, callback)
  assert checkpoint_files.list_checkpoints(directory) == [8, 16]
  assert callback.stats()["num_persisted"] == 2

  second = _keras_model()  # a new process would start from here
  callback = AsyncCheckpoint(directory, every=8, keep=2, log=_quiet)
  _fit(second, 4, callback)
  assert callback.restored_from.step == 16
  assert callback.restored_from.epoch == 2
  for got, want in zip(second.variables, reference.variables):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want),
                                  err_msg=got.path)
  assert checkpoint_files.list_checkpoints(directory) == [24, 32]


@pytest.mark.parametrize("every", [4, 6])
@pytest.mark.parametrize("unknown_length", [False, True],
                         ids=["known_length", "unknown_length"])
def test_a_finished_fit_rerun_trains_nothing_and_writes_nothing(
    tmp_path, unknown_length, every):
  # A job scheduler restarts a job that had finished, again and again. The
  # final state of 18 batches is saved at the end (every=4), or at the
  # last batch (every=6); a rerun restores it, trains no batch and must not
  # write it again, with epoch 0 or anything else. With unknown_length
  # Keras has no epoch length (params["steps"] is None), so the end of an
  # epoch is what says it ended.
  directory = str(tmp_path / "ckpts")
  dataset = fit_job.build_dataset(unknown_length)
  model = _keras_model()
  model.fit(dataset, epochs=fit_job.EPOCHS, verbose=0,
            callbacks=[AsyncCheckpoint(directory, every=every, log=_quiet)])
  weights = [np.asarray(w) for w in model.weights]
  final = checkpoint_files.load_latest(directory)
  total = fit_job.EPOCHS * fit_job.BATCHES_PER_EPOCH
  assert (final.step, final.state["epoch"], final.state["batch_in_epoch"]
          ) == (total, fit_job.EPOCHS, 0)
  # All of the final state, the optimizer's iteration count and the seed
  # states included (which Keras advances once more at the end of data of
  # unknown length): a fit given more epochs goes on as if never stopped.
  assert fit_job.checkpoint_digest(final) == fit_job.state_digest(
      model.variables + model.optimizer.variables)
  steps = checkpoint_files.list_checkpoints(directory)
  for step in steps:  # each says where its step is, an epoch's end as such
    state = checkpoint_files.load_checkpoint(os.path.join(
        directory, checkpoint_files.checkpoint_dir_name(step))).state
    assert (state["epoch"], state["batch_in_epoch"]) == divmod(
        step, fit_job.BATCHES_PER_EPOCH), state
  identity = _identity(directory, total)

  for _ in range(3):
    rerun = _keras_model()
    callback = AsyncCheckpoint(directory, every=every, log=_quiet)
    batches = _CountBatches()
    rerun.fit(dataset, epochs=fit_job.EPOCHS, verbose=0,
              callbacks=[callback, batches])
    assert callback.restored_from.step == total
    assert batches.num_batches == 0
    for got, want in zip(rerun.weights, weights):
      np.testing.assert_array_equal(np.asarray(got), want, err_msg=got.path)
    assert checkpoint_files.list_checkpoints(directory) == steps
    assert _identity(directory, total) == identity
    assert callback.stats()["num_saved"] == 0


def test_restore_false_refuses_checkpoints_and_overwrite_starts_over(
    tmp_path):
  directory = str(tmp_path / "ckpts")
  _fit(_keras_model(), 1, AsyncCheckpoint(directory, every=4, log=_quiet))
  assert checkpoint_files.list_checkpoints(directory) == [4, 8]
  identity = _identity(directory, 8)

  fresh = _keras_model()
  untrained = [np.asarray(w) for w in fresh.weights]
  batches = _CountBatches()
  with pytest.raises(CheckpointsExistError) as refused:
    _fit(fresh, 1, AsyncCheckpoint(directory, every=4, restore=False,
                                   log=_quiet), batches)
  message = str(refused.value)
  assert "\n" not in message and directory in message
  assert "steps 4..8" in message
  assert "restore=True" in message and "overwrite=True" in message
  assert batches.num_batches == 0
  for got, want in zip(fresh.weights, untrained):
    np.testing.assert_array_equal(np.asarray(got), want)
  assert checkpoint_files.list_checkpoints(directory) == [4, 8]
  assert _identity(directory, 8) == identity

  callback = AsyncCheckpoint(directory, every=3, restore=False,
                             overwrite=True, log=_quiet)
  _fit(fresh, 1, callback)
  assert callback.restored_from is None
  assert checkpoint_files.list_checkpoints(directory) == [3, 6, 8]
  newest = checkpoint_files.load_latest(directory)
  assert _identity(directory, 8) != identity
  for got, want in zip(fresh.variables, newest.groups["model"].values()):
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=got.path)


def test_callback_refuses_bad_arguments_at_once(tmp_path):
  directory = str(tmp_path)
  refusals = [
      (dict(every=0), 'every=0: allowed: "auto" or an integer >= 1'),
      (dict(every="often"), "every='often': allowed:"),
      (dict(max_overhead_frac=3), "max_overhead_frac=3: allowed: a fraction"),
      (dict(keep=0), "keep=0: allowed: an integer >= 1"),
      (dict(on_error="ignore"), "on_error='ignore': allowed: raise, warn"),
      (dict(if_busy="later"), "if_busy='later': allowed: wait, skip"),
      (dict(overwrite=True), "overwrite=True: allowed: False when restore"),
  ]
  for kwargs, message in refusals:
    with pytest.raises(ValueError) as refused:
      AsyncCheckpoint(directory, **kwargs)
    assert str(refused.value).startswith(message), refused.value
  assert not os.listdir(directory)  # refused before anything was written


_PLAIN_KERAS_LOAD = textwrap.dedent("""
    import sys
    import keras, numpy as np
    from safetensors.numpy import load_file
    assert "tfoverlap" not in sys.modules
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(16, "relu", name="hidden"),
                              keras.layers.Dropout(0.2, name="drop"),
                              keras.layers.Dense(3, name="logits")],
                             name="net")
    weights = load_file(sys.argv[1] + "/model.safetensors")
    for v in model.weights:
      v.assign(weights[v.path])
    x = np.load(sys.argv[2])
    np.save(sys.argv[3], np.asarray(model(x, training=False)))
""")


def test_checkpoint_weights_load_into_plain_keras_without_tfoverlap(
    tmp_path):
  # The expectation is a model trained alone for the 8 batches of one
  # epoch, without any checkpoint; the checkpoint of step 8 is taken in
  # the middle of a 2-epoch fit that goes on past it.
  expected = _keras_model()
  _fit(expected, 1)
  directory = str(tmp_path / "ckpts")
  _fit(_keras_model(), 2, AsyncCheckpoint(directory, every=8, log=_quiet))
  x = _keras_data()[0][:10]
  np.save(tmp_path / "x.npy", x)
  checkpoint_support.run_without_checkout(
      _PLAIN_KERAS_LOAD, os.path.join(directory, "ckpt-0000000008"),
      str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), cwd=str(tmp_path))
  # The same float32 ops on the same weights, but in another process,
  # where oneDNN may pick another kernel and sum in another order: a few
  # roundings over 8 + 16 products each, well under 1e-6 relative.
  np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                             np.asarray(expected(x, training=False)),
                             rtol=1e-6)


class _FitAnotherAt(keras.callbacks.Callback):
  """Starts a second fit, with `callback`, in the middle of this one."""

  def __init__(self, callback, at_batch: int):
    super().__init__()
    self._callback = callback
    self._at_batch = at_batch
    self.refused = None

  def on_train_batch_end(self, batch, logs=None):
    if batch == self._at_batch and self.refused is None:
      with pytest.raises(DirectoryInUseError) as refused:
        _fit(_keras_model(), 1, self._callback)
      self.refused = refused.value


def test_two_fits_on_one_directory_the_second_is_refused_until_the_first_ends(
    tmp_path):
  directory = str(tmp_path / "ckpts")
  second = AsyncCheckpoint(directory, every=4, log=_quiet)
  another = _FitAnotherAt(second, at_batch=5)  # after the step-4 checkpoint
  _fit(_keras_model(), 1, AsyncCheckpoint(directory, every=4, log=_quiet),
       another)
  message = str(another.refused)
  assert "\n" not in message
  assert message.startswith(
      f"directory={directory!r}: in use by pid {os.getpid()} on host "
      f"{socket.gethostname()}, started ")
  # The refused fit wrote nothing: the checkpoints are the first fit's.
  assert checkpoint_files.list_checkpoints(directory) == [4, 8]
  assert second.stats() == {}

  _fit(_keras_model(), 2, second)  # the first has ended and let go
  assert second.restored_from.step == 8
  assert checkpoint_files.list_checkpoints(directory) == [8, 12, 16]
