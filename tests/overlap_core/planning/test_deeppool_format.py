"""DeepPool's job description and layer table through the adapter: the
same graph, profile and burst plan as the model built natively, and
one-line refusals of what the adapter cannot read."""

import json

import pytest

from overlap_core.planning import burst, deeppool_format
from overlap_core.planning.burst_costs import CommModel

from tests import deeppool_files as dp
from tests.helpers import one_line_error

# 1 GB/s makes the classifier's all-reduce and the convolutions'
# redistributions matter, so the plan depends on the derived bytes.
COMM = CommModel(bandwidth_bytes_per_s=1e9, latency_s=5e-6)
PLAN_ARGS = dict(global_batch=dp.GLOBAL_BATCH, num_devices=dp.NUM_DEVICES,
                 amplification_limit=2.0, comm=COMM)


def _read(job_text=None, prof_text=None):
  return deeppool_format.read_deeppool(
      dp.job_json() if job_text is None else job_text,
      dp.prof_text() if prof_text is None else prof_text)


def test_the_adapter_reads_the_graph_deeppool_describes():
  graph, profile = _read()
  native = dp.native_graph()
  assert [n.name for n in graph.nodes] == list(dp.NAMES)
  assert [n.op_type for n in graph.nodes] == list(dp.OP_TYPES)
  assert [n.inputs for n in graph.nodes] == [n.inputs for n in native.nodes]
  # Parameter bytes are derived from `params`; DeepPool stores none.
  assert [n.param_bytes for n in graph.nodes] == list(dp.PARAM_BYTES)
  assert [n.activation_bytes for n in graph.nodes] == list(
      dp.ACTIVATION_BYTES)
  assert graph.input_shape == native.input_shape
  assert graph.input_bytes == native.input_bytes
  # Inside the fork is no cut; before and after it are.
  assert graph.cut_points() == native.cut_points() == (0, 1, 4, 5)
  assert graph.nodes[0].config["flops_per_sample"] == 2 * 3 * 8 * 9 * 64
  # Every layer at every batch of the table, and no line of other models.
  assert profile.batch_sizes == tuple(sorted(dp.BATCHES))
  assert len(profile.timings) == len(dp.LAYERS) * len(dp.BATCHES)
  ours = {(t.layer, t.batch_size): t for t in dp.native_profile().timings}
  for t in profile.timings:
    want = ours[(t.layer, t.batch_size)]
    # A decimal parse, a division and a multiplication: a few ulps.
    assert t.forward_s == pytest.approx(want.forward_s, rel=1e-12)
    assert t.backward_s == pytest.approx(want.backward_s, rel=1e-12)


def test_the_plan_equals_the_plan_of_the_native_model():
  graph, profile = _read()
  plan = burst.plan_burst(graph, profile, **PLAN_ARGS)
  native = burst.plan_burst(dp.native_graph(), dp.native_profile(),
                            **PLAN_ARGS)
  widths = plan.widths_by_layer()
  assert widths == native.widths_by_layer()
  # The fixture is built so the plan is not one width everywhere: the
  # convolutions widen and the classifier stays narrow.
  assert widths["conv2d_2"] > widths["linear_6"] == 1
  # Sums of a few dozen terms each off by a few ulps: 1e-12 relative is
  # ample, and a one-microsecond error in any layer would be ~1e-3.
  assert plan.iteration_s == pytest.approx(native.iteration_s, rel=1e-12)
  assert plan.gpu_s == pytest.approx(native.gpu_s, rel=1e-12)
  assert plan.data_parallel_iteration_s == pytest.approx(
      native.data_parallel_iteration_s, rel=1e-12)


def test_a_repeated_key_keeps_its_last_line():
  fw, bw = dp.times_us(6, 8)
  kind, params, _, in_dim, _ = dp.LAYERS[6]
  stale = f"{dp.key(kind, params, 8, in_dim)}  9.000  3000  6000\n"
  _, profile = _read(prof_text=stale + dp.prof_text())
  assert profile.time_s("linear_6", 8) == pytest.approx((fw + bw) / 1e6)
  _, profile = _read(prof_text=dp.prof_text() + stale)
  assert profile.time_s("linear_6", 8) == pytest.approx(9e-3)


def test_identical_layers_share_one_line_and_ids_pass_nine():
  # Twelve equal ReLUs, one key: one line per batch times them all. Layer
  # 8 feeds 9 and 10, which 11 joins: nextLayers [9, 10] must compare as
  # numbers, not as text.
  prev = {i: [i - 1] for i in range(1, 12)}
  prev.update({0: [], 10: [8], 11: [9, 10]})
  layers = [{"id": i, "name": "ReLU1d", "params": dp.RELU,
             "prevLayers": prev[i],
             "nextLayers": [j for j in range(12) if i in prev[j]],
             "inputDim": 64, "outputDim": 64} for i in range(12)]
  assert layers[8]["nextLayers"] == [9, 10]
  job = json.dumps({"globalBatchSize": 4, "layers": layers})
  table = "".join(f"{dp.key('ReLU1d', dp.RELU, b, 64)}  {b / 1e3:.3f}  "
                  f"{b // 2}  {b - b // 2}\n" for b in (4, 2))
  graph, profile = deeppool_format.read_deeppool(job, table)
  assert graph.nodes[11].inputs == ("ReLU1d_9", "ReLU1d_10")
  # A decimal parse, a division and a split: a few ulps.
  assert [profile.time_s(n.name, 2) for n in graph.nodes] == pytest.approx(
      [2e-6] * 12, rel=1e-12)


def _job_with(change):
  job = json.loads(dp.job_json())
  change(job)
  return json.dumps(job)


def _set(index, field, value):
  def change(job):
    job["layers"][index][field] = value
  return change


@pytest.mark.parametrize("job_text, message", [
    ("{", "job description: not JSON"),
    (_job_with(lambda j: j.pop("globalBatchSize")), "globalBatchSize=None"),
    (_job_with(lambda j: j.update(layers=[])), "layers=[]"),
    (_job_with(_set(2, "id", 7)), "layers[2].id=7; allowed: 2"),
    (_job_with(_set(2, "name", "transformerLayer")),
     "layers[2].name='transformerLayer'"),
    (_job_with(_set(2, "prevLayers", [5])), "layers[2].prevLayers=[5]"),
    (_job_with(_set(4, "prevLayers", [2, 2])),
     "layers[4].prevLayers=[2, 2]; allowed: distinct ids"),
    (_job_with(_set(1, "nextLayers", [2])),
     "layers[1].nextLayers=[2]; allowed: [2, 3]"),
    (_job_with(_set(0, "inputDim", [3, 0, 8])), "layers[0].inputDim=[3, 0, 8]"),
    (_job_with(_set(5, "outputDim", "1024")), "layers[5].outputDim='1024'"),
    (_job_with(_set(0, "params", {"in_channels": 3, "out_channels": 8,
                                  "kernel_size": [3]})),
     "layers[0].params.kernel_size=[3]"),
    (_job_with(_set(6, "params", {"in_features": 1024})),
     "layers[6].params.out_features=None"),
])
def test_a_bad_job_description_is_refused_in_one_line(job_text, message):
  assert message in one_line_error(_read, job_text=job_text)


def _table_with(old, new):
  text = dp.prof_text()
  assert old in text
  return text.replace(old, new)


FIRST_KEY = dp.key(*dp.LAYERS[0][:2], 8, dp.LAYERS[0][3])


@pytest.mark.parametrize("prof_text, message", [
    # The p50/p90/p99 table of older releases: no forward/backward split.
    (f"{FIRST_KEY}  0.990  0.990  0.991  0.993\n", "line 1 has 5 fields"),
    (f"{FIRST_KEY}  0.990  330\n", "line 1 has 3 fields"),
    ("conv2d[8][3,8,8]  0.990  330  660\n", "line 1: key 'conv2d[8]"),
    (FIRST_KEY.replace("[8]", "[0]") + "  0.990  330  660\n",
     "kind{params}[batch]inputDim"),
    (FIRST_KEY.replace("[3,8,8]", "[3,8,") + "  0.990  330  660\n",
     "kind{params}[batch]inputDim"),
    (f"{FIRST_KEY}  0.990  -330  660\n", "line 1: fw_us='-330'"),
    (f"{FIRST_KEY}  fast  330  660\n", "line 1: avg_ms='fast'"),
    # A layer with no line at all: DeepPool would time it at 1 us.
    (_table_with("\"out_features\":10}", "\"out_features\":11}"),
     "no line for layer 'linear_6'"),
])
def test_a_bad_layer_table_is_refused_in_one_line(prof_text, message):
  assert message in one_line_error(_read, prof_text=prof_text)
