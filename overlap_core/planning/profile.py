"""The per-layer profile: measured forward and backward times of each layer.

One schema for both frameworks and for every planner (the pipeline
partitioner here; a burst-parallel planner needs the same numbers at several
per-device batch sizes, which is why each layer has one entry per batch).

JSON schema (schema_version 1):

  {"schema_version": 1,
   "model": "resnet18",           # the LayerGraph's name
   "framework": "torch 2.13.0",   # what ran the layers
   "device": "cpu",               # "cpu", "cuda:0 (NVIDIA H200)", ...
   "dtype": "float32",
   "date": "2026-11-20T10:00:00+00:00",   # ISO 8601, UTC
   "warmup": 2,                   # untimed runs before timing, per entry
   "repeats": 5,                  # timed runs per entry; times are medians
   "timings": [
     {"layer": "layer1.0.conv1",  # a LayerNode name
      "op_type": "conv2d",
      "batch_size": 8,            # samples in the timed call
      "forward_s": 0.0012,        # median of `repeats` runs, seconds
      "backward_s": 0.0025,       # gradient w.r.t. input and parameters
      "forward_spread_s": 0.0001, # max - min of the repeats
      "backward_spread_s": 0.0002}]}

  p = Profile.from_json(text)
  p.time_s("layer1.0.conv1", batch_size=8)   # forward + backward
"""

import dataclasses
import datetime
import json
from typing import Dict, Optional, Tuple

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class LayerTiming:
  """One layer at one batch size; times are medians of the repeats."""
  layer: str
  op_type: str
  batch_size: int
  forward_s: float
  backward_s: float
  forward_spread_s: float = 0.0
  backward_spread_s: float = 0.0

  @property
  def total_s(self) -> float:
    return self.forward_s + self.backward_s


@dataclasses.dataclass(frozen=True)
class Profile:
  """Measured layer times of one model on one device; see module docstring."""
  model: str
  framework: str
  device: str
  warmup: int
  repeats: int
  timings: Tuple[LayerTiming, ...]
  dtype: str = "float32"
  date: str = ""

  @property
  def batch_sizes(self) -> Tuple[int, ...]:
    return tuple(sorted({t.batch_size for t in self.timings}))

  def lookup(self) -> Dict[Tuple[str, int], LayerTiming]:
    return {(t.layer, t.batch_size): t for t in self.timings}

  def timing(self, layer: str, batch_size: int) -> Optional[LayerTiming]:
    return self.lookup().get((layer, batch_size))

  def time_s(self, layer: str, batch_size: int) -> float:
    """Forward + backward seconds; KeyError names what was not profiled."""
    t = self.timing(layer, batch_size)
    if t is None:
      raise KeyError(f"layer {layer!r} was not profiled at batch "
                     f"{batch_size}; profiled batches: {self.batch_sizes}")
    return t.total_s

  def summary(self) -> str:
    """Per layer: forward and backward ms at each profiled batch."""
    batches = self.batch_sizes
    rows = [f"Profile of {self.model} on {self.device} ({self.framework}, "
            f"{self.dtype}, warm-up {self.warmup}, median of {self.repeats})",
            f"{'layer':<34} " + " ".join(f"{'b=' + str(b) + ' fwd/bwd ms':>20}"
                                         for b in batches)]
    table = self.lookup()
    for layer in dict.fromkeys(t.layer for t in self.timings):
      cells = []
      for b in batches:
        t = table.get((layer, b))
        cells.append(f"{'-':>20}" if t is None else
                     f"{t.forward_s * 1e3:>9.3f}/{t.backward_s * 1e3:<10.3f}")
      rows.append(f"{layer:<34} " + " ".join(cells))
    return "\n".join(rows)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["timings"] = [dataclasses.asdict(t) for t in self.timings]
    return {"schema_version": SCHEMA_VERSION, **d}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1)

  @classmethod
  def from_dict(cls, d: dict) -> "Profile":
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
      raise ValueError(f"Invalid profile: schema_version={version!r}; "
                       f"allowed: {SCHEMA_VERSION}")
    return cls(model=d["model"], framework=d["framework"], device=d["device"],
               warmup=int(d["warmup"]), repeats=int(d["repeats"]),
               dtype=d.get("dtype", "float32"), date=d.get("date", ""),
               timings=tuple(LayerTiming(**t) for t in d["timings"]))

  @classmethod
  def from_json(cls, text: str) -> "Profile":
    return cls.from_dict(json.loads(text))


def utc_now_iso() -> str:
  """The `date` a profile records: now, UTC, to the second."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")
