"""TensorFlow planning side: Keras layer graphs of the zoo, the profiler, the
plan command end to end (the mirror of tests/torch_parity/test_planning.py)."""

import keras
import numpy as np

from overlap_core.planning.profile import Profile
from tfoverlap.models import build_model, num_params
from tfoverlap.planning.graph import build_layer_graph, build_zoo_graph
from tfoverlap.planning.profiler import profile_layers

from tests import planning_checks


def _block_of(prefix):
  """A node's block ("layer1_0", "Mixed_5b") when its name starts `prefix`:
  Keras names a block's layers "layer1_0_conv1"."""
  return lambda name: ("_".join(name.split("_")[:2])
                       if name.startswith(prefix) else None)


def test_resnet18_cuts_only_between_blocks():
  g = build_zoo_graph("resnet18", image_size=32, batch_size=2)
  planning_checks.check_resnet18_cuts_only_between_blocks(
      g, _block_of("layer"),
      num_params(build_model("resnet18", image_size=32, num_classes=10)))


def test_inception_blocks_have_no_inner_cuts():
  g = build_zoo_graph("inception_v3", image_size=75, batch_size=1)
  planning_checks.check_inception_blocks_have_no_inner_cuts(
      g, _block_of("Mixed_"), "concatenate")


def test_a_plain_chain_cuts_after_every_layer():
  g = build_zoo_graph("vgg16", image_size=32, batch_size=2)
  assert g.cut_points() == tuple(range(len(g.nodes) - 1))
  # Keras fuses each ReLU into its Conv2D: 13 convolutions, 5 poolings,
  # flatten, 3 dense, 2 dropouts and the float32 cast.
  assert len(g.nodes) == 25
  assert g.nodes[0].output_shape == (2, 32, 32, 64)


def test_users_own_model_and_its_profile():
  inputs = keras.Input((8,))
  x = keras.layers.Dense(16, name="fc1")(inputs)
  x = keras.layers.BatchNormalization(name="bn")(x)
  outputs = keras.layers.Dense(4, name="fc2")(keras.layers.ReLU(name="act")(x))
  model = keras.Model(inputs, outputs, name="mine")
  graph = build_layer_graph(model, batch_size=3)
  assert [n.name for n in graph.nodes] == ["fc1", "bn", "act", "fc2"]
  assert graph.nodes[0].param_bytes == 4 * (8 * 16 + 16)
  assert graph.nodes[0].activation_bytes == 4 * 3 * 16
  assert graph.nodes[3].config["flops_per_sample"] == 2 * 16 * 4
  assert graph.nodes[3].inputs == ("act",)
  before = [w.numpy() for w in model.weights]
  profile = profile_layers(model, batch_sizes=(2, 4), warmup=0, repeats=2,
                           name="mine")
  assert profile.batch_sizes == (2, 4)
  assert {t.layer for t in profile.timings} == {"fc1", "bn", "act", "fc2"}
  assert all(t.forward_s > 0 and t.backward_s >= 0 for t in profile.timings)
  # Summing the model's gradients took time: no optimizer is needed for it.
  assert profile.gradient_sum_s_per_byte > 0 and not profile.updates
  assert Profile.from_json(profile.to_json()) == profile
  # Timing ran BatchNorm in training mode; its statistics are put back.
  for old, new in zip(before, model.weights):
    np.testing.assert_array_equal(old, new.numpy())


def test_plan_command_end_to_end(tmp_path):
  profile = planning_checks.run_plan_command("tfoverlap",
                                             str(tmp_path / "plan"))
  assert profile["framework"].startswith("tensorflow")


def test_plan_command_refuses_an_impossible_split_in_one_line():
  planning_checks.check_plan_refusals("tfoverlap", [
      (["--pipeline_stages=16"], "has 9 cut points, so 1 to 10 stages"),
      (["--pipeline_stages=2", "--pipeline_split=conv9"], "no layer 'conv9'"),
      (["--pipeline_stages=2", "--plan_batch_sizes=0"],
       "--plan_batch_sizes=0: allowed: positive integers")])
