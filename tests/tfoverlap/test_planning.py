"""TensorFlow planning side: Keras layer graphs of the zoo, the profiler, the
plan command end to end (the mirror of tests/torch_parity/test_planning.py)."""

import json
import os

import keras
import numpy as np

from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile
from tfoverlap.models import build_model, num_params
from tfoverlap.planning.graph import build_layer_graph, build_zoo_graph
from tfoverlap.planning.profiler import profile_layers

from tests.helpers import run_module


def _block_ranges(graph, prefix):
  """[first, last] node index of every block: "layer1_0", "Mixed_5b"."""
  ranges = {}
  for i, node in enumerate(graph.nodes):
    if node.name.startswith(prefix):
      block = "_".join(node.name.split("_")[:2])
      first, _ = ranges.get(block, (i, i))
      ranges[block] = (first, i)
  return ranges


def test_resnet18_cuts_only_between_blocks():
  g = build_zoo_graph("resnet18", image_size=32, batch_size=2)
  cuts = set(g.cut_points())
  blocks = _block_ranges(g, "layer")
  assert len(blocks) == 8  # 4 stages x 2 basic blocks, as on the torch side
  for block, (first, last) in blocks.items():
    inside = {i for i in cuts if first <= i < last}
    # As in torch: inside a block the skip tensor crosses every boundary
    # but the one between the residual add and the ReLU after it.
    assert inside == {last - 1}, (block, [g.nodes[i].name for i in inside])
    assert g.nodes[last - 1].op_type == "add"
    assert last in cuts or last == len(g.nodes) - 1
  model = build_model("resnet18", image_size=32, num_classes=10)
  assert g.param_bytes == 4 * num_params(model)
  assert LayerGraph.from_json(g.to_json()) == g


def test_inception_blocks_have_no_inner_cuts():
  g = build_zoo_graph("inception_v3", image_size=75, batch_size=1)
  cuts = set(g.cut_points())
  blocks = _block_ranges(g, "Mixed_")
  assert len(blocks) == 11
  for block, (first, last) in blocks.items():
    assert not {i for i in cuts if first <= i < last}, block
    assert g.nodes[last].op_type == "concatenate" and last in cuts


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
  out = str(tmp_path / "plan")
  result = run_module(
      "tfoverlap.plan", "--model=small_cnn", "--image_size=16",
      "--batch_size=16", "--strategy=mirrored", "--num_devices=2",
      "--pipeline_stages=2",
      "--pipeline_microbatches=2", "--plan_warmup=0", "--plan_repeats=1",
      "--plan_batch_sizes=4,8", f"--plan_output_dir={out}", timeout=300)
  assert result.returncode == 0, result.stderr
  for needle in ("Layer graph small_cnn", "Profile of small_cnn",
                 "Cost model", "Split (auto, 2 stages", "Baseline: Split "
                 "(even", "GPipe bubble 33.3%"):
    assert needle in result.stdout
  with open(os.path.join(out, "profile.json"), encoding="utf-8") as f:
    profile = json.load(f)
  assert profile["schema_version"] == 2
  assert profile["optimizer"] == "adam" and len(profile["updates"]) == 6
  assert all(u["update_s"] > 0 for u in profile["updates"])
  assert 0 < profile["update_call_s"]
  assert "optimizer update (adam, once per step)" in result.stdout
  assert profile["framework"].startswith("tensorflow")
  assert os.path.exists(os.path.join(out, "graph.dot"))


def test_plan_command_refuses_an_impossible_split_in_one_line():
  for args, needle in (
      (["--pipeline_stages=16"], "has 9 cut points, so 1 to 10 stages"),
      (["--pipeline_stages=2", "--pipeline_split=conv9"], "no layer 'conv9'"),
      (["--pipeline_stages=2", "--plan_batch_sizes=0"],
       "--plan_batch_sizes=0: allowed: positive integers")):
    result = run_module("tfoverlap.plan", "--model=small_cnn",
                        "--image_size=16", "--batch_size=16",
                        "--strategy=mirrored", "--num_devices=2", *args,
                        timeout=300)
    assert result.returncode == 2, result.stderr
    errors = [l for l in result.stderr.splitlines() if ": error: " in l]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    assert "Traceback" not in result.stderr
