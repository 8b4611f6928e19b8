"""The checkpoint claims both trainers meet, through real trainer runs,
each written once.

Each side's test_checkpoint.py defines a module fixture `trainer` (its
`Trainer`) and imports the fixtures and tests below by name: pytest collects
a test in the module that names it, so each side runs it on its own trainer
under its own id. Where a side adds its own assertions (its error text, its
record fields), its test calls a `check_*` function here instead:

  @pytest.fixture(scope="module")
  def trainer():
    return trainer_checkpoints.Trainer("torch_parity.train")

Runs are bit-identical (--deterministic, one seed), so a resumed run must
end with the weights of an uninterrupted one, not near them.
"""

import dataclasses
import os
import random
import subprocess
import sys
from typing import List, Sequence

import pytest

from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.runtime import run_record

from tests import checkpoint_support
from tests.helpers import REPO_ROOT, subprocess_env

# Synthetic images through the whole input pipeline (shuffle, parallel
# decode, prefetch), read per index as a file source is: the claims need a
# shuffled pipeline whose position a checkpoint restores, not real images.
# The MLP on 8x8 images keeps each process quick.
EXACT = ("--model=mlp", "--dataset=synthetic", "--image_size=8",
         "--strategy=default", "--deterministic", "--batch_size=32",
         "--log_every_steps=5", "--tensorboard=false", "--trace=false",
         "--evaluate=false")
TOTAL_STEPS = 30
ASYNC_EVERY_10 = ("--checkpoint=async", "--checkpoint_every=10")


@dataclasses.dataclass(frozen=True)
class Trainer:
  """One side's trainer, run with EXACT and then its own `flags`."""
  module: str  # "tfoverlap.train"
  flags: Sequence[str] = ()

  def command(self, model_dir, *args: str) -> List[str]:
    return [sys.executable, "-m", self.module, f"--model_dir={model_dir}",
            *EXACT, *self.flags, *args]

  def run(self, model_dir, *args: str, timeout: float = 300,
          expect_ok: bool = True, **popen) -> subprocess.CompletedProcess:
    """Runs the trainer to its end; with `expect_ok`, it must succeed."""
    result = subprocess.run(
        self.command(model_dir, *args), cwd=REPO_ROOT, env=subprocess_env(),
        capture_output=True, text=True, timeout=timeout, check=False,
        **popen)
    if expect_ok:
      assert result.returncode == 0, result.stderr[-4000:]
    return result


def record(model_dir) -> dict:
  return run_record.load_run_record(str(model_dir))


@pytest.fixture(scope="module")
def uninterrupted_digest(trainer, tmp_path_factory) -> str:
  """The weights digest of TOTAL_STEPS uninterrupted steps, no checkpoints."""
  model_dir = tmp_path_factory.mktemp("uninterrupted")
  trainer.run(model_dir, f"--train_steps={TOTAL_STEPS}")
  return record(model_dir)["weights_digest"]


@pytest.fixture(scope="module")
def stopped_at_20(trainer, tmp_path_factory):
  """A run stopped after step 20 with async checkpoints of steps 10 and 20;
  each test resumes a copy of its checkpoints, so one run serves them all."""
  model_dir = tmp_path_factory.mktemp("stopped_at_20")
  trainer.run(model_dir, *ASYNC_EVERY_10, "--train_steps=20")
  assert checkpoint_files.list_checkpoints(
      str(model_dir / "checkpoints")) == [10, 20]
  return model_dir


def check_resume_ends_bit_identical(trainer: Trainer, model_dir, args,
                                    uninterrupted_digest, *,
                                    stopped_at: int) -> dict:
  """Resumed to TOTAL_STEPS from a run stopped at `stopped_at` in
  `model_dir`, a run ends with the uninterrupted weights.

  Returns:
    The resumed run's record.
  """
  resumed = trainer.run(model_dir, *args, f"--train_steps={TOTAL_STEPS}")
  resumed_record = record(model_dir)
  # It trains from the batch after the checkpoint's, not from scratch.
  assert resumed_record["steps"] == TOTAL_STEPS - stopped_at
  assert resumed_record["checkpoint"]["restore"]["step"] == stopped_at
  assert f"step {stopped_at}" in " ".join(resumed_record["notes"])
  assert resumed_record["weights_digest"] == uninterrupted_digest, (
      resumed.stderr)
  return resumed_record


def test_async_stopped_and_resumed_run_ends_bit_identical(
    trainer, tmp_path, stopped_at_20, uninterrupted_digest):
  checkpoint_support.resume_from(stopped_at_20, tmp_path)
  check_resume_ends_bit_identical(trainer, tmp_path, ASYNC_EVERY_10,
                                  uninterrupted_digest, stopped_at=20)


def test_sigkills_at_random_moments_lose_nothing(trainer, tmp_path,
                                                 uninterrupted_digest):
  # Checkpoints every 3 steps keep a persist in flight much of the time, so
  # kills after random step lines land in steps, snapshots, persists,
  # renames and prunes alike; the last lands after the final step. After
  # every kill the newest checkpoint must verify; the run that finally
  # completes must end with the uninterrupted run's weights.
  args = ["--log_every_steps=1", "--checkpoint=async", "--checkpoint_every=3",
          "--checkpoint_keep=2", f"--train_steps={TOTAL_STEPS}"]
  landed = checkpoint_support.kill_trainer_at_random_steps(
      trainer.command(tmp_path, *args), str(tmp_path / "checkpoints"),
      total_steps=TOTAL_STEPS,
      num_kills=checkpoint_support.NUM_RANDOM_KILLS, rng=random.Random(7))
  assert landed >= checkpoint_support.NUM_RANDOM_KILLS
  trainer.run(tmp_path, *args)
  assert record(tmp_path)["weights_digest"] == uninterrupted_digest


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(
    trainer, tmp_path, stopped_at_20):
  directory = checkpoint_support.resume_from(stopped_at_20, tmp_path)
  checkpoint_support.damage(
      os.path.join(directory, "ckpt-0000000020", "model.safetensors"))
  result = trainer.run(tmp_path, *ASYNC_EVERY_10, "--train_steps=25")
  checkpoint_support.check_fell_back(result, str(tmp_path),
                                     restored_step=10, num_steps=15)


def check_another_model_is_refused(trainer: Trainer, stopped_at_20,
                                   model_dir) -> str:
  """Restoring into a model of other shapes (16x16 images) fails on the
  first difference and leaves the checkpoint as it was.

  Returns:
    The error line, for the side's own wording of the difference.
  """
  directory = checkpoint_support.resume_from(stopped_at_20, model_dir)
  result = trainer.run(model_dir, *ASYNC_EVERY_10, "--train_steps=25",
                       "--image_size=16", expect_ok=False)
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert "CheckpointMismatchError" in last and "does not fit" in last
  # The good checkpoint is untouched by the failed attempt.
  assert checkpoint_files.load_latest(directory).step == 20
  return last


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_full_disk_applies_the_policy_and_keeps_the_good_checkpoint(
    trainer, tmp_path, stopped_at_20, policy):
  # A file-size limit below the model file makes its write fail mid-file,
  # as a full disk does.
  directory = checkpoint_support.resume_from(stopped_at_20, tmp_path,
                                             drop=[20])
  model_bytes = os.path.getsize(
      os.path.join(directory, "ckpt-0000000010", "model.safetensors"))
  result = trainer.run(
      tmp_path, *ASYNC_EVERY_10, f"--checkpoint_on_error={policy}",
      f"--train_steps={TOTAL_STEPS}", expect_ok=False,
      preexec_fn=checkpoint_support.limit_file_size(model_bytes // 2))
  checkpoint_support.check_full_disk_outcome(result, policy, str(tmp_path))


def check_one_writer_per_model_dir(trainer: Trainer, model_dir):
  """A second trainer on a live model directory is refused."""
  checkpoint_support.check_one_writer_per_model_dir(
      trainer.module, str(model_dir),
      [*EXACT, *trainer.flags, "--checkpoint=async", "--checkpoint_every=5",
       "--checkpoint_keep=2"])
