"""Burst parallelism (DeepPool): each layer on its own number of devices.

Strong scaling a model over N devices leaves most of them idle in layers
that do not scale. The burst planner gives each layer its own width k (the
devices it runs on, 1 .. N) and the sample split B/k, choosing the widths
that minimize the predicted iteration time under a bound on wasted
device-time.

The predicted iteration, with the costs of `burst_costs.py`:

  iteration_s = sum over layers of compute_s(k) + allreduce_s(k)
              + sum over edges of redistribute_s(k_producer, k_consumer)

Layers run one after another, each on its own devices (a branch of a
ResNet or Inception block runs after its sibling, not beside it: this is
the documented alternative to DeepPool's concurrent branches, and it keeps
the objective additive, so graph reduction, `burst_reduce.py`, finds its
exact minimum). The all-reduce is counted in full, not hidden behind
backward: a conservative prediction.

**Amplification**, enforced **per layer**:

  amplification(layer, k) = k x (compute_s(k) + allreduce_s(k)) / compute_s(1)

the device-seconds the layer holds at width k over what it needs on one
device. Every layer must stay within the limit (width 1 always does). The
whole plan's amplification, reported beside it, is the plan's
device-seconds (every layer's k x its time, plus every redistribution x
the devices it involves) over the single-device iteration. Idle devices
are not counted: DeepPool lends them to a background job.

  plan = plan_burst(graph, profile, global_batch=32, num_devices=4,
                    amplification_limit=2.0,
                    comm=CommModel(bandwidth_bytes_per_s=10e9))
  print(plan.table()); open("burst_plan.json", "w").write(plan.to_json())

A plan names each layer by its neutral name (`graph.neutral_layer_name`,
"features_0" for PyTorch's "features.0"), since one plan serves both
trainers: each maps its own layer names through that function to match.
"""

import dataclasses
import json
from typing import Dict, Mapping, Optional, Sequence, Tuple

from overlap_core.planning import burst_reduce
from overlap_core.planning.burst_costs import (CommModel, LayerTimes,
                                               check_widths, default_widths,
                                               split_samples)
from overlap_core.planning.cost_model import CostModel
from overlap_core.planning.graph import MODEL_INPUT, LayerGraph
from overlap_core.planning.profile import Profile

ENFORCED = "per_layer"
SCHEMA_VERSION = 1
_SLACK = 1e-9  # amplification at exactly the limit counts as within it


class BurstProblem:
  """The planner's cost terms for one graph, batch and device count."""

  def __init__(self, graph: LayerGraph, times: LayerTimes, *,
               global_batch: int, num_devices: int,
               amplification_limit: float, comm: CommModel = CommModel(),
               widths: Optional[Sequence[int]] = None):
    if num_devices < 1 or global_batch < num_devices:
      raise ValueError(f"Invalid burst plan: num_devices={num_devices} for "
                       f"global_batch={global_batch}; allowed: 1 <= "
                       "num_devices <= global_batch")
    if not amplification_limit >= 1.0:
      raise ValueError("Invalid value for argument `amplification_limit`. "
                       f"Received: {amplification_limit}; allowed: >= 1")
    widths = tuple(widths or default_widths(num_devices, global_batch))
    check_widths(widths)
    if widths[-1] > num_devices:
      raise ValueError(f"Invalid value for argument `widths`. Received: "
                       f"{list(widths)}; allowed: at most {num_devices}")
    missing = times.missing_layers()
    if missing:
      raise KeyError(f"layer {missing[0]!r} has no profile "
                     f"({len(missing)} layers lack one)")
    self.graph, self.times, self.comm = graph, times, comm
    self.global_batch, self.num_devices = global_batch, num_devices
    self.amplification_limit, self.widths = amplification_limit, widths
    self.layers = tuple(n.name for n in graph.nodes)
    self.edges = tuple(dict.fromkeys(graph.edges))
    self._nodes = {n.name: n for n in graph.nodes}

  def compute_s(self, layer: str, k: int) -> float:
    return self.times.compute_s(layer, self.global_batch, k)

  def allreduce_s(self, layer: str, k: int) -> float:
    return self.comm.allreduce_s(self._nodes[layer].param_bytes, k)

  def layer_s(self, layer: str, k: int) -> float:
    return self.compute_s(layer, k) + self.allreduce_s(layer, k)

  def amplification(self, layer: str, k: int) -> float:
    alone_s = self.compute_s(layer, 1)
    held_s = k * self.layer_s(layer, k)
    if alone_s <= 0:
      return 1.0 if held_s <= 0 else float("inf")
    return held_s / alone_s

  def allowed(self, layer: str) -> Tuple[int, ...]:
    return tuple(k for k in self.widths if k == 1 or self.amplification(
        layer, k) <= self.amplification_limit + _SLACK)

  def edge_s(self, producer: str, consumer: str, k_from: int,
             k_to: int) -> float:
    del consumer  # the cost depends on what is moved, not where it goes
    if producer == MODEL_INPUT:
      return 0.0  # the input pipeline hands every device its own samples
    node = self._nodes[producer]
    per_sample = node.activation_bytes / max(self.graph.batch_size, 1)
    return self.comm.redistribute_s(self.global_batch, per_sample, k_from,
                                    k_to)

  def total_s(self, widths_by_layer: Mapping[str, int]) -> float:
    """The objective of any assignment: what brute force compares."""
    total = sum(self.layer_s(n, widths_by_layer[n]) for n in self.layers)
    for u, v in self.edges:
      if u != MODEL_INPUT:
        total += self.edge_s(u, v, widths_by_layer[u], widths_by_layer[v])
    return total


@dataclasses.dataclass(frozen=True)
class LayerPlan:
  """One layer's width, its samples per device and its predicted costs."""
  layer: str
  op_type: str
  num_devices: int
  samples_per_device: Tuple[int, ...]
  compute_s: float
  allreduce_s: float
  transfer_in_s: float  # redistributing its inputs, forward and backward
  gpu_s: float
  amplification: float
  widest_allowed: int  # the widest width the limit lets it take
  # compute + all-reduce at every candidate width: its scaling curve
  time_by_width_s: Tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class BurstPlan:
  """A per-layer width choice that explains itself; see module docstring."""
  model: str
  global_batch: int
  num_devices: int
  amplification_limit: float
  enforced: str
  bandwidth_bytes_per_s: Optional[float]
  latency_s: float
  widths: Tuple[int, ...]
  layers: Tuple[LayerPlan, ...]
  iteration_s: float
  gpu_s: float
  single_device_s: float
  data_parallel_iteration_s: float
  data_parallel_gpu_s: float

  @property
  def amplification(self) -> float:
    return self.gpu_s / self.single_device_s if self.single_device_s else 1.0

  def widths_by_layer(self) -> Dict[str, int]:
    return {lp.layer: lp.num_devices for lp in self.layers}

  def device_sets(self) -> Tuple[Tuple[int, ...], ...]:
    """The distinct device sets the plan uses, narrowest first."""
    used = sorted({lp.num_devices for lp in self.layers})
    return tuple(tuple(range(k)) for k in used)

  def table(self) -> str:
    bw = ("free" if self.bandwidth_bytes_per_s is None
          else f"{self.bandwidth_bytes_per_s / 1e9:g} GB/s")
    rows = [f"Burst plan for {self.model}: global batch {self.global_batch} "
            f"on {self.num_devices} devices, widths {list(self.widths)}, "
            f"communication {bw}",
            f"amplification limit {self.amplification_limit:g}, enforced "
            "per layer: k x (compute_k + allreduce_k) / compute_1",
            f"{'#':>4}  {'layer':<30} {'type':<12} {'dev':>3} "
            f"{'samples/dev':<14} {'compute ms':>10} {'allred ms':>9} "
            f"{'xfer-in ms':>10} {'GPU-ms':>9} {'amplif':>7} {'max k':>5}"]
    for i, lp in enumerate(self.layers):
      split = "/".join(str(s) for s in sorted(set(lp.samples_per_device),
                                              reverse=True))
      rows.append(f"{i:>4}  {lp.layer[:30]:<30} {lp.op_type[:12]:<12} "
                  f"{lp.num_devices:>3} {split:<14} "
                  f"{lp.compute_s * 1e3:>10.3f} {lp.allreduce_s * 1e3:>9.3f} "
                  f"{lp.transfer_in_s * 1e3:>10.3f} {lp.gpu_s * 1e3:>9.3f} "
                  f"{lp.amplification:>7.2f} {lp.widest_allowed:>5}")
    dp = self.data_parallel_iteration_s
    rows += [
        f"predicted iteration {self.iteration_s * 1e3:.3f} ms, "
        f"{self.gpu_s:.4f} GPU-s, amplification {self.amplification:.2f} "
        f"(single device {self.single_device_s * 1e3:.3f} ms)",
        f"data parallel on {self.num_devices}: iteration {dp * 1e3:.3f} ms, "
        f"{self.data_parallel_gpu_s:.4f} GPU-s; burst/data-parallel "
        f"iteration {self.iteration_s / dp if dp else 1.0:.2f}, GPU-s "
        f"{self.gpu_s / self.data_parallel_gpu_s if dp else 1.0:.2f}"]
    return "\n".join(rows)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["layers"] = [dataclasses.asdict(lp) for lp in self.layers]
    d["amplification"] = self.amplification
    return {"schema_version": SCHEMA_VERSION, **d}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1)

  @classmethod
  def from_dict(cls, d: dict) -> "BurstPlan":
    if d.get("schema_version") != SCHEMA_VERSION:
      raise ValueError(f"Invalid burst plan: schema_version="
                       f"{d.get('schema_version')!r}; allowed: "
                       f"{SCHEMA_VERSION}")
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in d.items() if k in fields}
    kwargs["widths"] = tuple(d["widths"])
    kwargs["layers"] = tuple(
        LayerPlan(**{**lp, "samples_per_device": tuple(
            lp["samples_per_device"]), "time_by_width_s": tuple(
            lp.get("time_by_width_s", ()))}) for lp in d["layers"])
    return cls(**kwargs)

  @classmethod
  def from_json(cls, text: str) -> "BurstPlan":
    return cls.from_dict(json.loads(text))


def check_plan_layers(layers: Sequence[str],
                      widths_by_layer: Mapping[str, int], *, max_width: int,
                      max_width_reason: str = "") -> None:
  """Refuses a plan that does not name exactly the model's layers, or that
  gives one a width this run cannot give it.

  Both trainers check a plan here before running it, so that a plan a
  model does not fit is refused in the same words on either side.

  Args:
    layers: the model's layers, in order, by the names the plan uses.
    widths_by_layer: the plan's width of every layer, by layer name.
    max_width: the widest a layer may run here.
    max_width_reason: what sets `max_width`, said after it ("" for
      nothing).

  Raises:
    ValueError: one line naming the first layer at fault.
  """
  missing = [name for name in layers if name not in widths_by_layer]
  if missing:
    raise ValueError(f"layer {missing[0]!r} of the model has no width in "
                     f"the plan ({len(missing)} layers lack one)")
  extra = sorted(set(widths_by_layer) - set(layers))
  if extra:
    raise ValueError(f"the plan names layer {extra[0]!r}, which the model "
                     "lacks")
  for name in layers:
    k = widths_by_layer[name]
    if not 1 <= k <= max_width:
      reason = f" ({max_width_reason})" if max_width_reason else ""
      raise ValueError(f"layer {name!r} has width {k}; allowed: 1 to "
                       f"{max_width}{reason}")


def describe(problem: BurstProblem,
             widths_by_layer: Mapping[str, int]) -> BurstPlan:
  """The plan of an assignment, with every predicted cost filled in.

  Raises:
    ValueError: two layers go by the same neutral name.
  """
  neutral = problem.graph.neutral_names()
  transfer_in = {n: 0.0 for n in problem.layers}
  transfer_gpu_s = 0.0
  for u, v in problem.edges:
    if u == MODEL_INPUT:
      continue
    ku, kv = widths_by_layer[u], widths_by_layer[v]
    edge_s = problem.edge_s(u, v, ku, kv)
    transfer_in[v] += edge_s
    transfer_gpu_s += max(ku, kv) * edge_s
  layers, gpu_s, single_s = [], transfer_gpu_s, 0.0
  for node in problem.graph.nodes:
    k = widths_by_layer[node.name]
    layer_gpu_s = k * problem.layer_s(node.name, k)
    gpu_s += layer_gpu_s
    single_s += problem.compute_s(node.name, 1)
    layers.append(LayerPlan(
        layer=neutral[node.name], op_type=node.op_type, num_devices=k,
        samples_per_device=split_samples(problem.global_batch, k),
        compute_s=problem.compute_s(node.name, k),
        allreduce_s=problem.allreduce_s(node.name, k),
        transfer_in_s=transfer_in[node.name], gpu_s=layer_gpu_s,
        amplification=problem.amplification(node.name, k),
        widest_allowed=max(problem.allowed(node.name)),
        time_by_width_s=tuple(problem.layer_s(node.name, w)
                              for w in problem.widths)))
  top = problem.widths[-1]
  dp_s = problem.total_s({n: top for n in problem.layers})
  return BurstPlan(
      model=problem.graph.name, global_batch=problem.global_batch,
      num_devices=problem.num_devices,
      amplification_limit=problem.amplification_limit, enforced=ENFORCED,
      bandwidth_bytes_per_s=problem.comm.bandwidth_bytes_per_s,
      latency_s=problem.comm.latency_s, widths=problem.widths,
      layers=tuple(layers), iteration_s=problem.total_s(widths_by_layer),
      gpu_s=gpu_s, single_device_s=single_s,
      data_parallel_iteration_s=dp_s, data_parallel_gpu_s=top * dp_s)


def solve(problem: BurstProblem) -> Dict[str, int]:
  """The exact minimum-time widths under the per-layer limit."""
  chosen, _ = burst_reduce.solve(
      problem.layers, problem.edges, MODEL_INPUT, problem.allowed,
      problem.widths, problem.layer_s, problem.edge_s)
  return chosen


def plan_burst(graph: LayerGraph, profile: Profile, *, global_batch: int,
               num_devices: int, amplification_limit: float,
               comm: CommModel = CommModel(),
               cost_model: Optional[CostModel] = None,
               widths: Optional[Sequence[int]] = None) -> BurstPlan:
  """Plans every layer's width; see the module docstring for the model.

  Args:
    graph, profile: the shared layer graph and per-layer profile.
    global_batch: samples per iteration, over all devices.
    num_devices: devices available; no layer gets more.
    amplification_limit: >= 1; the per-layer bound on device-seconds.
    comm: bandwidth and latency of the all-reduce and redistribution.
    cost_model: predicts batches outside the profiled range.
    widths: candidate widths (default: powers of two and num_devices).

  Raises:
    ValueError: bad arguments, a graph that is not series-parallel, or two
      layers with one neutral name.
    KeyError: a layer without a profile, or a batch nothing can predict.
  """
  problem = BurstProblem(graph, LayerTimes(graph, profile, cost_model),
                         global_batch=global_batch, num_devices=num_devices,
                         amplification_limit=amplification_limit, comm=comm,
                         widths=widths)
  return describe(problem, solve(problem))
