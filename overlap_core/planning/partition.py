"""Splitting a layer graph into pipeline stages at its cut points.

Three modes, one objective. A stage's predicted time per micro-batch is

  compute_s / replicas           its layers' forward + backward at the
                                 micro-batch (from the cost model or profile)
  + allreduce_s                  replicas > 1: a ring all-reduce of its
                                 parameters, 2 (r - 1) / r x bytes / bandwidth
  + transfer_s                   not the last stage: its output activation
                                 forward and that activation's gradient
                                 backward, 2 x bytes / bandwidth

and per step it runs M micro-batches, adds each one's gradients after the
first into the step's (gradient_sum_s: its parameter bytes at the
profile's rate), and then runs the optimizer's update of its parameters
once (update_s, when the profile timed updates: its layers' shares, plus
the fixed cost of one optimizer call when it has weights):

  step_s(M) = M x time_s + (M - 1) x gradient_sum_s + update_s

A pipeline runs at the pace of its busiest stage, so `auto` minimizes the
largest step_s(M) (PipeDream's objective, with the update counted: a stage
holding a large classifier can be light per micro-batch and still the
slowest per step; its replication is the uniform kind here: stages x
replicas = world). `even` splits by layer count at the
nearest cut points (what torchtitan does); `explicit` cuts after named
layers. Whatever the mode, the plan carries every stage's layers, predicted
time and memory, and the reason for the choice.

  plan = partition(graph, times_s, num_stages=4, batch_size=8)
  print(plan.table())
"""

import dataclasses
import math
from typing import Mapping, Optional, Sequence, Tuple

from overlap_core.planning.graph import MODEL_INPUT, LayerGraph

MODES = ("auto", "even", "explicit")


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
  """GPipe's idle fraction of a step: (S - 1) / (M + S - 1)."""
  if num_stages < 1 or num_microbatches < 1:
    raise ValueError(f"Invalid stages/micro-batches: {num_stages}, "
                     f"{num_microbatches}; allowed: integers >= 1")
  return (num_stages - 1) / (num_microbatches + num_stages - 1)


@dataclasses.dataclass(frozen=True)
class Stage:
  """One pipeline stage of a plan, with its predicted costs."""
  index: int
  layers: Tuple[str, ...]
  compute_s: float
  allreduce_s: float
  transfer_s: float
  param_bytes: int
  activation_bytes: int  # outputs of its layers for one micro-batch
  update_s: float = 0.0  # the optimizer's update of its parameters, per step
  # adding one micro-batch's gradients into the step's
  gradient_sum_s: float = 0.0

  @property
  def time_s(self) -> float:
    """One micro-batch: compute, all-reduce share and transfer."""
    return self.compute_s + self.allreduce_s + self.transfer_s

  def step_s(self, num_microbatches: int) -> float:
    """One step: M micro-batches, M - 1 gradient sums, then the update."""
    return (num_microbatches * self.time_s
            + (num_microbatches - 1) * self.gradient_sum_s + self.update_s)


@dataclasses.dataclass(frozen=True)
class StagePlan:
  """A split and why: stages, the cuts, and the bottleneck it predicts."""
  mode: str
  stages: Tuple[Stage, ...]
  cuts: Tuple[str, ...]  # the layer each stage but the last ends with
  replicas: int
  batch_size: int  # the micro-batch the times are for
  reason: str
  num_microbatches: int = 1  # M: what the per-step figures are for

  @property
  def bottleneck_s(self) -> float:
    """The busiest stage's step: M micro-batches and its update."""
    return max(s.step_s(self.num_microbatches) for s in self.stages)

  @property
  def imbalance(self) -> float:
    """Busiest stage over mean stage, per step: 1.0 is perfectly balanced."""
    mean = sum(s.step_s(self.num_microbatches)
               for s in self.stages) / len(self.stages)
    return self.bottleneck_s / mean if mean > 0 else 1.0

  def predicted_step_s(self, num_microbatches: int) -> float:
    """A GPipe step: M + S - 1 slots, each as long as the slowest stage's
    micro-batch (its gradient sums spread over them), then the updates,
    which every stage runs at once."""
    m = num_microbatches
    slot = max(s.time_s + (m - 1) / m * s.gradient_sum_s
               for s in self.stages)
    update = max(s.update_s for s in self.stages)
    return (num_microbatches + len(self.stages) - 1) * slot + update

  def table(self, num_microbatches: Optional[int] = None) -> str:
    rows = [f"Split ({self.mode}, {len(self.stages)} stages x "
            f"{self.replicas} replicas, micro-batch {self.batch_size}): "
            f"{self.reason}",
            f"{'stage':>5}  {'layers':<44} {'compute ms':>10} "
            f"{'comm ms':>8} {'stage ms':>8} {'sum ms':>7} "
            f"{'update ms':>9} {'params MiB':>10} {'act MiB':>8}"]
    for s in self.stages:
      span = (s.layers[0] if len(s.layers) == 1 else
              f"{s.layers[0]} .. {s.layers[-1]}")
      span = f"{span} ({len(s.layers)})"
      rows.append(f"{s.index:>5}  {span:<44} {s.compute_s * 1e3:>10.3f} "
                  f"{(s.allreduce_s + s.transfer_s) * 1e3:>8.3f} "
                  f"{s.time_s * 1e3:>8.3f} {s.gradient_sum_s * 1e3:>7.3f} "
                  f"{s.update_s * 1e3:>9.3f} "
                  f"{s.param_bytes / 2**20:>10.3f} "
                  f"{s.activation_bytes / 2**20:>8.3f}")
    rows.append("(compute, comm and stage: one micro-batch; sum: adding one "
                "micro-batch's gradients, M - 1 times per step; update: once "
                "per step)")
    rows.append(f"busiest stage per step of {self.num_microbatches} "
                f"micro-batches {self.bottleneck_s * 1e3:.3f} ms, busiest/"
                f"mean {self.imbalance:.2f}; cuts after: "
                f"{', '.join(self.cuts) or '(none)'}")
    if num_microbatches:
      rows.append(
          f"with {num_microbatches} micro-batches: predicted step "
          f"{self.predicted_step_s(num_microbatches) * 1e3:.3f} ms, GPipe "
          f"bubble {bubble_fraction(len(self.stages), num_microbatches):.1%}")
    return "\n".join(rows)


class _Costs:
  """Prefix sums over nodes, so any stage's cost is O(1) to evaluate."""

  def __init__(self, graph: LayerGraph, times_s: Mapping[str, float],
               batch_size: int, bandwidth_bytes_per_s: Optional[float],
               replicas: int, update_s: Optional[Mapping[str, float]] = None,
               num_microbatches: int = 1, update_call_s: float = 0.0,
               gradient_sum_s_per_byte: float = 0.0):
    missing = [n.name for n in graph.nodes if n.name not in times_s]
    if missing:
      raise ValueError(f"no predicted time for layers {missing[:5]}")
    self.graph = graph
    self.replicas = replicas
    self.num_microbatches = num_microbatches
    update_s = update_s or {}
    self.update = _prefix([update_s.get(n.name, 0.0) for n in graph.nodes])
    self.update_call_s = update_call_s
    self.gradient_sum_s_per_byte = gradient_sum_s_per_byte
    self.scale = batch_size / graph.batch_size
    self.inv_bw = 0.0 if not bandwidth_bytes_per_s else (
        1.0 / bandwidth_bytes_per_s)
    self.time = _prefix([times_s[n.name] for n in graph.nodes])
    self.params = _prefix([n.param_bytes for n in graph.nodes])
    self.acts = _prefix([n.activation_bytes for n in graph.nodes])

  def crossing_bytes(self, cut: int) -> float:
    (src,) = self.graph.crossing_tensors(cut)
    raw = (self.graph.input_bytes if src == MODEL_INPUT else
           self.graph.nodes[self.graph.index(src)].activation_bytes)
    return raw * self.scale

  def stage(self, index: int, start: int, end: int) -> Stage:
    """Nodes [start, end); a cut after end - 1 unless it is the last node."""
    r = self.replicas
    params = self.params[end] - self.params[start]
    last = end == len(self.graph.nodes)
    return Stage(
        index=index,
        layers=tuple(n.name for n in self.graph.nodes[start:end]),
        compute_s=(self.time[end] - self.time[start]) / r,
        allreduce_s=2 * (r - 1) / r * params * self.inv_bw,
        transfer_s=0.0 if last else
        2 * self.crossing_bytes(end - 1) * self.inv_bw,
        param_bytes=int(params),
        activation_bytes=int((self.acts[end] - self.acts[start]) * self.scale),
        # Every replica updates its own copy: not divided by r. One
        # optimizer call per stage, whatever its layer count.
        update_s=self.update[end] - self.update[start] + (
            self.update_call_s if params > 0 else 0.0),
        gradient_sum_s=params * self.gradient_sum_s_per_byte)


def _prefix(values):
  out = [0.0]
  for v in values:
    out.append(out[-1] + v)
  return out


def evaluate_cuts(graph: LayerGraph, times_s: Mapping[str, float],
                  cuts: Sequence[int], *, batch_size: int,
                  bandwidth_bytes_per_s: Optional[float] = None,
                  replicas: int = 1, mode: str = "explicit",
                  reason: str = "",
                  update_s: Optional[Mapping[str, float]] = None,
                  num_microbatches: int = 1,
                  update_call_s: float = 0.0,
                  gradient_sum_s_per_byte: float = 0.0) -> StagePlan:
  """The plan of cutting after the node indices `cuts` (sorted cut points)."""
  costs = _Costs(graph, times_s, batch_size, bandwidth_bytes_per_s, replicas,
                 update_s, num_microbatches, update_call_s,
                 gradient_sum_s_per_byte)
  bounds = [0] + [c + 1 for c in cuts] + [len(graph.nodes)]
  stages = tuple(costs.stage(k, a, b)
                 for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])))
  return StagePlan(mode=mode, stages=stages,
                   cuts=tuple(graph.nodes[c].name for c in cuts),
                   replicas=replicas, batch_size=batch_size, reason=reason,
                   num_microbatches=num_microbatches)


def _auto_cuts(graph, costs: _Costs, num_stages: int) -> Tuple[int, ...]:
  """Min-max DP over blocks: best[s][k] = first k blocks in s stages."""
  bounds = [0] + [c + 1 for c in graph.cut_points()] + [len(graph.nodes)]
  num_blocks = len(bounds) - 1
  inf = (math.inf, ())
  best = [[inf] * (num_blocks + 1) for _ in range(num_stages + 1)]
  best[0][0] = (0.0, ())
  for s in range(1, num_stages + 1):
    for k in range(s, num_blocks + 1):
      for j in range(s - 1, k):
        prev_cost, prev_cuts = best[s - 1][j]
        if prev_cost == math.inf:
          continue
        stage = costs.stage(0, bounds[j], bounds[k])
        cost = max(prev_cost, stage.step_s(costs.num_microbatches))
        if cost < best[s][k][0]:
          cuts = prev_cuts + ((bounds[j] - 1,) if j else ())
          best[s][k] = (cost, cuts)
  return best[num_stages][num_blocks][1]


def _even_cuts(graph: LayerGraph, num_stages: int) -> Tuple[int, ...]:
  """The cut point nearest to every k/S of the layer count, in order."""
  points = list(graph.cut_points())
  n, chosen = len(graph.nodes), []
  for k in range(1, num_stages):
    target = k * n / num_stages - 1
    # Leave enough later cut points for the stages still to come.
    room = points[:len(points) - (num_stages - 1 - k)]
    options = [p for p in room if not chosen or p > chosen[-1]]
    chosen.append(min(options, key=lambda p: (abs(p - target), p)))
  return tuple(chosen)


def _explicit_cuts(graph: LayerGraph, cut_layers: Sequence[str],
                   num_stages: int) -> Tuple[int, ...]:
  if len(cut_layers) != num_stages - 1:
    raise ValueError(f"--pipeline_split names {len(cut_layers)} cut layers; "
                     f"{num_stages} stages need {num_stages - 1}")
  points = set(graph.cut_points())
  cuts = []
  names = [n.name for n in graph.nodes]
  for name in cut_layers:
    if name not in names:
      raise ValueError(f"--pipeline_split: model {graph.name!r} has no layer "
                       f"{name!r}")
    i = names.index(name)
    if i not in points:
      crossing = graph.crossing_tensors(i)
      near = sorted(points, key=lambda p: abs(p - i))[:3]
      raise ValueError(
          f"--pipeline_split: layer {name!r} is not a cut point "
          f"({len(crossing)} tensors cross after it: {list(crossing)}); "
          f"nearest cut layers: {[graph.nodes[p].name for p in sorted(near)]}")
    cuts.append(i)
  if cuts != sorted(set(cuts)):
    raise ValueError(f"--pipeline_split: cut layers {list(cut_layers)} must be "
                     "distinct and in model order")
  return tuple(cuts)


def partition(graph: LayerGraph, times_s: Mapping[str, float], *,
              num_stages: int, batch_size: int, mode: str = "auto",
              cut_layers: Sequence[str] = (),
              bandwidth_bytes_per_s: Optional[float] = None,
              replicas: int = 1,
              update_s: Optional[Mapping[str, float]] = None,
              num_microbatches: int = 1,
              update_call_s: float = 0.0,
              gradient_sum_s_per_byte: float = 0.0) -> StagePlan:
  """Splits `graph` into `num_stages` stages at its cut points.

  Args:
    graph: the layer graph.
    times_s: forward + backward seconds per layer name at `batch_size`.
    num_stages: S, at least 1.
    batch_size: the micro-batch the times are for; activation bytes are
      scaled from the graph's batch to it.
    mode: auto (min-max of stage time), even (layer count), explicit.
    cut_layers: for explicit, the S - 1 layers stages end with.
    bandwidth_bytes_per_s: link between stages (and within replicas);
      None: communication is free.
    replicas: data-parallel replicas of every stage.
    update_s: each layer's share of the optimizer's update, seconds per
      step, by name (None: not counted).
    update_call_s: the fixed cost of one optimizer step, paid once by
      every stage that has weights.
    num_microbatches: M, the micro-batches of a step, which weighs the
      per-micro-batch times against the once-a-step update.
    gradient_sum_s_per_byte: seconds per parameter byte of adding one
      micro-batch's gradients into the step's (`Profile.
      gradient_sum_s_per_byte`; 0: not counted).

  Raises:
    ValueError: one line naming what cannot be split and why.
  """
  if mode not in MODES:
    raise ValueError(f"Invalid value for argument `mode`. Received: {mode!r};"
                     f" allowed: {', '.join(MODES)}")
  num_cuts = len(graph.cut_points())
  if not 1 <= num_stages <= num_cuts + 1:
    raise ValueError(f"--pipeline_stages={num_stages}: model {graph.name!r} "
                     f"has {num_cuts} cut points, so 1 to {num_cuts + 1} "
                     "stages")
  if replicas < 1:
    raise ValueError(f"Invalid value for argument `replicas`. Received: "
                     f"{replicas}; allowed: an integer >= 1")
  if num_microbatches < 1:
    raise ValueError(f"Invalid value for argument `num_microbatches`. "
                     f"Received: {num_microbatches}; allowed: an integer >= 1")
  costs = _Costs(graph, times_s, batch_size, bandwidth_bytes_per_s, replicas,
                 update_s, num_microbatches, update_call_s,
                 gradient_sum_s_per_byte)
  if mode == "auto":
    cuts = _auto_cuts(graph, costs, num_stages)
    reason = (f"the busiest stage per step is the least of every split at "
              f"the {num_cuts} cut points (min-max dynamic programme)")
  elif mode == "even":
    cuts = _even_cuts(graph, num_stages)
    reason = "about equal layer counts, at the nearest cut points"
  else:
    cuts = _explicit_cuts(graph, cut_layers, num_stages)
    reason = "cut after the layers asked for"
  return evaluate_cuts(graph, times_s, cuts, batch_size=batch_size,
                       bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                       replicas=replicas, mode=mode, reason=reason,
                       update_s=update_s, num_microbatches=num_microbatches,
                       update_call_s=update_call_s,
                       gradient_sum_s_per_byte=gradient_sum_s_per_byte)
