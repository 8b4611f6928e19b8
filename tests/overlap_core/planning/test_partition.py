"""The partitioner: the DP equals brute force; even and explicit splits."""

import itertools
import random

import pytest

from overlap_core.planning.graph import MODEL_INPUT, LayerGraph, LayerNode
from overlap_core.planning.partition import (bubble_fraction, evaluate_cuts,
                                             partition)


def random_graph(rng: random.Random, num_nodes: int) -> LayerGraph:
  """A chain where some nodes also read an earlier node (skips): fewer cuts."""
  nodes = []
  for i in range(num_nodes):
    inputs = [nodes[-1].name if nodes else MODEL_INPUT]
    if i >= 2 and rng.random() < 0.3:
      inputs.append(nodes[rng.randrange(0, i - 1)].name)
    nodes.append(LayerNode(
        name=f"n{i}", op_type="conv2d", config={}, inputs=tuple(inputs),
        output_shape=(4,), param_bytes=rng.randrange(0, 1000),
        activation_bytes=rng.randrange(1, 5000)))
  return LayerGraph(name="rand", batch_size=4, input_shape=(4,),
                    input_bytes=100, nodes=tuple(nodes))


@pytest.mark.parametrize("seed", range(40))
def test_auto_split_equals_brute_force(seed):
  rng = random.Random(seed)
  g = random_graph(rng, rng.randrange(3, 10))
  times = {n.name: rng.uniform(0.1, 5.0) for n in g.nodes}
  points = g.cut_points()
  bandwidth = rng.choice([None, 1e3, 1e4])
  replicas = rng.choice([1, 2])
  updates = rng.choice([None, {n.name: rng.uniform(0.0, 8.0)
                               for n in g.nodes}])
  for num_stages in range(1, len(points) + 2):
    kwargs = dict(batch_size=2, bandwidth_bytes_per_s=bandwidth,
                  replicas=replicas, update_s=updates,
                  num_microbatches=rng.choice([1, 2, 4]),
                  gradient_sum_s_per_byte=rng.choice([0.0, 1e-3]))
    plan = partition(g, times, num_stages=num_stages, **kwargs)
    brute = min(evaluate_cuts(g, times, cuts, **kwargs).bottleneck_s
                for cuts in itertools.combinations(points, num_stages - 1))
    # Both sides sum the same floats in the same order: exact up to the
    # last bit of the prefix-sum difference, hence the 1e-12 relative slack.
    assert plan.bottleneck_s == pytest.approx(brute, rel=1e-12)
    assert len(plan.stages) == num_stages
    assert sum(len(s.layers) for s in plan.stages) == len(g.nodes)


def _chain(num_layers, *, weight_bytes=None, activation_bytes=None,
           batch_size=1):
  """A chain l0 -> l1 -> ... and its times, 1 s per layer.

  Args:
    num_layers: how many layers.
    weight_bytes, activation_bytes: each layer's, 0 where not given.
    batch_size: the batch the graph was traced at.
  """
  zeros = (0,) * num_layers
  nodes = tuple(
      LayerNode(f"l{i}", "linear", {}, (f"l{i-1}" if i else MODEL_INPUT,),
                (1,), (weight_bytes or zeros)[i],
                (activation_bytes or zeros)[i]) for i in range(num_layers))
  return (LayerGraph("chain", batch_size, (batch_size,), 0, nodes),
          {n.name: 1.0 for n in nodes})


def test_auto_beats_even_on_a_lopsided_chain():
  g, times = _chain(6)
  times["l0"] = 9.0
  auto = partition(g, times, num_stages=2, batch_size=1)
  even = partition(g, times, num_stages=2, batch_size=1, mode="even")
  assert auto.cuts == ("l0",) and auto.bottleneck_s == 9.0
  assert even.cuts == ("l2",) and even.bottleneck_s == 11.0
  assert "busiest/mean" in auto.table(num_microbatches=4)


def test_a_heavy_update_moves_the_cut_away_from_the_classifier():
  # Four equal layers per micro-batch; the last (a classifier) updates
  # slowly. Per micro-batch the middle cut balances, but per step of 2
  # micro-batches stage 1 would be 2 x 2 + 6 = 10 against 4: the update
  # pushes the cut late, so the classifier's stage holds only itself.
  g, times = _chain(4)
  updates = {"l0": 0.0, "l1": 0.0, "l2": 0.0, "l3": 6.0}
  blind = partition(g, times, num_stages=2, batch_size=1, num_microbatches=2)
  seen = partition(g, times, num_stages=2, batch_size=1, num_microbatches=2,
                   update_s=updates)
  assert blind.cuts == ("l1",)
  assert seen.cuts == ("l2",) and seen.bottleneck_s == pytest.approx(8.0)
  assert [s.update_s for s in seen.stages] == [0.0, 6.0]
  # GPipe: 2 + 2 - 1 slots of the slowest micro-batch (3.0), then the
  # slowest update.
  assert seen.predicted_step_s(2) == pytest.approx(3 * 3.0 + 6.0)
  with pytest.raises(ValueError, match="num_microbatches"):
    partition(g, times, num_stages=2, batch_size=1, num_microbatches=0)


def test_every_micro_batch_after_the_first_pays_a_gradient_sum():
  # Equal layers; l3's weights are 3 bytes at 1 s per byte, so each of its
  # stage's M - 1 gradient sums costs 3 s. Per micro-batch the middle cut
  # balances, but per step of 3 micro-batches stage 1 would be 3 x 2 +
  # 2 x 3 = 12 against 6: the sums push the cut late.
  g, times = _chain(4, weight_bytes=(0, 0, 0, 3))
  seen = partition(g, times, num_stages=2, batch_size=1, num_microbatches=3,
                   gradient_sum_s_per_byte=1.0)
  assert seen.cuts == ("l2",)
  assert [s.gradient_sum_s for s in seen.stages] == [0.0, 3.0]
  assert [s.step_s(3) for s in seen.stages] == [9.0, 3.0 + 2 * 3.0]
  # One micro-batch has nothing to add: the sums cost nothing.
  single = partition(g, times, num_stages=2, batch_size=1,
                     gradient_sum_s_per_byte=1.0)
  assert single.cuts == ("l1",) and single.bottleneck_s == 2.0
  assert "sum ms" in seen.table(num_microbatches=3)


def test_a_stage_with_weights_pays_one_optimizer_call():
  # l1 and l2 hold weights, l0 and l3 none: a call's fixed cost comes once
  # per stage that has any, however many weighted layers it holds.
  g, times = _chain(4, weight_bytes=(0, 8, 8, 0))
  shares = {"l0": 0.0, "l1": 0.5, "l2": 0.25, "l3": 0.0}
  together = evaluate_cuts(g, times, [0], batch_size=1, update_s=shares,
                           update_call_s=0.125)
  assert [s.update_s for s in together.stages] == [0.0, 0.875]
  apart = evaluate_cuts(g, times, [1], batch_size=1, update_s=shares,
                        update_call_s=0.125)
  assert [s.update_s for s in apart.stages] == [0.625, 0.375]


def test_transfer_is_charged_at_the_cut():
  g, times = _chain(4, activation_bytes=(8000, 10, 10, 10), batch_size=2)
  # Activations are for batch 2; at micro-batch 1 they halve: 4000 bytes
  # forward and back at 1000 B/s is 8 s, so the cut avoids l0.
  plan = partition(g, times, num_stages=2, batch_size=1,
                   bandwidth_bytes_per_s=1000.0)
  assert plan.cuts == ("l1",)
  assert plan.stages[0].transfer_s == pytest.approx(2 * 5 / 1000)


def test_explicit_and_bad_splits_say_why():
  # stem -> conv_a -> conv_b -> add(conv_b, stem) -> head: one residual block.
  inputs = {"stem": [MODEL_INPUT], "conv_a": ["stem"], "conv_b": ["conv_a"],
            "add": ["conv_b", "stem"], "head": ["add"]}
  g = LayerGraph("toy", 2, (2,), 8, tuple(
      LayerNode(name, "conv2d", {}, tuple(src), (2,), 4, 8)
      for name, src in inputs.items()))
  times = {n.name: 1.0 for n in g.nodes}
  plan = partition(g, times, num_stages=2, batch_size=2, mode="explicit",
                   cut_layers=["add"])
  assert plan.stages[0].layers == ("stem", "conv_a", "conv_b", "add")
  with pytest.raises(ValueError, match=r"layer 'conv_a' is not a cut point "
                     r"\(2 tensors cross after it"):
    partition(g, times, num_stages=2, batch_size=2, mode="explicit",
              cut_layers=["conv_a"])
  with pytest.raises(ValueError, match="has 2 cut points, so 1 to 3 stages"):
    partition(g, times, num_stages=4, batch_size=2)
  with pytest.raises(ValueError, match="no layer 'nope'"):
    partition(g, times, num_stages=2, batch_size=2, mode="explicit",
              cut_layers=["nope"])


def test_bubble_fraction():
  assert bubble_fraction(1, 8) == 0.0
  assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
  with pytest.raises(ValueError):
    bubble_fraction(0, 4)
