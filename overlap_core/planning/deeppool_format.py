"""DeepPool's own profile files, read into the shared LayerGraph and Profile.

DeepPool (Park et al., "Efficient Strong Scaling Through Burst Parallel
Training", MLSys 2022) plans on a job description and a per-layer time
table that its runtime writes; `read_deeppool` turns the pair into this
project's graph and profile, so that the burst planner plans on the very
numbers DeepPool's planner would. What the files hold, and what the
adapter derives or refuses, is in `read_deeppool`'s docstring.

  graph, profile = read_deeppool(job_text, prof_text, model="vgg16")
"""

import json
import math
import re
from typing import Dict, List, Tuple

from overlap_core.planning.graph import MODEL_INPUT, LayerGraph, LayerNode
from overlap_core.planning.profile import LayerTiming, Profile

DEEPPOOL = "deeppool"
# float32, as DeepPool counts parameter and activation bytes (its
# TrainingJob.bytesPerParam and the planner's transfer sizes are 4 bytes).
DEEPPOOL_BYTES_PER_ELEMENT = 4
# DeepPool's layer kinds: the op_type the PyTorch side gives the same module
# (so one fitted cost model covers both), for every kind whose parameters
# the adapter can count from `params`.
DEEPPOOL_OP_TYPES = {
    "conv2d": "conv2d", "linear": "linear", "ReLU": "relu",
    "ReLU1d": "relu", "ReLU2d": "relu", "maxPool2d": "maxpool2d",
    "avgPool2d": "avgpool2d", "adAvgPool2d": "adaptiveavgpool2d",
    "flatten": "flatten", "concat": "cat", "dropout": "dropout",
    "BatchNorm2d": "batchnorm2d", "layerNorm": "layernorm"}
_BATCH_MARK = re.compile(r"\[(\d+)\]")
_SKIPPED_LINES = ("#config", "SUM(avg)")  # the table's header and total
_Key = Tuple[str, str, Tuple[int, ...]]  # (kind, params JSON, inputDim)


def read_deeppool(job_text: str, prof_text: str, *,
                  model: str = DEEPPOOL) -> Tuple[LayerGraph, Profile]:
  """DeepPool's job description and layer time table as a graph + profile.

  What DeepPool writes (github.com/DeepPoolML/DeepPool, read at commit
  09c39de, Oct 2021, "Separating FW and BW times in profile", whose
  profile/A100_vgg.prof is such a table):

  * The job description, `jobDescription.py` (`Layer.dumpForJSON`,
    `TrainingJob.dumpInJSON`), one JSON object:
    {"globalBatchSize": 64, "maxGpusUsed": 8, "layers": [...]}, each layer
    {"id": 0, "name": "conv2d",           # the layer kind, not unique
     "params": {"in_channels": 3, "out_channels": 64, "kernel_size": 3,
                "stride": 1, "padding": 1},
     "prevLayers": [], "nextLayers": [1],  # ids, sorted; ids = positions
     "inputDim": [3, 224, 224],           # one sample, no batch: [C, W, H]
     "outputDim": [64, 224, 224],         # or an int for a flat tensor
     "config": [...], "gpuTime": [fw_us, bw_us], "gpuAssignment": [...]}.
    `config`, `gpuTime` and `gpuAssignment` are DeepPool's own plan for
    one width; they are not read. A layer's parameter size is not stored:
    DeepPool's planner derives it from `params`, and so does this adapter.
  * The layer time table, printed by the runtime when it profiles
    (`csrc/runnableModule.cpp`, `printLayerInGraphTimes`) and loaded by
    the planner (`parallelizationPlanner.py`, `CostSim.loadGpuProfile`):
    one line per layer and per-device batch, four whitespace-separated
    fields,
      conv2d{"in_channels":3,...,"stride":1}[64][3,224,224]  2.157  2157  6
    a key (layer kind, `params` as compact JSON with sorted keys, the
    per-device batch in brackets, `inputDim` as compact JSON), the mean
    forward + backward time in **milliseconds**, then the forward and the
    backward time in whole **microseconds**. A header line "#config ..."
    and a "SUM(avg) <ms>" line per batch are skipped. The table has no
    device count: a width k reads the line of its largest per-device
    batch, ceil(B / k).
    The planner plans on the millisecond column (and takes a missing key
    as 1 us); the microsecond pair only sets the forward/backward split.
    DeepPool later replaced the table with a cache keyed by TorchScript
    graph text (`gpuProfiler.py`), which no other tool can produce; that
    cache is not read.

  What the adapter derives, and what it refuses:

  * Layer names: "<kind>_<id>" ("conv2d_0"), as the kind is not unique.
  * Times: the millisecond column is each layer's forward + backward, as
    DeepPool plans with it, split in the ratio of the microsecond pair
    (all forward when both round to 0). A repeated key keeps its last
    line, as DeepPool's loader does. A layer with no line at any batch is
    refused, where DeepPool would time it at 1 us.
  * Parameter bytes, float32: conv2d in/groups x out x kernel area plus
    a bias (DeepPool's Conv2d does not record its bias, and defaults to
    one), linear in x out plus a bias if `bias`, BatchNorm2d and layerNorm
    a scale and a shift per channel/element; the other kinds in
    DEEPPOOL_OP_TYPES hold none. Any other kind is refused, since its
    all-reduce cannot be known.
  * Activation bytes: outputDim x globalBatchSize x 4; the model input is
    the first layer's inputDim.
  * Layer config for the cost model: the numeric `params`, and
    flops_per_sample, bytes_per_sample as the PyTorch graph computes them.

  Args:
    job_text: the job description JSON.
    prof_text: the layer time table.
    model: the model's name (the job description does not record one).

  Returns:
    (graph, profile) in the shared schema, layers in the job's order.

  Raises:
    ValueError: one line naming the field or the line that is wrong.
  """
  job = _load_job(job_text)
  batch = job["globalBatchSize"]
  layers = job["layers"]
  nodes, keys = [], []
  for i, d in enumerate(layers):
    where = f"layers[{i}]"
    kind, params = d["name"], d["params"]
    in_dims = _dims(d.get("inputDim"), f"{where}.inputDim", _job_bad)
    out_dims = _dims(d.get("outputDim"), f"{where}.outputDim", _job_bad)
    config = _numeric_params(params)
    config["flops_per_sample"] = float(
        _flops_per_sample(kind, params, out_dims, where))
    config["bytes_per_sample"] = float(
        (math.prod(in_dims) + math.prod(out_dims))
        * DEEPPOOL_BYTES_PER_ELEMENT)
    prev = d["prevLayers"]
    nodes.append(LayerNode(
        name=_deeppool_name(layers, i), op_type=DEEPPOOL_OP_TYPES[kind],
        config=config,
        inputs=(tuple(_deeppool_name(layers, p) for p in prev)
                or (MODEL_INPUT,)),
        output_shape=(batch,) + out_dims,
        param_bytes=(_param_count(kind, params, where)
                     * DEEPPOOL_BYTES_PER_ELEMENT),
        activation_bytes=(batch * math.prod(out_dims)
                          * DEEPPOOL_BYTES_PER_ELEMENT)))
    keys.append(_key(kind, params, in_dims))
  first_in = _dims(layers[0]["inputDim"], "layers[0].inputDim", _job_bad)
  graph = LayerGraph(
      name=model, batch_size=batch, input_shape=(batch,) + first_in,
      input_bytes=batch * math.prod(first_in) * DEEPPOOL_BYTES_PER_ELEMENT,
      nodes=tuple(nodes))
  return graph, _deeppool_profile(prof_text, graph, keys)


def _job_bad(message: str) -> ValueError:
  return ValueError(f"Invalid DeepPool job description: {message}")


def _prof_bad(message: str) -> ValueError:
  return ValueError(f"Invalid DeepPool layer profile: {message}")


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _is_count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_id_list(value) -> bool:
  return isinstance(value, list) and all(
      isinstance(v, int) and not isinstance(v, bool) for v in value)


def _dims(value, where: str, bad) -> Tuple[int, ...]:
  """inputDim/outputDim as a tuple: DeepPool writes a flat size as an int."""
  dims = [value] if _is_count(value) else value
  if (not isinstance(dims, list) or not dims
      or not all(_is_count(v) for v in dims)):
    raise bad(f"{where}={_short(value)}; allowed: a positive integer or a "
              "list of them")
  return tuple(dims)


def _load_job(job_text: str) -> dict:
  """The job description, with every field the adapter reads checked."""
  try:
    job = json.loads(job_text)
  except json.JSONDecodeError as e:
    raise _job_bad(f"not JSON ({e.msg} at line {e.lineno})") from None
  if not isinstance(job, dict):
    raise _job_bad(f"top level is {_short(job)}; allowed: an object with "
                   "globalBatchSize and layers")
  if not _is_count(job.get("globalBatchSize")):
    raise _job_bad(f"globalBatchSize={_short(job.get('globalBatchSize'))};"
                   " allowed: a positive integer")
  layers = job.get("layers")
  if not isinstance(layers, list) or not layers:
    raise _job_bad(f"layers={_short(layers)}; allowed: a non-empty list")
  consumers: Dict[int, List[int]] = {i: [] for i in range(len(layers))}
  for i, d in enumerate(layers):
    where = f"layers[{i}]"
    if not isinstance(d, dict):
      raise _job_bad(f"{where}={_short(d)}; allowed: an object")
    if d.get("id") != i or isinstance(d.get("id"), bool):
      raise _job_bad(f"{where}.id={_short(d.get('id'))}; allowed: {i} "
                     "(ids are positions, in topological order)")
    kind = d.get("name")
    if kind not in DEEPPOOL_OP_TYPES:
      raise _job_bad(f"{where}.name={_short(kind)}: a kind whose parameter"
                     " bytes the adapter cannot count; allowed: "
                     f"{', '.join(sorted(DEEPPOOL_OP_TYPES))}")
    if not isinstance(d.get("params"), dict):
      raise _job_bad(f"{where}.params={_short(d.get('params'))}; allowed: "
                     "an object")
    prev = d.get("prevLayers")
    if (not _is_id_list(prev) or len(set(prev)) != len(prev)
        or not all(0 <= p < i for p in prev)):
      raise _job_bad(f"{where}.prevLayers={_short(prev)}; allowed: distinct"
                     f" ids of earlier layers (0 .. {i - 1})")
    for p in prev:
      consumers[p].append(i)
  for i, d in enumerate(layers):
    if "nextLayers" in d and (not _is_id_list(d["nextLayers"])
                              or sorted(d["nextLayers"]) != consumers[i]):
      raise _job_bad(f"layers[{i}].nextLayers={_short(d['nextLayers'])}; "
                     f"allowed: {consumers[i]}, the layers whose prevLayers"
                     f" name {i}")
  return job


def _deeppool_name(layers: List[dict], i: int) -> str:
  return f"{layers[i]['name']}_{i}"


def _key(kind: str, params: dict, in_dims: Tuple[int, ...]) -> _Key:
  compact = json.dumps(params, sort_keys=True, separators=(",", ":"))
  return kind, compact, in_dims


def _numeric_params(params: dict) -> Dict[str, float]:
  """The numbers among `params` (a [h, w] pair as key_0, key_1)."""
  config = {}
  for key, value in params.items():
    values = value if isinstance(value, list) else [value]
    if all(isinstance(v, (int, float)) for v in values):
      for k, v in enumerate(values):
        config[key if len(values) == 1 else f"{key}_{k}"] = float(v)
  return config


def _count(params: dict, key: str, where: str, default=None) -> int:
  value = params.get(key, default)
  if not _is_count(value):
    raise _job_bad(f"{where}.params.{key}={_short(value)}; allowed: a "
                   "positive integer")
  return value


def _kernel_area(params: dict, where: str) -> int:
  kernel = params.get("kernel_size")
  if _is_count(kernel):
    return kernel * kernel
  if (isinstance(kernel, list) and len(kernel) == 2
      and all(_is_count(k) for k in kernel)):
    return kernel[0] * kernel[1]
  raise _job_bad(f"{where}.params.kernel_size={_short(kernel)}; allowed: a "
                 "positive integer or a [height, width] pair")


def _param_count(kind: str, params: dict, where: str) -> int:
  """Trainable parameters of one layer, from its DeepPool `params`."""
  if kind == "conv2d":
    out = _count(params, "out_channels", where)
    weights = (_count(params, "in_channels", where)
               // _count(params, "groups", where, 1) * out
               * _kernel_area(params, where))
    return weights + (out if params.get("bias", True) else 0)
  if kind == "linear":
    out = _count(params, "out_features", where)
    return (_count(params, "in_features", where) * out
            + (out if params.get("bias", True) else 0))
  if kind == "BatchNorm2d":
    return 2 * _count(params, "out_channels", where)
  if kind == "layerNorm":
    return 2 * math.prod(_dims(params.get("dim"), f"{where}.params.dim",
                               _job_bad))
  return 0


def _flops_per_sample(kind: str, params: dict, out_dims: Tuple[int, ...],
                      where: str) -> int:
  """Forward FLOPs of one sample, counted as the PyTorch graph counts."""
  if kind == "conv2d":
    spatial = math.prod(out_dims[1:]) if len(out_dims) > 1 else 1
    return (2 * _count(params, "in_channels", where)
            // _count(params, "groups", where, 1)
            * _count(params, "out_channels", where)
            * _kernel_area(params, where) * spatial)
  if kind == "linear":
    return (2 * _count(params, "in_features", where)
            * _count(params, "out_features", where))
  return math.prod(out_dims)  # elementwise: about one op per output


def _parse_prof_key(text: str, lineno: int) -> Tuple[_Key, int]:
  """(kind, params, inputDim) and the per-device batch of one key."""
  where = (f"line {lineno}: key {_short(text)}; allowed: "
           "kind{params}[batch]inputDim")
  brace = text.find("{")
  if brace <= 0:
    raise _prof_bad(where)
  try:
    params, end = json.JSONDecoder().raw_decode(text, brace)
  except json.JSONDecodeError:
    raise _prof_bad(where) from None
  mark = _BATCH_MARK.match(text, end)
  if not isinstance(params, dict) or mark is None or int(mark.group(1)) < 1:
    raise _prof_bad(where)
  try:
    dims = json.loads(text[mark.end():])
  except json.JSONDecodeError:
    raise _prof_bad(where) from None
  in_dims = _dims(dims, f"line {lineno}: inputDim", _prof_bad)
  return _key(text[:brace], params, in_dims), int(mark.group(1))


def _time(field: str, name: str, lineno: int) -> float:
  try:
    value = float(field)
  except ValueError:
    value = -1.0
  if not value >= 0 or math.isinf(value):
    raise _prof_bad(f"line {lineno}: {name}={field!r}; allowed: a number "
                    ">= 0")
  return value


def _deeppool_profile(prof_text: str, graph: LayerGraph,
                      keys: List[_Key]) -> Profile:
  """The table's lines for the graph's layers; lines of other layers (a
  table may hold several models) are not read."""
  table: Dict[Tuple[_Key, int], Tuple[float, float, float]] = {}
  for lineno, line in enumerate(prof_text.splitlines(), start=1):
    fields = line.split()
    if not fields or fields[0] in _SKIPPED_LINES:
      continue
    if len(fields) != 4:
      older = ("; the avg/p50/p90/p99 table of older DeepPool releases has "
               "no forward/backward split") if len(fields) == 5 else ""
      raise _prof_bad(f"line {lineno} has {len(fields)} fields; allowed: 4 "
                      f"(key, avg_ms, fw_us, bw_us){older}")
    key, batch = _parse_prof_key(fields[0], lineno)
    table[(key, batch)] = (_time(fields[1], "avg_ms", lineno),
                           _time(fields[2], "fw_us", lineno),
                           _time(fields[3], "bw_us", lineno))
  batches = sorted({b for _, b in table})
  timings = []
  for node, key in zip(graph.nodes, keys):
    found = [(b, table[(key, b)]) for b in batches if (key, b) in table]
    if not found:
      kind, params, dims = key
      dims_json = json.dumps(dims[0] if len(dims) == 1 else list(dims),
                             separators=(",", ":"))
      raise _prof_bad(f"no line for layer {node.name!r}: its key "
                      f"{kind}{params}[<batch>]{dims_json} is at no batch "
                      f"(the table has batches {batches})")
    for b, (avg_ms, fw_us, bw_us) in found:
      total_s = avg_ms / 1e3
      fw_share = fw_us / (fw_us + bw_us) if fw_us + bw_us > 0 else 1.0
      timings.append(LayerTiming(
          layer=node.name, op_type=node.op_type, batch_size=b,
          forward_s=total_s * fw_share,
          backward_s=total_s * (1.0 - fw_share)))
  return Profile(model=graph.name, framework="DeepPool runtime",
                 device="unknown (a DeepPool table does not say)",
                 warmup=0, repeats=1, timings=tuple(timings))

