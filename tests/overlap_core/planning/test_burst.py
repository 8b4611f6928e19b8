"""The burst planner against brute force, its limit, and the profile adapter."""

import itertools
import json
import random

import pytest

from overlap_core.planning import burst, burst_costs, profile_formats
from overlap_core.planning.burst_costs import CommModel, LayerTimes
from overlap_core.planning.graph import MODEL_INPUT, LayerGraph, LayerNode
from overlap_core.planning.profile import LayerTiming, Profile

BATCH = 16
DEVICES = 4


def _graph(name, spec):
  """spec: (layer, op_type, inputs, param_bytes, activation_bytes)."""
  nodes = tuple(
      LayerNode(name=layer, op_type=op, config={}, inputs=tuple(inputs),
                output_shape=(BATCH,), param_bytes=params,
                activation_bytes=act)
      for layer, op, inputs, params, act in spec)
  return LayerGraph(name=name, batch_size=BATCH, input_shape=(BATCH,),
                    input_bytes=0, nodes=nodes)


def _profile(graph, seed, batches=(1, 2, 4, 8, 16), costs=None):
  """t(b) = fixed + per_sample x b: fixed costs are what stop scaling.

  `costs`: (fixed_s, per_sample_s) per layer; random from `seed` if None.
  """
  rng = random.Random(seed)
  timings = []
  for i, node in enumerate(graph.nodes):
    fixed_s = rng.uniform(0.0, 2e-3)
    per_sample_s = rng.uniform(0.0, 1e-3)
    if costs is not None:
      fixed_s, per_sample_s = costs[i]
    for b in batches:
      total = fixed_s + per_sample_s * b
      timings.append(LayerTiming(node.name, node.op_type, b, total / 3,
                                 2 * total / 3))
  return Profile(model=graph.name, framework="synthetic", device="none",
                 warmup=0, repeats=1, timings=tuple(timings))


CHAIN = [("conv1", "conv2d", [MODEL_INPUT], 40_000, 64_000),
         ("relu1", "relu", ["conv1"], 0, 64_000),
         ("conv2", "conv2d", ["relu1"], 900_000, 32_000),
         ("pool", "maxpool2d", ["conv2"], 0, 8_000),
         ("fc1", "linear", ["pool"], 4_000_000, 1_000),
         ("fc2", "linear", ["fc1"], 40_000, 100)]
# A ResNet block (a skip beside two layers) and then an Inception-like
# fork into three branches joined by a concatenation.
BRANCHED = [("stem", "conv2d", [MODEL_INPUT], 10_000, 64_000),
            ("b1", "conv2d", ["stem"], 300_000, 64_000),
            ("b2", "conv2d", ["b1"], 300_000, 64_000),
            ("add", "add", ["stem", "b2"], 0, 64_000),
            ("br1", "conv2d", ["add"], 100_000, 16_000),
            ("br2a", "conv2d", ["add"], 50_000, 16_000),
            ("br2b", "conv2d", ["br2a"], 200_000, 16_000),
            ("br3", "avgpool2d", ["add"], 0, 16_000),
            ("cat", "cat", ["br1", "br2b", "br3"], 0, 48_000),
            ("fc", "linear", ["cat"], 2_000_000, 100)]


def _brute_force(problem):
  """Every assignment of allowed widths, summed from the problem's own
  terms (tabulated first: the same numbers, fast enough to enumerate)."""
  layers = problem.layers
  node_s = {n: {k: problem.layer_s(n, k) for k in problem.widths}
            for n in layers}
  edges = [(u, v) for u, v in problem.edges if u != MODEL_INPUT]
  edge_s = {(u, v): {(a, b): problem.edge_s(u, v, a, b)
                     for a in problem.widths for b in problem.widths}
            for u, v in edges}
  best = float("inf")
  for combo in itertools.product(*[problem.allowed(n) for n in layers]):
    k = dict(zip(layers, combo))
    total = sum(node_s[n][k[n]] for n in layers) + sum(
        edge_s[(u, v)][(k[u], k[v])] for u, v in edges)
    best = min(best, total)
  return best


@pytest.mark.parametrize("spec", [CHAIN, BRANCHED], ids=["chain", "branched"])
@pytest.mark.parametrize("limit", [1.0, 1.5, 2.0, 5.0])
@pytest.mark.parametrize("bandwidth", [None, 2e9, 2e8])
@pytest.mark.parametrize("seed", [0, 1])
def test_plan_equals_brute_force(spec, limit, bandwidth, seed):
  graph = _graph("g", spec)
  problem = burst.BurstProblem(
      graph, LayerTimes(graph, _profile(graph, seed)), global_batch=BATCH,
      num_devices=DEVICES, amplification_limit=limit,
      comm=CommModel(bandwidth, latency_s=1e-5))
  plan = burst.describe(problem, burst.solve(problem))
  # Same terms summed in another order: equal up to float rounding
  # (about 1e-16 per addition, over a few dozen terms).
  assert plan.iteration_s == pytest.approx(_brute_force(problem), rel=1e-9)
  for lp in plan.layers:
    assert lp.amplification <= limit + 1e-9, lp
    assert sum(lp.samples_per_device) == BATCH
    assert len(lp.samples_per_device) == lp.num_devices


def test_the_limit_binds_and_the_plan_mixes_widths():
  graph = _graph("g", CHAIN)
  # Layers alternate: ideal scaling (no fixed cost), and a fixed cost that
  # makes width 2 amplify 2 x 1.08 / 1.16 = 1.86, above the 1.2 limit.
  profile = _profile(graph, 0, costs=[(0.0, 1e-5), (1e-3, 1e-5)] * 3)
  free = burst.plan_burst(graph, profile, global_batch=BATCH,
                          num_devices=DEVICES, amplification_limit=100.0)
  tight = burst.plan_burst(graph, profile, global_batch=BATCH,
                           num_devices=DEVICES, amplification_limit=1.2)
  # Without communication costs and with no bound, every layer goes wide.
  assert set(free.widths_by_layer().values()) == {DEVICES}
  assert len(set(tight.widths_by_layer().values())) > 1
  assert tight.iteration_s > free.iteration_s
  assert tight.gpu_s < free.gpu_s
  assert tight.amplification < free.amplification
  for lp in tight.layers:
    assert lp.amplification <= 1.2 + 1e-9


def test_communication_keeps_a_chain_on_one_width():
  graph = _graph("g", CHAIN)
  # 1 KB/s: any redistribution or all-reduce costs more than all compute.
  plan = burst.plan_burst(graph, _profile(graph, 0), global_batch=BATCH,
                          num_devices=DEVICES, amplification_limit=100.0,
                          comm=CommModel(bandwidth_bytes_per_s=1e3))
  assert set(plan.widths_by_layer().values()) == {1}


def test_plan_table_and_json():
  graph = _graph("g", BRANCHED)
  plan = burst.plan_burst(graph, _profile(graph, 0), global_batch=BATCH,
                          num_devices=DEVICES, amplification_limit=2.0,
                          comm=CommModel(bandwidth_bytes_per_s=1e9))
  assert burst.BurstPlan.from_json(plan.to_json()) == plan
  d = json.loads(plan.to_json())
  assert d["enforced"] == "per_layer"
  assert d["amplification"] == pytest.approx(plan.gpu_s / plan.single_device_s)
  table = plan.table()
  assert "enforced per layer" in table
  assert all(lp.layer in table for lp in plan.layers)


def test_a_graph_that_is_not_series_parallel_is_refused():
  bridge = [("a", "conv2d", [MODEL_INPUT], 0, 10),
            ("b", "conv2d", [MODEL_INPUT, "a"], 0, 10),
            ("c", "add", ["a", "b"], 0, 10),
            ("d", "add", ["b", "c"], 0, 10)]
  graph = _graph("bridge", bridge)
  with pytest.raises(ValueError, match="not series-parallel"):
    burst.plan_burst(graph, _profile(graph, 0), global_batch=BATCH,
                     num_devices=DEVICES, amplification_limit=2.0)


def test_missing_profile_and_bad_arguments_are_refused():
  graph = _graph("g", CHAIN)
  profile = _profile(graph, 0)
  partial = Profile(model="g", framework="x", device="x", warmup=0,
                    repeats=1, timings=tuple(
                        t for t in profile.timings if t.layer != "conv2"))
  with pytest.raises(KeyError, match="'conv2' has no profile"):
    burst.plan_burst(graph, partial, global_batch=BATCH, num_devices=2,
                     amplification_limit=2.0)
  with pytest.raises(ValueError, match="amplification_limit"):
    burst.plan_burst(graph, profile, global_batch=BATCH, num_devices=2,
                     amplification_limit=0.5)
  with pytest.raises(ValueError, match="num_devices=32"):
    burst.plan_burst(graph, profile, global_batch=BATCH, num_devices=32,
                     amplification_limit=2.0)


def test_layer_times_interpolate_and_name_what_is_missing():
  graph = _graph("g", CHAIN[:1])
  profile = _profile(graph, 0, batches=(4, 8))
  times = LayerTimes(graph, profile)
  t4, t8 = times.time_s("conv1", 4), times.time_s("conv1", 8)
  # The synthetic profile is linear in the batch, so the midpoint is exact.
  assert times.time_s("conv1", 6) == pytest.approx((t4 + t8) / 2, rel=1e-12)
  with pytest.raises(KeyError, match="not at 16, and no cost model"):
    times.time_s("conv1", 16)


def test_redistribution_moves_only_samples_that_change_device():
  assert burst_costs.moved_samples_per_device(16, 1, 2) == (8, 8)
  # Device 1 held samples 8-15 and needs 4-7: it sends 8 and receives 4.
  assert burst_costs.moved_samples_per_device(16, 2, 4) == (4, 8, 4, 4)
  assert burst_costs.moved_samples_per_device(16, 4, 4) == (0, 0, 0, 0)
  assert burst_costs.split_samples(10, 4) == (3, 3, 2, 2)
  comm = CommModel(bandwidth_bytes_per_s=100.0)
  # 8 samples of 10 bytes leave device 0, forward and back: 2 x 80 / 100.
  assert comm.redistribute_s(16, 10.0, 1, 2) == pytest.approx(1.6)
  # Ring all-reduce of 100 bytes over 4: 2 x 3/4 x 100 / 100.
  assert comm.allreduce_s(100, 4) == pytest.approx(1.5)


def test_the_adapter_round_trips_a_profile():
  graph = _graph("g", BRANCHED)
  profile = _profile(graph, 5)
  text = profile_formats.write_per_layer_times(profile)
  back = profile_formats.read_per_layer_times(text)
  assert back.model == profile.model
  assert [(t.layer, t.op_type, t.batch_size) for t in back.timings] == [
      (t.layer, t.op_type, t.batch_size) for t in profile.timings]
  for a, b in zip(back.timings, profile.timings):
    # ms and back: one multiplication and one division, a few ulps.
    assert a.forward_s == pytest.approx(b.forward_s, rel=1e-12)
    assert a.backward_s == pytest.approx(b.backward_s, rel=1e-12)
  # The same plan from either format.
  args = dict(global_batch=BATCH, num_devices=DEVICES,
              amplification_limit=2.0)
  assert (burst.plan_burst(graph, back, **args).widths_by_layer()
          == burst.plan_burst(graph, profile, **args).widths_by_layer())


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ('{"format": "other"}', "format='other'"),
    ('{"format": "per_layer_times", "version": 1, "layers": [{"id": 0, '
     '"name": "a", "prev": [3], "times_ms": {}}]}', "predecessors [3]"),
    ('{"format": "per_layer_times", "version": 1, "layers": [{"id": 0, '
     '"name": "a", "prev": [], "times_ms": {"1": [-1, 0]}}]}',
     "[forward_ms, backward_ms]"),
])
def test_the_adapter_refuses_bad_input_in_one_line(text, message):
  with pytest.raises(ValueError) as raised:
    profile_formats.read_per_layer_times(text)
  assert message in str(raised.value)
  assert "\n" not in str(raised.value)
