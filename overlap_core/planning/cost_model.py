"""A fitted per-layer cost model: layer time from the layer's configuration.

Per layer type ("conv2d", "linear", ...), a polynomial regression
(`polyfit.PolynomialFit`) of forward and backward seconds against features
of the layer:

  flops+bytes    forward FLOPs and activation bytes moved at the batch
                 (what a roofline says time follows), and the layer's
                 parameter bytes, read once per call whatever the batch:
                 profiled with cold caches, a 512-channel convolution on
                 a 2x2 map spends its time fetching its 9 MiB of weights;
  configuration  the batch and the layer's own numbers (channels, spatial
                 size, kernel, stride), as the study this comes from fitted.

Each family tries a few (feature set, degree) candidates and keeps the one
with the smallest error on **held-out configurations**: group k-fold where
a group is one configuration at all its batch sizes, so the error is that
of predicting a layer shape never profiled. The fit weighs each sample by
1 / time^2, i.e. it minimizes relative error, so cheap layers (ReLU, add)
are not drowned by the convolutions.

The fits are for what was never profiled: another layer shape, another
batch. A layer the profile timed at the batch asked for keeps its measured
forward and backward (`CostModel.predict`; `fitted` is the fit alone). A
family's fit weighs its many cheap layers like its few expensive ones,
and on this project's CPU host it put VGG-16's
512-channel convolutions and its 4096-wide linear layer, most of a stage's
time, at about half what they measured while the family's median error
stayed in single digits. A plan sums layers, so it reads what was measured
where it can.

The optimizer's update runs once per step over a layer's parameters,
whatever the batch, in one optimizer call per stage. Each layer was timed
in a call of its own, so every timing holds the call's fixed cost (0.7 ms
for Adam with cold caches, on this project's CPU host; 100 one-tensor
calls took ten times as long as one call over the 100 tensors): a layer's
share is its timing less that cost (`Profile.update_call_s`), and a stage
pays the cost once. A layer the profile timed keeps its measured share:
with no batch to scale to, a fit has nothing to add there, and same-sized
layers really differ (Adam's step slows where gradients are zero, and
deeper layers have more). For layers not timed, a fit predicts it from
the parameter bytes alone (`UpdateFit`: linear, relative error,
leave-one-layer-out error reported like the families').

  model = fit_cost_model([(graph, profile)])
  print(model.report())
  fwd_s, bwd_s = model.predict(graph.nodes[3], batch_size=16)
  fit_fwd_s, fit_bwd_s = model.fitted(graph.nodes[3], batch_size=16)
  update_s = model.predict_update(graph.nodes[3])
"""

import dataclasses
import statistics
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from overlap_core.planning.graph import LayerGraph, LayerNode
from overlap_core.planning.polyfit import PolynomialFit, group_k_fold
from overlap_core.planning.profile import Profile, UpdateTiming

_DERIVED = ("flops_per_sample", "bytes_per_sample", "param_bytes")
# (feature set, polynomial degree), simplest first: on a tie the simpler wins.
CANDIDATES = (("flops+bytes", 1), ("flops+bytes", 2), ("configuration", 2))
MIN_CONFIGS_FOR_HOLDOUT = 3


def features(node_config: Mapping[str, float], batch_size: int,
             feature_set: str, keys: Sequence[str] = ()) -> List[float]:
  """The regression inputs of one layer at one batch.

  `keys` are the configuration numbers of the family (a layer lacking one,
  such as a ReLU after a flatten that has no spatial size, reads 0).
  """
  if feature_set == "flops+bytes":
    return [batch_size * float(node_config.get("flops_per_sample", 0.0)),
            batch_size * float(node_config.get("bytes_per_sample", 0.0)),
            float(node_config.get("param_bytes", 0.0))]
  if feature_set == "configuration":
    return [float(batch_size)] + [float(node_config.get(k, 0.0))
                                  for k in keys]
  raise ValueError(f"Invalid value for argument `feature_set`. Received: "
                   f"{feature_set!r}; allowed: flops+bytes, configuration")


@dataclasses.dataclass(frozen=True)
class Sample:
  """One measured layer at one batch: the unit the model is fitted on."""
  op_type: str
  config: Mapping[str, float]
  batch_size: int
  forward_s: float
  backward_s: float

  @property
  def config_key(self) -> Tuple:
    return tuple(sorted(self.config.items()))


@dataclasses.dataclass(frozen=True)
class FamilyFit:
  """The fit of one layer type, with its own held-out error.

  Attributes:
    op_type: the layer type.
    feature_set, degree: the chosen candidate.
    num_samples, num_configs: what it was fitted on.
    holdout_error: median |predicted - measured| / measured of the total
      (forward + backward) time over held-out configurations; None when
      fewer than MIN_CONFIGS_FOR_HOLDOUT configurations were profiled.
    candidate_errors: the same error for every candidate tried.
    backward_over_forward: median measured ratio (the study saw about 2).
  """
  op_type: str
  feature_set: str
  degree: int
  num_samples: int
  num_configs: int
  holdout_error: Optional[float]
  candidate_errors: Mapping[str, Optional[float]]
  backward_over_forward: float
  config_keys: Tuple[str, ...]
  estimator: PolynomialFit = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class UpdateFit:
  """The optimizer update of a layer's parameters, against their bytes.

  share_s = intercept_s + seconds_per_byte x param_bytes, fitted for
  relative error (weights 1 / time^2) over the shares (`update_shares`)
  of every layer the profile timed. An Adam or momentum step reads and
  writes each parameter and its state a fixed number of times, so time
  follows bytes; the intercept is what a layer adds beyond that.

  Attributes:
    optimizer: whose step was timed.
    num_layers: layers it was fitted on.
    holdout_error: median relative error of each layer predicted by the
      fit on the others; None below MIN_CONFIGS_FOR_HOLDOUT layers.
  """
  optimizer: str
  intercept_s: float
  seconds_per_byte: float
  num_layers: int
  holdout_error: Optional[float]

  def predict(self, param_bytes: int) -> float:
    """Seconds of one update of `param_bytes`; 0 for a parameterless layer."""
    if param_bytes <= 0:
      return 0.0
    return max(self.intercept_s + self.seconds_per_byte * param_bytes, 0.0)


def _line(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
  """(intercept, slope) of y on x minimizing relative error; a line through
  the origin's mean ratio when every x is the same."""
  weights = [1.0 / max(y, 1e-12) ** 2 for _, y in points]
  total = sum(weights)
  mean_x = sum(w * x for w, (x, _) in zip(weights, points)) / total
  mean_y = sum(w * y for w, (_, y) in zip(weights, points)) / total
  var_x = sum(w * (x - mean_x) ** 2 for w, (x, _) in zip(weights, points))
  if var_x <= 0:
    return 0.0, mean_y / mean_x if mean_x else 0.0
  slope = sum(w * (x - mean_x) * (y - mean_y)
              for w, (x, y) in zip(weights, points)) / var_x
  return mean_y - slope * mean_x, slope


def fit_updates(optimizer: str,
                updates: Sequence[UpdateTiming]) -> Optional[UpdateFit]:
  """The update fit of a profile's timings; None when there are none.

  A profile whose layers' shares all came out at zero (each update no
  longer than the call's fixed cost, as tiny layers on a busy host give)
  still timed the update: its fit adds nothing per layer, on 0 layers.
  """
  if not updates:
    return None
  points = [(float(u.param_bytes), u.update_s) for u in updates
            if u.param_bytes > 0 and u.update_s > 0]
  if not points:
    return UpdateFit(optimizer=optimizer, intercept_s=0.0,
                     seconds_per_byte=0.0, num_layers=0, holdout_error=None)
  holdout = None
  if len(points) >= MIN_CONFIGS_FOR_HOLDOUT:
    errors = []
    for i, (x, y) in enumerate(points):
      intercept, slope = _line(points[:i] + points[i + 1:])
      errors.append(abs(max(intercept + slope * x, 0.0) - y) / y)
    holdout = statistics.median(errors)
  intercept, slope = _line(points)
  return UpdateFit(optimizer=optimizer, intercept_s=intercept,
                   seconds_per_byte=slope, num_layers=len(points),
                   holdout_error=holdout)


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Per-type fits; predicts forward and backward seconds of any layer,
  and its optimizer update when the profile timed updates."""
  families: Mapping[str, FamilyFit]
  update: Optional[UpdateFit] = None
  # (layer name, parameter bytes) -> the layer's measured share of the update
  updates_measured: Mapping[Tuple[str, int], float] = dataclasses.field(
      default_factory=dict)
  update_call_s: float = 0.0  # one optimizer call's fixed cost
  # adding one micro-batch's gradients into a step's, per parameter byte
  gradient_sum_s_per_byte: float = 0.0
  # (layer name, layer_key, batch) -> the profiled (forward_s, backward_s)
  timings_measured: Mapping[Tuple[str, Tuple, int],
                            Tuple[float, float]] = dataclasses.field(
                                default_factory=dict)

  def predict(self, node: LayerNode, batch_size: int) -> Tuple[float, float]:
    """(forward_s, backward_s) of `node` at `batch_size`, never negative:
    as profiled when a profile timed this layer at this batch, else the
    family's fit (`fitted`).

    Raises:
      KeyError: neither timed nor a layer type that was profiled.
    """
    measured = self.timings_measured.get(
        (node.name, layer_key(node), int(batch_size)))
    if measured is not None:
      return measured
    return self.fitted(node, batch_size)

  def fitted(self, node: LayerNode, batch_size: int) -> Tuple[float, float]:
    """(forward_s, backward_s) of `node` at `batch_size` from its family's
    fit alone, never negative: what the held-out errors describe.

    Raises:
      KeyError: no layer of this type was profiled.
    """
    family = self.families.get(node.op_type)
    if family is None:
      raise KeyError(f"the cost model has no fit for layer type "
                     f"{node.op_type!r} (layer {node.name!r}); profiled types:"
                     f" {sorted(self.families)}")
    x = [features(layer_config(node), batch_size, family.feature_set,
                  family.config_keys)]
    forward_s, backward_s = family.estimator.predict(x)[0]
    return max(float(forward_s), 0.0), max(float(backward_s), 0.0)

  def predict_graph(self, graph: LayerGraph,
                    batch_size: int) -> Dict[str, float]:
    """Forward + backward seconds of every node, by name."""
    return {n.name: sum(self.predict(n, batch_size)) for n in graph.nodes}

  def predict_update(self, node: LayerNode) -> float:
    """Seconds of `node`'s share of the optimizer's update, once per step
    (the call's fixed cost, `update_call_s`, comes once per stage on top):
    as measured when a profile timed this layer, else from the fit; 0 when
    no update was profiled (the plan then leaves it out)."""
    measured = self.updates_measured.get((node.name, node.param_bytes))
    if measured is not None:
      return measured
    return self.update.predict(node.param_bytes) if self.update else 0.0

  def predict_updates(self, graph: LayerGraph) -> Dict[str, float]:
    """`predict_update` of every node, by name."""
    return {n.name: self.predict_update(n) for n in graph.nodes}

  def report(self) -> str:
    rows = ["Cost model: per layer type, error on held-out configurations "
            "(median |pred - meas| / meas of fwd+bwd)",
            f"{'type':<16} {'samples':>7} {'configs':>7} {'features':<14} "
            f"{'deg':>3} {'held-out err':>12} {'bwd/fwd':>7}"]
    for op_type, f in sorted(self.families.items()):
      err = ("n/a (<3 configs)" if f.holdout_error is None
             else f"{f.holdout_error:.1%}")
      rows.append(f"{op_type:<16} {f.num_samples:>7} {f.num_configs:>7} "
                  f"{f.feature_set:<14} {f.degree:>3} {err:>12} "
                  f"{f.backward_over_forward:>7.2f}")
    if self.update is None:
      rows.append("optimizer update: not profiled, so stage times leave "
                  "it out")
    elif not self.update.num_layers:
      rows.append(f"optimizer update ({self.update.optimizer}, once per "
                  f"step): a call {self.update_call_s * 1e3:.3f} ms; no "
                  "layer's share measured above the call's own cost, so "
                  "layers add none")
    else:
      u = self.update
      err = ("n/a (<3 layers)" if u.holdout_error is None
             else f"{u.holdout_error:.1%}")
      rows.append(f"optimizer update ({u.optimizer}, once per step): a "
                  f"call {self.update_call_s * 1e3:.3f} ms, and per layer "
                  f"{u.intercept_s * 1e6:.1f} us + "
                  f"{u.seconds_per_byte * 2**20 * 1e3:.3f} ms per MiB of "
                  f"parameters; fitted on {u.num_layers} layers, held-out "
                  f"error {err}; used for layers not timed, the "
                  f"{len(self.updates_measured)} timed keep their own")
    if self.gradient_sum_s_per_byte:
      rows.append(f"gradient sum (each micro-batch after a step's first): "
                  f"{self.gradient_sum_s_per_byte * 2**20 * 1e3:.3f} ms per "
                  "MiB of parameters, as profiled")
    rows.append(f"forward and backward: the {len(self.timings_measured)} "
                "(layer, batch) pairs the profile timed keep their measured "
                "times; the fits above predict every other")
    return "\n".join(rows)


def layer_config(node: LayerNode) -> Dict[str, float]:
  """The numbers the model reads of a layer: its config and its
  parameter bytes."""
  return {**node.config, "param_bytes": float(node.param_bytes)}


def layer_key(node: LayerNode) -> Tuple:
  """What makes two layers of one name the same layer to time: its type
  and configuration (profiles of different models may share names)."""
  return (node.op_type, tuple(sorted(layer_config(node).items())))


def samples_from(graph: LayerGraph, profile: Profile) -> List[Sample]:
  """Joins a profile's timings with its graph's layer configurations."""
  by_name = {n.name: n for n in graph.nodes}
  samples = []
  for t in profile.timings:
    node = by_name.get(t.layer)
    if node is None:
      raise ValueError(f"profile of {profile.model!r} times layer "
                       f"{t.layer!r}, which graph {graph.name!r} lacks")
    samples.append(Sample(node.op_type, layer_config(node), t.batch_size,
                          t.forward_s, t.backward_s))
  return samples


def fit_cost_model(measured: Sequence[Tuple[LayerGraph, Profile]] = (),
                   samples: Sequence[Sample] = ()) -> CostModel:
  """Fits one family per layer type on profiles (and/or raw samples).

  Args:
    measured: (graph, profile) pairs; several models may be pooled.
    samples: further samples, e.g. a synthetic family.

  Returns:
    A CostModel whose families each report their held-out error.
  """
  pooled = list(samples)
  updates: List[UpdateTiming] = []
  optimizers, call_s, sum_rates = set(), [], []
  timed: Dict[Tuple[str, Tuple, int], List[Tuple[float, float]]] = {}
  for graph, profile in measured:
    pooled += samples_from(graph, profile)
    by_name = {n.name: n for n in graph.nodes}
    for t in profile.timings:
      key = (t.layer, layer_key(by_name[t.layer]), t.batch_size)
      timed.setdefault(key, []).append((t.forward_s, t.backward_s))
    if profile.updates:
      updates += update_shares(profile)
      optimizers.add(profile.optimizer)
      call_s.append(profile.update_call_s)
    if profile.gradient_sum_s_per_byte:
      sum_rates.append(profile.gradient_sum_s_per_byte)
  if len(optimizers) > 1:
    raise ValueError(f"profiles time the updates of different optimizers "
                     f"{sorted(optimizers)}; pool profiles of one")
  by_type: Dict[str, List[Sample]] = {}
  for s in pooled:
    by_type.setdefault(s.op_type, []).append(s)
  return CostModel({t: _fit_family(t, ss) for t, ss in by_type.items()},
                   update=fit_updates(next(iter(optimizers), ""), updates),
                   updates_measured={(u.layer, u.param_bytes): u.update_s
                                     for u in updates},
                   update_call_s=statistics.median(call_s) if call_s else 0.0,
                   gradient_sum_s_per_byte=(statistics.median(sum_rates)
                                            if sum_rates else 0.0),
                   # Pooled profiles that timed one layer agree to within
                   # their noise; the median of each direction stands.
                   timings_measured={
                       key: (statistics.median(f for f, _ in pairs),
                             statistics.median(b for _, b in pairs))
                       for key, pairs in timed.items()})


def update_shares(profile: Profile) -> List[UpdateTiming]:
  """The profile's update timings less the fixed cost of a call, >= 0."""
  return [dataclasses.replace(
      u, update_s=max(u.update_s - profile.update_call_s, 0.0))
          for u in profile.updates]


def config_keys(samples: Sequence[Sample]) -> Tuple[str, ...]:
  """The configuration numbers any sample of a family has, sorted."""
  return tuple(sorted({k for s in samples for k, v in s.config.items()
                       if k not in _DERIVED and isinstance(v, (int, float))}))


def _fit(samples: Sequence[Sample], feature_set: str, degree: int,
         keys: Sequence[str]):
  x = [features(s.config, s.batch_size, feature_set, keys) for s in samples]
  y = [[s.forward_s, s.backward_s] for s in samples]
  weights = [1.0 / max(s.forward_s + s.backward_s, 1e-12) ** 2
             for s in samples]
  # Standardized first (PolynomialFit): FLOPs (1e9) and kernel sizes (3)
  # in one polynomial would otherwise leave the least squares badly
  # conditioned.
  return PolynomialFit.fit(x, y, degree=degree, sample_weight=weights)


def _holdout_error(samples: Sequence[Sample], feature_set: str,
                   degree: int, keys: Sequence[str]) -> float:
  """Median relative error of the total over group k-fold by configuration."""
  keys = sorted({s.config_key for s in samples})
  groups = [keys.index(s.config_key) for s in samples]
  errors = []
  for train, test in group_k_fold(groups, n_splits=min(5, len(keys))):
    estimator = _fit([samples[i] for i in train], feature_set, degree, keys)
    for i in test:
      s = samples[i]
      pred = estimator.predict(
          [features(s.config, s.batch_size, feature_set, keys)])[0]
      measured = s.forward_s + s.backward_s
      predicted = max(pred[0], 0.0) + max(pred[1], 0.0)
      errors.append(abs(predicted - measured) / max(measured, 1e-12))
  return statistics.median(errors)


def _fit_family(op_type: str, samples: Sequence[Sample]) -> FamilyFit:
  num_configs = len({s.config_key for s in samples})
  keys = config_keys(samples)
  ratios = [s.backward_s / s.forward_s for s in samples if s.forward_s > 0]
  errors: Dict[str, Optional[float]] = {}
  if num_configs >= MIN_CONFIGS_FOR_HOLDOUT:
    for feature_set, degree in CANDIDATES:
      errors[f"{feature_set}/{degree}"] = _holdout_error(
          samples, feature_set, degree, keys)
    best = min(CANDIDATES, key=lambda c: errors[f"{c[0]}/{c[1]}"])
  else:
    # Too few shapes to hold one out: the simplest model, which still
    # extrapolates to new shapes through their FLOPs and bytes.
    best = CANDIDATES[0]
  feature_set, degree = best
  return FamilyFit(
      op_type=op_type, feature_set=feature_set, degree=degree,
      num_samples=len(samples), num_configs=num_configs,
      holdout_error=errors.get(f"{feature_set}/{degree}"),
      candidate_errors=errors,
      backward_over_forward=statistics.median(ratios) if ratios else 0.0,
      config_keys=keys, estimator=_fit(samples, feature_set, degree, keys))
