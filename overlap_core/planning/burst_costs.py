"""What one burst-parallel layer costs at a given width: compute and comms.

The burst planner (`burst.py`) asks two questions of every layer and every
candidate width k (the number of devices the layer runs on):

  compute   forward + backward seconds of the layer on the most loaded of
            its k devices. The global batch B is split into k contiguous
            parts of B // k or B // k + 1 samples (`split_samples`), and a
            layer runs at the pace of its largest part. The time at a batch
            b comes from the profile: the measured value where b was
            profiled, linear interpolation between the two profiled batches
            around b, and the fitted cost model (`cost_model.py`) outside
            the profiled range. Without a cost model, a batch outside the
            range is an error naming the layer and the batch.
  comms     (`CommModel`, one bandwidth in bytes/s per device link, and a
            fixed latency per message):
            - gradient all-reduce of the layer's parameters within its k
              devices, as a ring: 2 (k - 1) / k x param_bytes / bandwidth
              + latency (0 for k = 1);
            - redistribution of an activation between a producer on k_from
              devices and a consumer on k_to devices (DeepPool's scatter
              and gather): only samples that change device move. The time
              is that of the busiest device, max over devices of the bytes
              it sends or receives / bandwidth + latency, twice: the
              activation forward and its gradient backward.
            A bandwidth of None means communication is free.

Device sets are nested prefixes: a layer of width k runs on devices
0 .. k-1, so layers of equal width share one set and one process group,
and device 0 takes part in every layer.
"""

import dataclasses
from typing import Optional, Sequence, Tuple

from overlap_core.planning.cost_model import CostModel
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile


def split_samples(batch: int, num_devices: int) -> Tuple[int, ...]:
  """B samples over k devices in contiguous parts, the first B % k larger."""
  if num_devices < 1 or batch < num_devices:
    raise ValueError(f"Invalid split: batch={batch} over num_devices="
                     f"{num_devices}; allowed: 1 <= num_devices <= batch")
  base, extra = divmod(batch, num_devices)
  return tuple(base + (1 if d < extra else 0) for d in range(num_devices))


def sample_ranges(batch: int, num_devices: int) -> Tuple[Tuple[int, int], ...]:
  """[start, end) of each device's samples under `split_samples`."""
  ranges, start = [], 0
  for part in split_samples(batch, num_devices):
    ranges.append((start, start + part))
    start += part
  return tuple(ranges)


def default_widths(num_devices: int, batch: int) -> Tuple[int, ...]:
  """Powers of two up to num_devices, and num_devices itself (DeepPool's
  candidates: few process groups, few batches to profile)."""
  top = min(num_devices, batch)
  widths = {1, top}
  k = 2
  while k < top:
    widths.add(k)
    k *= 2
  return tuple(sorted(widths))


def moved_samples_per_device(batch: int, k_from: int,
                             k_to: int) -> Tuple[int, ...]:
  """For each device, max(samples it sends, samples it receives)."""
  src = sample_ranges(batch, k_from)
  dst = sample_ranges(batch, k_to)
  moved = []
  for d in range(max(k_from, k_to)):
    have = src[d] if d < k_from else (0, 0)
    need = dst[d] if d < k_to else (0, 0)
    kept = max(0, min(have[1], need[1]) - max(have[0], need[0]))
    moved.append(max(have[1] - have[0] - kept, need[1] - need[0] - kept))
  return tuple(moved)


@dataclasses.dataclass(frozen=True)
class CommModel:
  """Link bandwidth and latency; see the module docstring for the model."""
  bandwidth_bytes_per_s: Optional[float] = None
  latency_s: float = 0.0

  def __post_init__(self):
    if self.bandwidth_bytes_per_s is not None and not (
        self.bandwidth_bytes_per_s > 0):
      raise ValueError("Invalid value for argument `bandwidth_bytes_per_s`."
                       f" Received: {self.bandwidth_bytes_per_s}; allowed: "
                       "None (free) or > 0")
    if self.latency_s < 0:
      raise ValueError("Invalid value for argument `latency_s`. Received: "
                       f"{self.latency_s}; allowed: >= 0")

  def allreduce_s(self, param_bytes: int, width: int) -> float:
    if width == 1 or param_bytes == 0 or self.bandwidth_bytes_per_s is None:
      return 0.0
    ring_bytes = 2.0 * (width - 1) / width * param_bytes
    return ring_bytes / self.bandwidth_bytes_per_s + self.latency_s

  def redistribute_s(self, batch: int, bytes_per_sample: float, k_from: int,
                     k_to: int) -> float:
    if k_from == k_to or self.bandwidth_bytes_per_s is None:
      return 0.0
    busiest = max(moved_samples_per_device(batch, k_from, k_to))
    one_way_s = busiest * bytes_per_sample / self.bandwidth_bytes_per_s
    return 2.0 * (one_way_s + self.latency_s)


class LayerTimes:
  """Forward + backward seconds of a graph's layers at any batch.

  Usage:
    times = LayerTimes(graph, profile)            # profile only
    times = LayerTimes(graph, profile, model)     # model outside the range
    times.time_s("features.0", 16)
  """

  def __init__(self, graph: LayerGraph, profile: Profile,
               cost_model: Optional[CostModel] = None):
    self._nodes = {n.name: n for n in graph.nodes}
    self._points = {}
    for t in profile.timings:
      self._points.setdefault(t.layer, {})[t.batch_size] = t.total_s
    self._cost_model = cost_model

  def missing_layers(self) -> Tuple[str, ...]:
    """Graph layers with no timing at all, in graph order."""
    return tuple(n for n in self._nodes if n not in self._points)

  def time_s(self, layer: str, batch: int) -> float:
    points = self._points.get(layer)
    if not points:
      raise KeyError(f"layer {layer!r} has no profile")
    if batch in points:
      return points[batch]
    batches = sorted(points)
    if batches[0] < batch < batches[-1]:
      upper = next(b for b in batches if b > batch)
      lower = max(b for b in batches if b < batch)
      frac = (batch - lower) / (upper - lower)
      return points[lower] + frac * (points[upper] - points[lower])
    if self._cost_model is None:
      raise KeyError(f"layer {layer!r} was profiled at batches {batches}, "
                     f"not at {batch}, and no cost model was given")
    return sum(self._cost_model.predict(self._nodes[layer], batch))

  def compute_s(self, layer: str, batch: int, width: int) -> float:
    """The layer on `width` devices: the pace of its largest part."""
    return self.time_s(layer, max(split_samples(batch, width)))


def check_widths(widths: Sequence[int]) -> None:
  """Refuses a candidate width list the planner cannot use."""
  if (not widths or any(not isinstance(w, int) for w in widths)
      or sorted(set(widths)) != list(widths) or widths[0] != 1):
    raise ValueError(f"Invalid value for argument `widths`. Received: "
                     f"{list(widths)}; allowed: increasing integers "
                     "starting at 1")
