"""What the tests of examples/ share: each example's import paths, the
commands its README shows, a run's record, a resume from a run's
checkpoint, and a run split by the plan command's profile."""

import os
import shutil

from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.runtime import run_record

from tests.helpers import REPO_ROOT, run_module

# Flags that keep a trainer process quiet and small in every example test.
QUIET = ("--trace=false", "--tensorboard=false", "--log_every_steps=10")


def example_flags(name: str) -> tuple:
  """--model and --dataset naming examples/<name>'s own code."""
  return (f"--model=examples.{name}.model:build",
          f"--dataset=examples.{name}.data:load")


def readme(name: str) -> str:
  with open(os.path.join(REPO_ROOT, "examples", name, "README.md"),
            encoding="utf-8") as f:
    return f.read()


def record_of(model_dir) -> dict:
  return run_record.load_run_record(str(model_dir))


def assert_sources(record: dict, name: str) -> None:
  """run.json names the example's model and data as their import paths."""
  model, dataset = (f.split("=", 1)[1] for f in example_flags(name))
  assert record["model"]["source"] == {"source": "import", "value": model}
  assert record["data"]["source"] == {"source": "import", "value": dataset}


def assert_readme_runs_the_example(name: str, *modules: str) -> None:
  """The README's commands name the example's code and each command."""
  text = readme(name)
  for flag in example_flags(name):
    assert flag in text, (name, flag)
  for module in modules:
    assert f"python -m {module} " in text, (name, module)
  assert "--pipeline_split=auto" in text and "--plan_profile=" in text


def stop_after(checkpoints_dir, step: int, model_dir) -> None:
  """Leaves `model_dir` as a run stopped after `step` would: the
  checkpoint of that step (copied from a whole run's `checkpoints_dir`) and
  nothing later."""
  name = checkpoint_files.checkpoint_dir_name(step)
  shutil.copytree(os.path.join(checkpoints_dir, name),
                  os.path.join(model_dir, "checkpoints", name))


def assert_resumed(record: dict, step: int, total_steps: int,
                   weights_digest: str) -> None:
  """A run resumed from the checkpoint of `step` trained the steps after
  it and ended with the whole run's weights."""
  assert record["checkpoint"]["restore"]["step"] == step
  assert record["steps"] == total_steps - step  # after the restored batch
  assert record["weights_digest"] == weights_digest


def plan(package: str, name: str, plan_dir, *args: str,
         timeout_s: float) -> str:
  """Plans examples/<name>'s job (`args`) with `python -m <package>.plan`
  into `plan_dir`.

  Returns:
    The --plan_profile flag that hands the plan's profile to a trainer.
  """
  planned = run_module(f"{package}.plan", *example_flags(name), *args,
                       f"--plan_output_dir={plan_dir}", timeout=timeout_s)
  assert planned.returncode == 0, planned.stderr[-4000:]
  return f"--plan_profile={os.path.join(plan_dir, 'profile.json')}"


def assert_split_as_planned(record: dict, name: str, plan_dir) -> str:
  """A run of examples/<name> with --pipeline_split=auto and the profile
  planned in `plan_dir`: cut where the plan says, each stage's time
  predicted.

  Returns:
    The layer it was cut after.
  """
  assert_sources(record, name)
  section = record["pipeline"]
  assert section["split"] == "auto"
  [cut] = section["cut_layers"]
  with open(os.path.join(plan_dir, "plan.txt"), encoding="utf-8") as f:
    assert f"cuts after: {cut}" in f.read()
  assert all(row["predicted_ms"] > 0 for row in section["per_stage"])
  return cut
