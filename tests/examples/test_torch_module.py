"""examples/torch_module: an nn.Module and a map-style Dataset of the
user's own, trained by real trainer processes: stopped and resumed to the
bits of an uninterrupted run, and planned by torch_parity.plan and run on
that plan."""

import math
import shutil

import pytest

from overlap_core.checkpoint import files as checkpoint_files

from tests.examples import example_runs
from tests.helpers import run_module

NAME = "torch_module"
# Deterministic algorithms on one thread, one process: runs are
# bit-identical, so a resumed run can be compared with an uninterrupted one
# (as the trainer's own resume tests do on the zoo).
EXACT = ("--strategy=default", "--deterministic", "--image_size=8",
         "--batch_size=16", "--evaluate=false", "--intra_op_threads=1",
         "--inter_op_threads=1")
TOTAL_STEPS = 8
CHECKPOINTS = ("--checkpoint=async", "--checkpoint_every=2")
PIPELINE_JOB = ("--image_size=8", "--batch_size=16", "--strategy=mirrored",
                "--num_devices=2", "--pipeline_stages=2",
                "--pipeline_microbatches=2", "--intra_op_threads=1")
TIMEOUT_S = 600
# The claims need a profile the planner measured, not good times: each
# layer is timed once, cold, at the one micro-batch the stages run.
PROFILE_ONCE = ("--plan_batch_sizes=8", "--plan_warmup=0", "--plan_repeats=1")


def _train(model_dir, *args):
  result = run_module("torch_parity.train",
                      *example_runs.example_flags(NAME), *args,
                      *example_runs.QUIET, f"--model_dir={model_dir}",
                      timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-4000:]
  return example_runs.record_of(model_dir)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """TOTAL_STEPS steps in one run: (its model_dir, its record).

  Checkpoints do not change what a run computes, so its checkpoint of the
  middle step serves the resume test as the stopped run's."""
  model_dir = tmp_path_factory.mktemp(NAME)
  return model_dir, _train(model_dir, *EXACT, *CHECKPOINTS,
                           f"--train_steps={TOTAL_STEPS}")


def test_trains_from_its_import_paths(uninterrupted):
  _, record = uninterrupted
  example_runs.assert_sources(record, NAME)
  assert record["steps"] == TOTAL_STEPS
  assert math.isfinite(record["final"]["train_loss"])


def test_stopped_and_resumed_run_ends_bit_identical(tmp_path, uninterrupted):
  model_dir, whole = uninterrupted
  # The run as a stop after the middle step leaves it: that step's
  # checkpoint and nothing later.
  middle = TOTAL_STEPS // 2
  steps = checkpoint_files.list_checkpoints(str(model_dir / "checkpoints"))
  assert middle in steps and steps[-1] == TOTAL_STEPS, steps
  name = checkpoint_files.checkpoint_dir_name(middle)
  shutil.copytree(model_dir / "checkpoints" / name,
                  tmp_path / "checkpoints" / name)
  resumed = _train(tmp_path, *EXACT, *CHECKPOINTS,
                   f"--train_steps={TOTAL_STEPS}")
  assert resumed["checkpoint"]["restore"]["step"] == middle
  assert resumed["steps"] == middle  # after the restored batch
  assert resumed["weights_digest"] == whole["weights_digest"]


def test_plan_drives_the_pipeline_run(tmp_path):
  plan_dir = tmp_path / "plan"
  planned = run_module(
      "torch_parity.plan", *example_runs.example_flags(NAME), *PIPELINE_JOB,
      *PROFILE_ONCE, f"--plan_output_dir={plan_dir}",
      timeout=TIMEOUT_S)
  assert planned.returncode == 0, planned.stderr[-4000:]
  record = _train(tmp_path / "run", *PIPELINE_JOB, "--pipeline_split=auto",
                  f"--plan_profile={plan_dir / 'profile.json'}",
                  "--train_steps=2", "--evaluate=false")
  example_runs.assert_sources(record, NAME)
  section = record["pipeline"]
  assert section["split"] == "auto"
  [cut] = section["cut_layers"]
  assert f"cuts after: {cut}" in (plan_dir / "plan.txt").read_text(
      encoding="utf-8")
  assert all(row["predicted_ms"] > 0 for row in section["per_stage"])


def test_readme_runs_this_example():
  example_runs.assert_readme_runs_the_example(
      NAME, "torch_parity.train", "overlap_compare", "torch_parity.plan")
