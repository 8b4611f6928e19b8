"""Plans that python -m torch_parity.burst_plan wrote run in the TensorFlow
trainer, for the chain models of the zoo; plans that do not fit are refused
in one line."""

import json

import pytest

from overlap_core.runtime import run_record

from tests.burst_plans import plan_with_command
from tests.helpers import run_module

# (model, image_size, global batch): the smallest each model takes.
RUNS = {"small_cnn": (8, 8), "vgg16": (32, 4)}
# The first and last layers with weights, named as Keras names them.
ENDS = {"small_cnn": {"conv1_1", "fc2"},
        "vgg16": {"features_0", "classifier_6"}}
TRAIN = ("--dataset=digits", "--train_steps=2", "--evaluate=false",
         "--tensorboard=false", "--trace=false", "--prefetch=1",
         "--intra_op_threads=1", "--strategy=mirrored", "--num_devices=2")
TRAIN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
  """One plan per model, from the command, shared by this module's tests."""
  root = tmp_path_factory.mktemp("plans")
  return {model: plan_with_command(root / model, model=model,
                                   image_size=size, batch_size=batch)
          for model, (size, batch) in RUNS.items()}


def _train(model, plan_path, model_dir, *extra):
  size, batch = RUNS.get(model, RUNS["small_cnn"])
  return run_module("tfoverlap.train", f"--model={model}",
                    f"--image_size={size}", f"--batch_size={batch}",
                    *TRAIN, f"--burst_parallel={plan_path}",
                    f"--model_dir={model_dir}", *extra,
                    timeout=TRAIN_TIMEOUT_S)


def _one_error_line(result, needle):
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if ": error: " in l]
  assert len(errors) == 1 and needle in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("model", sorted(RUNS))
def test_a_plan_from_the_command_trains_in_tensorflow(plans, model,
                                                      tmp_path):
  result = _train(model, plans[model], tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  section = run_record.load_run_record(str(tmp_path))["strategy"]["burst"]
  widths, placements = section["widths_run"], section["placements_run"]
  # Every Keras layer that computes ran as the plan said, forward and
  # backward: part j of a layer of width k on device j, k parts (Dropout's
  # random state sits on device 0 and may add it to a part; the layer's own
  # work is on j). These models' first layer has weights, so every layer
  # has a backward.
  assert ENDS[model] <= set(placements), placements
  for layer, directions in placements.items():
    for direction, parts in directions.items():
      assert len(parts) == widths[layer], (layer, direction, parts)
      for j, devices in enumerate(parts):
        assert f"CPU:{j}" in devices, (layer, direction, parts)


def test_a_plan_for_another_model_is_refused(plans, tmp_path):
  _one_error_line(_train("mlp", plans["small_cnn"], tmp_path),
                  "the plan is for model 'small_cnn', not --model=mlp")


def test_a_plan_naming_a_layer_the_model_lacks_is_refused(plans, tmp_path):
  # The command's plan with one layer renamed: what a plan from another
  # version of the model looks like to the trainer.
  plan = json.loads(plans["small_cnn"].read_text())
  renamed = next(lp for lp in plan["layers"] if lp["layer"] == "fc1")
  renamed["layer"] = "fc9"
  path = tmp_path / "renamed.json"
  path.write_text(json.dumps(plan))
  _one_error_line(_train("small_cnn", path, tmp_path / "run"),
                  "the plan names layer 'fc9' (linear), which model "
                  "'small_cnn' lacks")
