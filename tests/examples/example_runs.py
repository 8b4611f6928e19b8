"""What the tests of examples/ share: each example's import paths, the
commands its README shows, and a run's record."""

import os

from overlap_core.runtime import run_record

from tests.helpers import REPO_ROOT

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
