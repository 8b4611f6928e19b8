"""examples/keras_mobilenet: keras.applications' MobileNetV2 on the user's
tf.data function, trained by a real trainer process at a tiny size, and
its functional graph read by the planner."""

import math

import pytest

from tests.examples import example_runs
from tests.helpers import run_module

NAME = "keras_mobilenet"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Two steps at the smallest image MobileNetV2 takes. Plain SGD: most of
  the run is tracing the first step, and Adam's slots and update ops for
  every one of the model's 158 weights add a quarter to it."""
  model_dir = tmp_path_factory.mktemp(NAME)
  result = run_module(
      "tfoverlap.train", *example_runs.example_flags(NAME), "--image_size=32",
      "--batch_size=4", "--train_steps=2", "--strategy=default",
      "--optimizer=sgd", "--evaluate=false", *example_runs.QUIET,
      f"--model_dir={model_dir}")
  assert result.returncode == 0, result.stderr[-4000:]
  return example_runs.record_of(model_dir)


def test_trains_from_its_import_paths(trained):
  example_runs.assert_sources(trained, NAME)
  assert trained["steps"] == 2
  assert math.isfinite(trained["final"]["train_loss"])
  assert trained["model"]["num_params"] > 100_000  # MobileNetV2, not a toy


def test_the_planner_can_cut_it_between_blocks():
  from examples.keras_mobilenet import data, model  # pylint: disable=g-import-not-at-top
  from tfoverlap.planning.graph import build_layer_graph  # pylint: disable=g-import-not-at-top
  net = model.build(image_size=32, num_classes=10)
  graph = build_layer_graph(net, batch_size=2, name=NAME)
  cuts = graph.cut_points()
  # Cuts between blocks, none inside a block with a skip connection.
  assert 10 <= len(cuts) < len(graph.nodes) - 1
  images, labels = next(iter(data.load("train", 32, 10).batch(10)))
  assert images.shape == (10, 32, 32, 3)
  assert labels.numpy().tolist() == list(range(10))
  assert net(images).shape == (10, 10)


def test_readme_runs_this_example():
  example_runs.assert_readme_runs_the_example(
      NAME, "tfoverlap.train", "overlap_compare", "tfoverlap.plan")
