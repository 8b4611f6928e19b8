"""The per-layer profile: measured forward and backward times of each layer.

One schema for both frameworks and for every planner (the pipeline
partitioner here; a burst-parallel planner needs the same numbers at several
per-device batch sizes, which is why each layer has one entry per batch).

JSON schema (schema_version 2; version 1 files, which lack the optimizer
and its updates, still load):

  {"schema_version": 2,
   "model": "resnet18",           # the LayerGraph's name
   "framework": "torch 2.13.0",   # what ran the layers
   "device": "cpu",               # "cpu", "cuda:0 (NVIDIA H200)", ...
   "dtype": "float32",
   "date": "2026-11-20T10:00:00+00:00",   # ISO 8601, UTC
   "threads": 1,                  # intra-op threads the layers ran on
                                  # (0: not recorded; version 1 files)
   "warmup": 2,                   # untimed runs before timing, per entry
   "repeats": 5,                  # timed runs per entry; times are medians
   "timings": [
     {"layer": "layer1.0.conv1",  # a LayerNode name
      "op_type": "conv2d",
      "batch_size": 8,            # samples in the timed call
      "forward_s": 0.0012,        # median of `repeats` runs, seconds
      "backward_s": 0.0025,       # gradient w.r.t. input and parameters
      "forward_spread_s": 0.0001, # max - min of the repeats
      "backward_spread_s": 0.0002}],
   "optimizer": "adam",           # whose update `updates` timed; "" if none
   "update_call_s": 0.0007,       # its step over one 1-element parameter:
                                  # the fixed cost each update_s includes
   "updates": [                   # once per step, not per sample: no batch
     {"layer": "layer1.0.conv1",  # a LayerNode that owns parameters
      "param_bytes": 147456,      # the parameters the update touched
      "update_s": 0.0004,         # median of `repeats` optimizer steps
      "update_spread_s": 0.00005}],
   "gradient_sum_s_per_byte": 1e-10}  # adding one backward's gradients
                                  # into the step's, per parameter byte
                                  # (median of `repeats`; 0: not timed)

A pipeline stage runs its layers' forward and backward once per
micro-batch, and the optimizer's update of its parameters once per step;
a stage holding a large classifier spends much of its step there, which
is why the update is profiled per layer too. Between the two, every
micro-batch after the first adds its gradients into the step's: M - 1
passes over the stage's parameter bytes, which a profile of single
backwards (each starting from no gradients) does not see, hence the
gradient sum's rate.

  p = Profile.from_json(text)
  p.time_s("layer1.0.conv1", batch_size=8)   # forward + backward
  p.update_s("layer1.0.conv1")               # its optimizer update, or None
"""

import dataclasses
import datetime
import json
from typing import Dict, Optional, Tuple

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)


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
class UpdateTiming:
  """The optimizer's step over one layer's parameters (median of repeats)."""
  layer: str
  param_bytes: int
  update_s: float
  update_spread_s: float = 0.0


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
  optimizer: str = ""
  updates: Tuple[UpdateTiming, ...] = ()
  threads: int = 0
  update_call_s: float = 0.0
  gradient_sum_s_per_byte: float = 0.0

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

  def update_s(self, layer: str) -> Optional[float]:
    """The optimizer update of `layer`'s parameters; None if not timed."""
    for u in self.updates:
      if u.layer == layer:
        return u.update_s
    return None

  def summary(self) -> str:
    """Per layer: forward and backward ms at each profiled batch."""
    batches = self.batch_sizes
    threads = (f", {self.threads} intra-op thread"
               f"{'' if self.threads == 1 else 's'}" if self.threads else "")
    rows = [f"Profile of {self.model} on {self.device}{threads} "
            f"({self.framework}, {self.dtype}, warm-up {self.warmup}, median "
            f"of {self.repeats})",
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
    if self.updates:
      rows.append(f"{self.optimizer} update per layer (once per step; a "
                  f"call alone {self.update_call_s * 1e3:.3f} ms): "
                  + ", ".join(f"{u.layer} {u.update_s * 1e3:.3f} ms"
                              for u in self.updates))
    if self.gradient_sum_s_per_byte:
      rows.append(f"adding one backward's gradients into the step's: "
                  f"{self.gradient_sum_s_per_byte * 2**20 * 1e3:.3f} ms per "
                  "MiB of parameters")
    return "\n".join(rows)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["timings"] = [dataclasses.asdict(t) for t in self.timings]
    d["updates"] = [dataclasses.asdict(u) for u in self.updates]
    return {"schema_version": SCHEMA_VERSION, **d}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1)

  @classmethod
  def from_dict(cls, d: dict) -> "Profile":
    version = d.get("schema_version")
    if version not in READABLE_VERSIONS:
      raise ValueError(f"Invalid profile: schema_version={version!r}; "
                       f"allowed: {', '.join(map(str, READABLE_VERSIONS))}")
    return cls(model=d["model"], framework=d["framework"], device=d["device"],
               warmup=int(d["warmup"]), repeats=int(d["repeats"]),
               dtype=d.get("dtype", "float32"), date=d.get("date", ""),
               timings=tuple(LayerTiming(**t) for t in d["timings"]),
               optimizer=d.get("optimizer", ""),
               threads=int(d.get("threads", 0)),
               update_call_s=float(d.get("update_call_s", 0.0)),
               gradient_sum_s_per_byte=float(
                   d.get("gradient_sum_s_per_byte", 0.0)),
               updates=tuple(UpdateTiming(**u) for u in d.get("updates", ())))

  @classmethod
  def from_json(cls, text: str) -> "Profile":
    return cls.from_dict(json.loads(text))


def utc_now_iso() -> str:
  """The `date` a profile records: now, UTC, to the second."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")
