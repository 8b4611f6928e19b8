"""`LedgerCallback` on a model and `model.fit` written here, in process."""

import io
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.config import ConfigError
from overlap_core.runtime.dir_lock import DirectoryInUseError
from tests.helpers import one_line_error
from tests import user_loop_compare
from tfoverlap import trainer
from tfoverlap.checkpoint import AsyncCheckpoint
from tfoverlap.ledger import LedgerCallback

BATCH = 4
BATCHES_PER_EPOCH = 4
EPOCHS = 2
STEPS = BATCHES_PER_EPOCH * EPOCHS
CHECKPOINT_EVERY = 2


def _model():
  keras.utils.set_random_seed(1)
  inputs = keras.Input((6,))
  hidden = keras.layers.Dense(8, activation="relu")(inputs)
  model = keras.Model(inputs, keras.layers.Dense(3)(hidden), name="user_mlp")
  model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  return model


def _dataset():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(BATCH * BATCHES_PER_EPOCH, 6)).astype("float32")
  y = rng.integers(0, 3, size=(BATCH * BATCHES_PER_EPOCH,))
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def _fit(root, name, checkpoint_first=None):
  """One fit with the ledger; with an AsyncCheckpoint listed before
  (checkpoint_first=True) or after it. Returns (callback, output, model)."""
  model = _model()
  stream = io.StringIO()
  callbacks = []
  ckpt = None
  if checkpoint_first is not None:
    ckpt = AsyncCheckpoint(os.path.join(root, f"{name}-ckpts"),
                           every=CHECKPOINT_EVERY)
  ledger = LedgerCallback(os.path.join(root, name), batch_size=BATCH,
                          checkpoint=ckpt, log_every_steps=4, stream=stream)
  callbacks = ([ckpt, ledger] if checkpoint_first else
               [ledger, ckpt] if ckpt else [ledger])
  model.fit(_dataset(), epochs=EPOCHS, verbose=0, callbacks=callbacks)
  return ledger, stream.getvalue(), model


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("fits"))
  return root, {"plain": _fit(root, "plain"),
                "checkpoint_first": _fit(root, "checkpoint_first", True),
                "checkpoint_last": _fit(root, "checkpoint_last", False)}


def test_a_plain_fit_leaves_the_trainers_run_json(fits):
  record, output, model = user_loop_compare.check_plain_run(
      *fits, framework="tensorflow", num_steps=STEPS,
      weights_digest=trainer.weights_digest)
  assert record["model"]["name"] == "user_mlp"
  assert record["model"]["source"] == {
      "source": "user_loop",
      "value": f"{type(model).__module__}:{type(model).__qualname__}"}
  assert record["checkpoint"] is None
  assert record["phases_measured"] == [ledger_lib.COMPUTE,
                                       ledger_lib.CHECKPOINT_STALL]
  assert " data_wait                n/a" in output


@pytest.mark.parametrize("name", ["checkpoint_first", "checkpoint_last"])
def test_the_checkpoint_callbacks_snapshots_are_its_stall(fits, name):
  """Whichever comes first in `callbacks`, each snapshot's wait is the
  checkpoint_stall of the step it follows, not compute or other."""
  root, runs = fits
  ledger, output, _ = runs[name]
  record = ledger.record
  checkpoint = record["checkpoint"]
  assert checkpoint["mode"] == "async"
  assert checkpoint["num_saved"] == STEPS // CHECKPOINT_EVERY
  steps = ledger._ctx.ledger.steps  # pylint: disable=protected-access
  stalled = [r.step for r in steps
             if r.phases_s.get(ledger_lib.CHECKPOINT_STALL, 0) > 0]
  assert stalled == list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))
  # The ledger's stall holds the engine's own measure of each snapshot.
  engine_total_s = (checkpoint["stall_s"]["mean"] *
                    checkpoint["stall_s"]["count"])
  ledger_total_s = sum(r.phases_s[ledger_lib.CHECKPOINT_STALL]
                       for r in steps if r.step in stalled)
  assert ledger_total_s >= engine_total_s
  for r in steps:
    assert sum(r.phases_s.values()) <= r.duration_s + 1e-9
  assert "ckpt" in output


def test_a_second_writer_of_the_directory_is_refused(fits, tmp_path):
  directory = str(tmp_path / "held")
  first = LedgerCallback(directory, batch_size=BATCH, progress=False)
  second = LedgerCallback(directory, batch_size=BATCH, progress=False)
  model = _model()
  first.set_model(model)
  first.on_train_begin()
  try:
    with pytest.raises(DirectoryInUseError):
      model.fit(_dataset(), epochs=1, verbose=0, callbacks=[second])
  finally:
    first._loop.abandon()  # pylint: disable=protected-access


@pytest.mark.parametrize("kwargs, says", [
    ({"batch_size": 0}, "batch_size=0: allowed: an integer >= 1"),
    ({"batch_size": 4, "log_every_steps": 0}, "log_every_steps=0"),
    ({"batch_size": 4, "checkpoint": "ckpts"}, "checkpoint='ckpts'"),
])
def test_bad_arguments_are_refused_at_once(tmp_path, kwargs, says):
  message = one_line_error(LedgerCallback, str(tmp_path), error=ConfigError,
                           **kwargs)
  assert says in message


def test_overlap_compare_reads_the_runs(fits, tmp_path):
  rows = user_loop_compare.check_compared(
      str(tmp_path / "compare"), "tensorflow", fits[0], "checkpoint_last")
  assert "checkpoint=async" in rows["report"]
  assert float(rows["baseline"]["samples_per_second"]) > 0
  assert float(rows["checkpoint=async"]["checkpoint_interval_s"]) > 0
