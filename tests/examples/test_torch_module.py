"""examples/torch_module: an nn.Module and a map-style Dataset of the
user's own, trained by real trainer processes: stopped and resumed to the
bits of an uninterrupted run, and planned by torch_parity.plan and run on
that plan."""

import math

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
  example_runs.stop_after(model_dir / "checkpoints", middle, tmp_path)
  resumed = _train(tmp_path, *EXACT, *CHECKPOINTS,
                   f"--train_steps={TOTAL_STEPS}")
  example_runs.assert_resumed(resumed, middle, TOTAL_STEPS,
                              whole["weights_digest"])


def test_plan_drives_the_pipeline_run(tmp_path):
  plan_dir = tmp_path / "plan"
  plan_profile = example_runs.plan("torch_parity", NAME, plan_dir,
                                   *PIPELINE_JOB, *PROFILE_ONCE,
                                   timeout_s=TIMEOUT_S)
  record = _train(tmp_path / "run", *PIPELINE_JOB, "--pipeline_split=auto",
                  plan_profile, "--train_steps=2", "--evaluate=false")
  example_runs.assert_split_as_planned(record, NAME, plan_dir)


def test_readme_runs_this_example():
  example_runs.assert_readme_runs_the_example(
      NAME, "torch_parity.train", "overlap_compare", "torch_parity.plan")
