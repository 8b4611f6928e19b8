"""The neutral layer graph: cut points, JSON round-trip, DOT; the profile."""

import pytest

from overlap_core.planning.graph import (MODEL_INPUT, LayerGraph, LayerNode,
                                         chain, neutral_layer_name)
from overlap_core.planning.profile import LayerTiming, Profile, UpdateTiming


def _node(name, inputs, op_type="conv2d"):
  return LayerNode(name=name, op_type=op_type, config={"in_channels": 3},
                   inputs=tuple(inputs), output_shape=(2, 3), param_bytes=12,
                   activation_bytes=24)


def residual_graph() -> LayerGraph:
  """stem -> [conv_a -> conv_b, skip] -> add -> head: one residual block."""
  nodes = (_node("stem", [MODEL_INPUT]), _node("conv_a", ["stem"]),
           _node("conv_b", ["conv_a"]), _node("add", ["conv_b", "stem"], "add"),
           _node("head", ["add"], "linear"))
  return LayerGraph(name="toy", batch_size=2, input_shape=(2, 3),
                    input_bytes=24, nodes=nodes)


def test_cuts_fall_only_between_blocks():
  g = residual_graph()
  # After conv_a and conv_b both the skip (stem) and the main path cross.
  assert g.crossing_tensors(1) == ("conv_a", "stem")
  assert g.cut_points() == (0, 3)
  assert g.segments() == ((0, 1), (1, 4), (4, 5))


def test_a_chain_cuts_after_every_layer_but_the_last():
  g = chain("c", [(f"l{i}", "linear", {}) for i in range(4)])
  assert g.cut_points() == (0, 1, 2)


def test_the_model_input_read_late_blocks_a_cut():
  nodes = (_node("a", [MODEL_INPUT]), _node("b", ["a", MODEL_INPUT], "add"))
  g = LayerGraph(name="t", batch_size=2, input_shape=(2, 3), input_bytes=24,
                 nodes=nodes)
  assert g.cut_points() == ()


def test_nodes_out_of_topological_order_are_refused():
  with pytest.raises(ValueError, match="topological order"):
    LayerGraph(name="t", batch_size=1, input_shape=(1,), input_bytes=0,
               nodes=(_node("b", ["a"]), _node("a", [MODEL_INPUT])))


def test_graph_json_round_trip_and_schema_version():
  g = residual_graph()
  assert LayerGraph.from_json(g.to_json()) == g
  d = g.to_dict()
  d["schema_version"] = 99
  with pytest.raises(ValueError, match="schema_version=99"):
    LayerGraph.from_dict(d)


def test_summary_and_dot_mark_the_cuts():
  g = residual_graph()
  assert "--- cut 0 ---" in g.summary() and "--- cut 3 ---" in g.summary()
  assert "--- cut 1 ---" not in g.summary()
  dot = g.to_dot()
  assert dot.startswith('digraph "toy"')
  assert '"stem" -> "add";' in dot
  assert '"add" [label="add\\nadd [2, 3]", shape=box, style=bold];' in dot


def test_profile_json_round_trip_and_lookup():
  p = Profile(model="toy", framework="test", device="cpu", warmup=1,
              repeats=3, date="2026-01-01T00:00:00+00:00",
              timings=(LayerTiming("stem", "conv2d", 4, 1e-3, 2e-3),
                       LayerTiming("stem", "conv2d", 8, 2e-3, 4e-3, 1e-4)))
  assert Profile.from_json(p.to_json()) == p
  assert p.batch_sizes == (4, 8)
  assert p.time_s("stem", 8) == pytest.approx(6e-3)
  with pytest.raises(KeyError, match="profiled batches: \\(4, 8\\)"):
    p.time_s("stem", 16)
  assert "stem" in p.summary()


def test_profile_carries_its_optimizer_updates_and_reads_version_1():
  timings = (LayerTiming("stem", "conv2d", 4, 1e-3, 2e-3),)
  p = Profile(model="toy", framework="test", device="cpu", warmup=1,
              repeats=3, timings=timings, optimizer="adam", threads=1,
              update_call_s=7e-4,
              updates=(UpdateTiming("stem", 4096, 5e-4, 1e-5),))
  assert Profile.from_json(p.to_json()) == p
  assert p.update_s("stem") == 5e-4 and p.update_s("head") is None
  assert "adam update per layer" in p.summary()
  assert "on cpu, 1 intra-op thread (" in p.summary()
  old = p.to_dict()
  del old["optimizer"], old["updates"], old["threads"], old["update_call_s"]
  old["schema_version"] = 1
  read = Profile.from_dict(old)
  assert read.updates == () and read.optimizer == "" and read.threads == 0
  with pytest.raises(ValueError, match="allowed: 1, 2"):
    Profile.from_dict({**old, "schema_version": 3})


def test_both_frameworks_spellings_have_one_neutral_name():
  assert (neutral_layer_name("features.0")
          == neutral_layer_name("features_0") == "features_0")
  g = chain("m", [("layer1.0.conv1", "conv2d", {}),
                            ("fc", "linear", {})])
  assert g.neutral_names() == {"layer1.0.conv1": "layer1_0_conv1",
                               "fc": "fc"}


def test_two_layers_with_one_neutral_name_are_refused():
  g = chain("m", [("a.b", "linear", {}), ("a_b", "linear", {})])
  with pytest.raises(ValueError, match="'a.b' and 'a_b' both go by the "
                     "neutral name 'a_b'"):
    g.neutral_names()
