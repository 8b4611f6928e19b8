"""Checkpoints on the TensorFlow side: real training processes, real files.

Resume exactness, SIGKILLs at random moments, corrupt and mismatched
checkpoints, full disks and unwritable directories through the trainer; the
AsyncCheckpoint callback in a plain Keras `model.fit`.
"""

import os
import random
import resource
import signal
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from tfoverlap.checkpoint import AsyncCheckpoint
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.runtime import run_record

from tests.helpers import REPO_ROOT, run_module, subprocess_env, wait_for_line

# Digits through the whole pipeline (shuffle, parallel map, prefetch), with
# deterministic ops: runs are bit-identical, so resumes can be compared.
EXACT = ["--model=small_cnn", "--strategy=default", "--deterministic",
         "--log_every_steps=5", "--tensorboard=false", "--trace=false",
         "--evaluate=false", "--batch_size=32"]


def _train(model_dir, *args, timeout=300, expect_ok=True):
  result = run_module("tfoverlap.train", f"--model_dir={model_dir}", *EXACT,
                      *args, timeout=timeout)
  if expect_ok:
    assert result.returncode == 0, result.stderr[-4000:]
  return result


def _digest(model_dir) -> str:
  return run_record.load_run_record(str(model_dir))["weights_digest"]


@pytest.fixture(scope="module")
def uninterrupted_digest(tmp_path_factory):
  """The final weights of 60 uninterrupted steps (no checkpoints)."""
  model_dir = tmp_path_factory.mktemp("uninterrupted")
  _train(model_dir, "--train_steps=60")
  return _digest(model_dir)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_stopped_and_resumed_run_ends_bit_identical(tmp_path, mode,
                                                    uninterrupted_digest):
  args = [f"--checkpoint={mode}", "--checkpoint_every=10"]
  _train(tmp_path, *args, "--train_steps=30")
  resumed = _train(tmp_path, *args, "--train_steps=60")
  record = run_record.load_run_record(str(tmp_path))
  assert record["steps"] == 30  # steps 31..60, after the batch of step 30
  assert record["checkpoint"]["restore"]["step"] == 30
  assert "step 30" in " ".join(record["notes"])
  assert record["weights_digest"] == uninterrupted_digest, resumed.stderr


def test_sigkills_at_random_moments_lose_nothing(tmp_path,
                                                 uninterrupted_digest):
  # Checkpoints every 3 steps keep a persist in flight most of the time, so
  # the kills land in snapshots, persists, renames and prunes alike. After
  # every kill the newest checkpoint must verify; the run that finally
  # completes must end with the uninterrupted run's weights.
  rng = random.Random(7)
  args = [f"--model_dir={tmp_path}", *EXACT, "--checkpoint=async",
          "--checkpoint_every=3", "--checkpoint_keep=2", "--train_steps=60"]
  kills = 0
  for _ in range(6):
    process = subprocess.Popen(
        [sys.executable, "-m", "tfoverlap.train", *args], cwd=REPO_ROOT,
        env=subprocess_env(), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    try:
      wait_for_line(process.stdout, "step ", timeout=240)
      try:
        process.wait(timeout=rng.uniform(0.0, 1.5))
      except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        kills += 1
    finally:
      process.kill()
      process.wait()
      process.stdout.close()
    loaded = checkpoint_files.load_latest(
        str(tmp_path / "checkpoints"),
        warn=lambda m: pytest.fail(f"a kill left a bad checkpoint: {m}"))
    assert loaded is not None and loaded.state["step"] == loaded.step
    if loaded.step == 60:
      break
  assert kills >= 3
  _train(tmp_path, *args[2:])
  assert _digest(tmp_path) == uninterrupted_digest


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path):
  args = ["--checkpoint=async", "--checkpoint_every=10"]
  _train(tmp_path, *args, "--train_steps=20")
  newest = tmp_path / "checkpoints" / "ckpt-0000000020" / "model.safetensors"
  with open(newest, "r+b") as f:
    f.seek(1000)
    f.write(b"\x00" * 64)
  result = _train(tmp_path, *args, "--train_steps=30")
  assert "skipping corrupt checkpoint" in result.stderr
  assert "checksum mismatch" in result.stderr
  record = run_record.load_run_record(str(tmp_path))
  assert record["checkpoint"]["restore"]["step"] == 10
  assert record["steps"] == 20


def test_restoring_into_another_model_names_the_first_difference(tmp_path):
  _train(tmp_path, "--checkpoint=async", "--checkpoint_every=5",
         "--train_steps=5")
  result = _train(tmp_path, "--checkpoint=async", "--checkpoint_every=5",
                  "--train_steps=10", "--image_size=24", expect_ok=False)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert "CheckpointMismatchError" in lines[-1]
  assert "does not fit" in lines[-1] and "kernel" in lines[-1]
  # The good checkpoint is untouched by the failed attempt.
  assert checkpoint_files.load_latest(str(tmp_path / "checkpoints")).step == 5


def _limit_file_size(max_bytes):
  def apply():
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
  return apply


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_full_disk_applies_the_policy_and_keeps_the_good_checkpoint(
    tmp_path, policy):
  # A file-size limit makes every write past 256 KB fail with EFBIG, as a
  # full disk fails with ENOSPC: the persist sees an OSError mid-file.
  args = ["--checkpoint=async", "--checkpoint_every=10",
          f"--checkpoint_on_error={policy}"]
  _train(tmp_path, *args, "--train_steps=10")
  result = subprocess.run(
      [sys.executable, "-m", "tfoverlap.train", f"--model_dir={tmp_path}",
       *EXACT, *args, "--train_steps=30"], cwd=REPO_ROOT,
      env=subprocess_env(), capture_output=True, text=True, timeout=300,
      preexec_fn=_limit_file_size(256 * 1024), check=False)
  if policy == "raise":
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "checkpoint of step 20 failed" in last and "too large" in last
  else:
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training goes on" in result.stderr
    record = run_record.load_run_record(str(tmp_path))
    assert record["checkpoint"]["num_failed"] >= 2
  directory = str(tmp_path / "checkpoints")
  assert checkpoint_files.list_checkpoints(directory) == [10]
  assert checkpoint_files.load_latest(directory).step == 10
  assert not [n for n in os.listdir(directory) if n.startswith(".")]


def test_unwritable_checkpoint_directory_is_one_line(tmp_path):
  (tmp_path / "checkpoints").write_text("a file where the directory goes")
  result = _train(tmp_path, "--checkpoint=async", "--train_steps=5",
                  expect_ok=False)
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert "cannot write checkpoints to" in last


def test_auto_cadence_records_its_decisions_and_stays_in_bound(tmp_path):
  _train(tmp_path, "--checkpoint=async", "--checkpoint_every=auto",
         "--train_steps=80")
  stats = run_record.load_run_record(str(tmp_path))["checkpoint"]
  assert stats["every_steps"] == "auto"
  assert stats["decisions"], stats
  decision = stats["decisions"][0]
  assert decision["every_steps"] >= 1
  assert decision["predicted_overhead_frac"] <= 0.03
  assert "overhead" in decision["reason"]
  assert stats["last_persisted_step"] == 80  # the final state is saved


# --- AsyncCheckpoint in a plain Keras model.fit -----------------------------


def _keras_model():
  # Named layers: paths then match in any process, however many models it
  # built before (Keras numbers unnamed layers per process).
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((8,)),
                            keras.layers.Dense(16, "relu", name="hidden"),
                            keras.layers.Dropout(0.2, name="drop"),
                            keras.layers.Dense(3, name="logits")],
                           name="net")
  model.compile(optimizer=keras.optimizers.Adam(1e-2),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def _keras_data():
  rng = np.random.default_rng(0)
  return (rng.normal(size=(256, 8)).astype(np.float32),
          rng.integers(0, 3, size=256))


def test_callback_in_a_plain_fit_saves_restores_and_resumes_exactly(
    tmp_path):
  x, y = _keras_data()
  reference = _keras_model()
  reference.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0)

  directory = str(tmp_path / "ckpts")
  first = _keras_model()
  callback = AsyncCheckpoint(directory, every=8, keep=2, log=lambda m: None)
  first.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
            callbacks=[callback])
  assert checkpoint_files.list_checkpoints(directory) == [8, 16]
  assert callback.stats()["num_persisted"] == 2

  second = _keras_model()  # a new process would start from here
  callback = AsyncCheckpoint(directory, every=8, keep=2, log=lambda m: None)
  second.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0,
             callbacks=[callback])
  assert callback.restored_from.step == 16
  assert callback.restored_from.epoch == 2
  for got, want in zip(second.variables, reference.variables):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want),
                                  err_msg=got.path)
  assert checkpoint_files.list_checkpoints(directory) == [24, 32]


def test_callback_refuses_bad_arguments_at_once(tmp_path):
  with pytest.raises(ValueError, match="Invalid value for argument `every`"):
    AsyncCheckpoint(str(tmp_path), every=0)
  with pytest.raises(ValueError, match="max_overhead_frac"):
    AsyncCheckpoint(str(tmp_path), max_overhead_frac=3)
  with pytest.raises(ValueError, match="if_busy"):
    AsyncCheckpoint(str(tmp_path), if_busy="later")


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
  x, y = _keras_data()
  model = _keras_model()
  directory = str(tmp_path / "ckpts")
  model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
            callbacks=[AsyncCheckpoint(directory, every=8,
                                       log=lambda m: None)])
  np.save(tmp_path / "x.npy", x[:10])
  env = dict(subprocess_env())
  env.pop("PYTHONPATH", None)  # nothing of the checkout on the path
  subprocess.run(
      [sys.executable, "-c", _PLAIN_KERAS_LOAD,
       os.path.join(directory, "ckpt-0000000008"), str(tmp_path / "x.npy"),
       str(tmp_path / "y.npy")], cwd=str(tmp_path), env=env, check=True,
      timeout=120)
  np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                             np.asarray(model(x[:10], training=False)),
                             rtol=1e-6)
