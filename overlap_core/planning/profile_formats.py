"""Profiles of other shapes, read into the shared LayerGraph and Profile.

Two formats, so that a plan can be compared with another planner's on the
very same numbers:

deeppool         DeepPool's own files (Park et al., "Efficient Strong
                 Scaling Through Burst Parallel Training", MLSys 2022),
                 read by `deeppool_format.read_deeppool`: its job
                 description for the layers and its runtime's per-layer
                 time table for the times.
per_layer_times  this project's own interchange table, read by
                 `read_per_layer_times` and written by
                 `write_per_layer_times`: layers by integer id with their
                 predecessors, and for each layer [forward, backward]
                 milliseconds per per-device batch. It carries no layer
                 graph (the command takes the model's) and is no other
                 project's format:

  {"format": "per_layer_times", "version": 1,
   "model": "vgg16",
   "device": "cuda:0 (NVIDIA H200)",       # optional
   "layers": [
     {"id": 0, "name": "features.0", "type": "conv2d", "prev": [],
      "times_ms": {"1": [0.12, 0.25], "8": [0.4, 0.9]}},
     {"id": 1, "name": "features.1", "type": "relu", "prev": [0],
      "times_ms": {"1": [0.01, 0.02], "8": [0.03, 0.05]}}]}

`name` must match the layer graph's node names (a missing name falls back
to "layer<id>"); `prev` is read for checking only (ids must refer to
earlier layers). Spreads are not carried: they read back as 0.

  profile = read_per_layer_times(text)
  text = write_per_layer_times(profile)
"""

import json
from typing import Dict, List

from overlap_core.planning.profile import LayerTiming, Profile

FORMAT = "per_layer_times"
VERSION = 1


def _bad(message: str) -> ValueError:
  return ValueError(f"Invalid {FORMAT} profile: {message}")


def read_per_layer_times(text: str, *, framework: str = "external") -> Profile:
  """A Profile from the table above; one-line ValueError on bad input."""
  try:
    d = json.loads(text)
  except json.JSONDecodeError as e:
    raise _bad(f"not JSON ({e.msg} at line {e.lineno})") from None
  if not isinstance(d, dict) or d.get("format") != FORMAT:
    raise _bad(f"format={d.get('format') if isinstance(d, dict) else None!r}"
               f"; allowed: {FORMAT!r}")
  if d.get("version") != VERSION:
    raise _bad(f"version={d.get('version')!r}; allowed: {VERSION}")
  timings: List[LayerTiming] = []
  seen: Dict[int, str] = {}
  for layer in d.get("layers", []):
    layer_id = layer.get("id")
    name = layer.get("name") or f"layer{layer_id}"
    if not isinstance(layer_id, int) or layer_id in seen:
      raise _bad(f"layer {name!r} has id={layer_id!r}; allowed: a unique "
                 "integer")
    unknown = [p for p in layer.get("prev", []) if p not in seen]
    if unknown:
      raise _bad(f"layer {name!r} names predecessors {unknown} that are not"
                 " earlier layers")
    seen[layer_id] = name
    for batch, pair in sorted(layer.get("times_ms", {}).items(),
                              key=lambda kv: int(kv[0])):
      if (not isinstance(pair, list) or len(pair) != 2
          or any(not isinstance(t, (int, float)) or t < 0 for t in pair)):
        raise _bad(f"layer {name!r} at batch {batch}: {pair!r}; allowed: "
                   "[forward_ms, backward_ms], both >= 0")
      timings.append(LayerTiming(
          layer=name, op_type=layer.get("type", "unknown"),
          batch_size=int(batch), forward_s=pair[0] / 1e3,
          backward_s=pair[1] / 1e3))
  if not timings:
    raise _bad("no layer has any time")
  return Profile(model=d.get("model", ""), framework=framework,
                 device=d.get("device", "unknown"), warmup=0, repeats=1,
                 timings=tuple(timings))


def write_per_layer_times(profile: Profile) -> str:
  """The table above from a Profile, layers in the profile's order."""
  layers, ids = [], {}
  for t in profile.timings:
    if t.layer not in ids:
      ids[t.layer] = len(layers)
      prev = [len(layers) - 1] if layers else []
      layers.append({"id": ids[t.layer], "name": t.layer,
                     "type": t.op_type, "prev": prev, "times_ms": {}})
    layers[ids[t.layer]]["times_ms"][str(t.batch_size)] = [
        t.forward_s * 1e3, t.backward_s * 1e3]
  return json.dumps({"format": FORMAT, "version": VERSION,
                     "model": profile.model, "device": profile.device,
                     "layers": layers}, indent=1)
