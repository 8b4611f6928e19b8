"""examples/keras_regression: a functional Keras model with a regression
Task, compared over two overlaps by overlap_compare (whose report names
the model), stopped and resumed to the bits of an uninterrupted run,
planned by tfoverlap.plan and run on that plan."""

import pytest

from overlap_core.checkpoint import files as checkpoint_files

from tests.examples import example_runs
from tests.helpers import run_module

NAME = "keras_regression"
# Two pipeline stages of 2 micro-batches of 8, as small as it gets.
PIPELINE_JOB = ("--batch_size=16", "--strategy=mirrored", "--num_devices=2",
                "--pipeline_stages=2", "--pipeline_microbatches=2")
TIMEOUT_S = 600
# The claims need a profile the planner measured, not good times: each
# layer is timed once, cold, at the one micro-batch the stages run.
PROFILE_ONCE = ("--plan_batch_sizes=8", "--plan_warmup=0", "--plan_repeats=1")
# Deterministic ops on one thread, one replica: runs are bit-identical, so
# the comparison's cells are uninterrupted runs a resumed one must match
# (as the trainer's own resume tests do on the zoo).
EXACT = ("--strategy=default", "--deterministic", "--intra_op_threads=1",
         "--inter_op_threads=1")
TOTAL_STEPS = 4
JOB = ("--batch_size=16", *EXACT, "--checkpoint_every=2", *example_runs.QUIET)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
  """The README's comparison, at a tiny size: 2 cells, one repeat."""
  out = tmp_path_factory.mktemp(NAME) / "compare"
  result = run_module(
      "overlap_compare", "--matrix=checkpoint=sync,async",
      "--frameworks=tensorflow", "--repeats=1", f"--output_dir={out}", "--",
      *example_runs.example_flags(NAME), *JOB,
      f"--train_steps={TOTAL_STEPS}", timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-4000:]
  return out


def test_comparison_runs_both_cells_on_the_users_model(compared):
  runs = sorted(compared.rglob("run.json"))
  assert len(runs) == 2, runs
  modes = set()
  for path in runs:
    record = example_runs.record_of(path.parent)
    example_runs.assert_sources(record, NAME)
    modes.add(record["flags"]["checkpoint"]["mode"])
    assert record["steps"] == TOTAL_STEPS
  assert modes == {"sync", "async"}
  report = (compared / "report.md").read_text(encoding="utf-8")
  assert "examples.keras_regression.model:build (import)" in report
  assert "examples.keras_regression.data:load (import)" in report
  assert "| checkpoint=async | 1/1 |" in report


def test_stopped_and_resumed_run_ends_bit_identical(tmp_path, compared):
  cells = {}
  for path in compared.rglob("run.json"):
    record = example_runs.record_of(path.parent)
    cells[record["flags"]["checkpoint"]["mode"]] = (path.parent, record)
  digests = {record["weights_digest"] for _, record in cells.values()}
  assert len(digests) == 1  # how a run checkpoints does not change it
  # The async cell as a stop after its first checkpoint leaves it: that
  # checkpoint and nothing later.
  async_dir = cells["async"][0] / "checkpoints"
  assert checkpoint_files.list_checkpoints(str(async_dir)) == [
      TOTAL_STEPS // 2, TOTAL_STEPS]
  example_runs.stop_after(async_dir, TOTAL_STEPS // 2, tmp_path)
  result = run_module(
      "tfoverlap.train", *example_runs.example_flags(NAME), *JOB,
      "--checkpoint=async", f"--train_steps={TOTAL_STEPS}",
      f"--model_dir={tmp_path}", timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-4000:]
  example_runs.assert_resumed(example_runs.record_of(tmp_path),
                              TOTAL_STEPS // 2, TOTAL_STEPS, digests.pop())


def test_plan_drives_the_pipeline_run(tmp_path):
  plan_dir = tmp_path / "plan"
  plan_profile = example_runs.plan("tfoverlap", NAME, plan_dir,
                                   *PIPELINE_JOB, *PROFILE_ONCE,
                                   timeout_s=TIMEOUT_S)
  result = run_module(
      "tfoverlap.train", *example_runs.example_flags(NAME), *PIPELINE_JOB,
      "--pipeline_split=auto", plan_profile, "--train_steps=2",
      *example_runs.QUIET, f"--model_dir={tmp_path / 'run'}",
      timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-4000:]
  record = example_runs.record_of(tmp_path / "run")
  cut = example_runs.assert_split_as_planned(record, NAME, plan_dir)
  assert cut in ("hidden_1", "hidden_2", "hidden_3")
  # The Task is regression: evaluated by mean absolute error, not accuracy.
  assert record["final"]["eval_mean_abs_error"] > 0
  assert "eval_accuracy" not in record["final"]


def test_readme_runs_this_example():
  example_runs.assert_readme_runs_the_example(
      NAME, "tfoverlap.train", "overlap_compare", "tfoverlap.plan")
