"""A small model in DeepPool's files, and the same model built natively.

The job description and the layer time table are written here by hand in
DeepPool's layout (see overlap_core/planning/profile_formats.py): a chain
that forks into two convolutions joined by a concatenation, then a
classifier whose large fixed cost and parameters keep it narrow while the
convolutions widen. `native_graph` and `native_profile` state the same
model with the project's dataclasses, with the parameter and activation
bytes worked out by hand, so a test can check the adapter against them.
"""

import json

from overlap_core.planning.graph import MODEL_INPUT, LayerGraph, LayerNode
from overlap_core.planning.profile import LayerTiming, Profile

GLOBAL_BATCH = 8
NUM_DEVICES = 4  # widths 1, 2, 4: per-device batches 8, 4, 2
BATCHES = (8, 4, 2)
RELU = {"inplace": True, "kernel_size": 1, "padding": 0, "stride": 1}
# (kind, params, prevLayers, inputDim, outputDim), ids are positions.
LAYERS = (
    ("conv2d", {"in_channels": 3, "kernel_size": 3, "out_channels": 8,
                "padding": 1, "stride": 1}, [], [3, 8, 8], [8, 8, 8]),
    ("ReLU2d", RELU, [0], [8, 8, 8], [8, 8, 8]),
    ("conv2d", {"in_channels": 8, "kernel_size": 3, "out_channels": 8,
                "padding": 1, "stride": 1}, [1], [8, 8, 8], [8, 8, 8]),
    ("conv2d", {"in_channels": 8, "kernel_size": [1, 1], "out_channels": 8,
                "padding": 0, "stride": 1}, [1], [8, 8, 8], [8, 8, 8]),
    ("concat", {"kernel_size": 1}, [2, 3], [8, 8, 8], [16, 8, 8]),
    ("flatten", {"kernel_size": 1}, [4], [16, 8, 8], 1024),
    ("linear", {"bias": True, "in_features": 1024, "out_features": 10}, [5],
     1024, 10),
)
NAMES = ("conv2d_0", "ReLU2d_1", "conv2d_2", "conv2d_3", "concat_4",
         "flatten_5", "linear_6")
OP_TYPES = ("conv2d", "relu", "conv2d", "conv2d", "cat", "flatten", "linear")
# float32 parameters, by hand: weights + one bias per output.
PARAM_BYTES = ((3 * 8 * 9 + 8) * 4, 0, (8 * 8 * 9 + 8) * 4,
               (8 * 8 * 1 + 8) * 4, 0, 0, (1024 * 10 + 10) * 4)
# Output bytes at the global batch: 8 samples x elements x 4.
ACTIVATION_BYTES = (8 * 512 * 4, 8 * 512 * 4, 8 * 512 * 4, 8 * 512 * 4,
                    8 * 1024 * 4, 8 * 1024 * 4, 8 * 10 * 4)
# (fixed_us, per_sample_us) of forward + backward: the convolutions scale,
# the classifier's fixed cost does not.
COSTS_US = ((30, 120), (6, 15), (40, 200), (20, 60), (5, 10), (3, 1),
            (300, 5))


def times_us(layer: int, batch: int):
  """(forward_us, backward_us): whole microseconds, a third forward."""
  fixed, per_sample = COSTS_US[layer]
  total = fixed + per_sample * batch
  return total // 3, total - total // 3


def job_json() -> str:
  """What DeepPool's TrainingJob.dumpInJSON writes for this model."""
  consumers = {i: [] for i in range(len(LAYERS))}
  for i, layer in enumerate(LAYERS):
    for p in layer[2]:
      consumers[p].append(i)
  layers = []
  for i, (kind, params, prev, in_dim, out_dim) in enumerate(LAYERS):
    layers.append({"id": i, "name": kind, "params": params,
                   "gpuTime": list(times_us(i, GLOBAL_BATCH)),
                   "prevLayers": prev, "nextLayers": consumers[i],
                   "inputDim": in_dim, "outputDim": out_dim,
                   "config": [GLOBAL_BATCH]})
  return json.dumps({"globalBatchSize": GLOBAL_BATCH, "maxGpusUsed": 1,
                     "layers": layers})


def key(kind: str, params: dict, batch: int, in_dim) -> str:
  return (kind + json.dumps(params, sort_keys=True, separators=(",", ":"))
          + f"[{batch}]" + json.dumps(in_dim, separators=(",", ":")))


def prof_text() -> str:
  """The runtime's table: per batch, one right-aligned line per layer
  (key, avg ms, forward us, backward us), then the batch's sum; and one
  line of a layer this model lacks, which the adapter must pass over."""
  lines = []
  for b in BATCHES:
    total_ms = 0.0
    for i, (kind, params, _, in_dim, _) in enumerate(LAYERS):
      fw, bw = times_us(i, b)
      total_ms += (fw + bw) / 1e3
      lines.append(f" {key(kind, params, b, in_dim):>110}  "
                   f"{(fw + bw) / 1e3:6.3f}  {fw:8d}  {bw:8d}")
    lines.append(f"{'SUM(avg)':>100}  {total_ms:.3f}")
  other = key("conv2d", {"in_channels": 64, "kernel_size": 3,
                         "out_channels": 64, "padding": 1, "stride": 1},
              8, [64, 56, 56])
  lines.append(f" {other:>110}   9.999      3333      6666")
  return "\n".join(lines) + "\n"


def write_files(directory):
  """job.json and layers.prof under `directory` (a pathlib.Path)."""
  job, prof = directory / "job.json", directory / "layers.prof"
  job.write_text(job_json())
  prof.write_text(prof_text())
  return job, prof


def native_graph(name: str = "deeppool") -> LayerGraph:
  nodes = []
  for i, (_, _, prev, _, out_dim) in enumerate(LAYERS):
    dims = tuple(out_dim) if isinstance(out_dim, list) else (out_dim,)
    nodes.append(LayerNode(
        name=NAMES[i], op_type=OP_TYPES[i], config={},
        inputs=tuple(NAMES[p] for p in prev) or (MODEL_INPUT,),
        output_shape=(GLOBAL_BATCH,) + dims, param_bytes=PARAM_BYTES[i],
        activation_bytes=ACTIVATION_BYTES[i]))
  return LayerGraph(name=name, batch_size=GLOBAL_BATCH,
                    input_shape=(GLOBAL_BATCH, 3, 8, 8),
                    input_bytes=GLOBAL_BATCH * 3 * 8 * 8 * 4,
                    nodes=tuple(nodes))


def native_profile(name: str = "deeppool") -> Profile:
  timings = tuple(
      LayerTiming(layer=NAMES[i], op_type=OP_TYPES[i], batch_size=b,
                  forward_s=times_us(i, b)[0] / 1e6,
                  backward_s=times_us(i, b)[1] / 1e6)
      for i in range(len(LAYERS)) for b in sorted(BATCHES))
  return Profile(model=name, framework="synthetic", device="none",
                 warmup=0, repeats=1, timings=timings)
