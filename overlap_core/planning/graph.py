"""A framework-neutral layer graph, and the cut points where a model can split.

Each framework side reads its model into a `LayerGraph` (PyTorch through
torch.fx, Keras through the functional graph); everything after that (cost
model, partitioner, reports) works on this plain data only.

A node is one layer (a leaf module or one traced function such as an add).
Nodes are stored in topological order. A **cut point** after node i is a
place where the model can be split into two pipeline stages: exactly one
distinct tensor flows from nodes[:i+1] (and the model input) to
nodes[i+1:]. Inside a ResNet block the skip tensor and the main path both
cross, and inside an Inception block every branch crosses, so cut points
fall only between blocks: this is the block-level abstraction of the study
the pipeline planner comes from, derived rather than declared.

JSON schema (schema_version 1):

  {"schema_version": 1,
   "name": "resnet18",          # the model
   "batch_size": 8,             # the batch the shapes and bytes were read at
   "input_shape": [8, 3, 32, 32],
   "input_bytes": 98304,
   "nodes": [                   # topological order
     {"name": "layer1.0.conv1",  # unique; the framework's own layer path
      "op_type": "conv2d",      # lower-case layer kind, the cost model's family
      "config": {"in_channels": 64, "out_channels": 64, "kernel": 3,
                 "stride": 1, "spatial": 8,
                 "flops_per_sample": 4718592,  # forward FLOPs of one sample
                 "bytes_per_sample": 32768},   # input + output bytes, one sample
      "inputs": ["maxpool"],    # producer node names; "input" is the model's
      "output_shape": [8, 64, 8, 8],
      "param_bytes": 147456,
      "activation_bytes": 131072}]}   # output bytes at batch_size

  g = LayerGraph.from_json(text)
  g.cut_points()        # (3, 7, ...): indices i with a cut after nodes[i]
  g.neutral_names()     # {"features.0": "features_0"}: what plans say
  print(g.summary()); open("g.dot", "w").write(g.to_dot())
"""

import dataclasses
import json
import shutil
import subprocess
from typing import Dict, Mapping, Optional, Sequence, Tuple

SCHEMA_VERSION = 1
MODEL_INPUT = "input"  # the producer name of the model's input tensor
# PyTorch joins a module path with "."; Keras layer names are flat, and the
# zoo names its Keras layers after the PyTorch paths with "_" for ".".
_PATH_SEPARATOR, _NEUTRAL_SEPARATOR = ".", "_"


def neutral_layer_name(framework_name: str) -> str:
  """The name a layer goes by in a plan that both frameworks run.

  A graph's node names are the framework's own ("features.0" in PyTorch,
  "features_0" in Keras); a plan made from one framework's graph is read by
  the other, so it names each layer by this spelling, and each side maps
  its own layer names through this function before matching them.

    neutral_layer_name("features.0") == neutral_layer_name("features_0")
  """
  return framework_name.replace(_PATH_SEPARATOR, _NEUTRAL_SEPARATOR)


def neutral_names(framework_names) -> Dict[str, str]:
  """framework name -> neutral name, for names of one model.

  Raises:
    ValueError: two layers go by the same neutral name (such as "a.b" and
      "a_b"), so a plan could not tell them apart.
  """
  names, owner = {}, {}
  for name in framework_names:
    neutral = neutral_layer_name(name)
    if neutral in owner:
      raise ValueError(f"layers {owner[neutral]!r} and {name!r} both go by "
                       f"the neutral name {neutral!r}; rename one so that a "
                       "plan can tell them apart")
    owner[neutral] = name
    names[name] = neutral
  return names


@dataclasses.dataclass(frozen=True)
class LayerNode:
  """One layer: what it is, what it reads, what it produces and holds.

  Attributes:
    name: unique in the graph; the framework's layer path.
    op_type: the layer kind ("conv2d", "linear", "add", ...).
    config: numbers that describe the layer for the cost model (channels,
      kernel, spatial size, flops_per_sample, bytes_per_sample).
    inputs: names of the producing nodes; MODEL_INPUT for the model input.
    output_shape: the output's shape at the graph's batch size.
    param_bytes: bytes of the trainable parameters the layer owns.
    activation_bytes: bytes of its output at the graph's batch size.
  """
  name: str
  op_type: str
  config: Mapping[str, float]
  inputs: Tuple[str, ...]
  output_shape: Tuple[int, ...]
  param_bytes: int
  activation_bytes: int

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["config"] = dict(self.config)
    d["inputs"] = list(self.inputs)
    d["output_shape"] = list(self.output_shape)
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "LayerNode":
    return cls(name=d["name"], op_type=d["op_type"], config=dict(d["config"]),
               inputs=tuple(d["inputs"]),
               output_shape=tuple(d["output_shape"]),
               param_bytes=int(d["param_bytes"]),
               activation_bytes=int(d["activation_bytes"]))


@dataclasses.dataclass(frozen=True)
class LayerGraph:
  """A model as layers in topological order; see the module docstring."""
  name: str
  batch_size: int
  input_shape: Tuple[int, ...]
  input_bytes: int
  nodes: Tuple[LayerNode, ...]

  def __post_init__(self):
    seen = {MODEL_INPUT}
    for node in self.nodes:
      if node.name in seen:
        raise ValueError(f"Invalid layer graph: node name {node.name!r} is "
                         "repeated (or is the reserved name 'input')")
      missing = [i for i in node.inputs if i not in seen]
      if missing:
        raise ValueError(f"Invalid layer graph: node {node.name!r} reads "
                         f"{missing} before they are produced; nodes must be "
                         "in topological order")
      seen.add(node.name)

  @property
  def edges(self) -> Tuple[Tuple[str, str], ...]:
    """(producer, consumer) pairs, MODEL_INPUT included as a producer."""
    return tuple((src, n.name) for n in self.nodes for src in n.inputs)

  def index(self, name: str) -> int:
    for i, node in enumerate(self.nodes):
      if node.name == name:
        return i
    raise KeyError(f"no layer named {name!r} in graph {self.name!r}")

  def crossing_tensors(self, i: int) -> Tuple[str, ...]:
    """Distinct producers in nodes[:i+1] (or the input) read after node i."""
    position = {n.name: k for k, n in enumerate(self.nodes)}
    position[MODEL_INPUT] = -1
    crossing = []
    for node in self.nodes[i + 1:]:
      for src in node.inputs:
        if position[src] <= i and src not in crossing:
          crossing.append(src)
    return tuple(crossing)

  def cut_points(self) -> Tuple[int, ...]:
    """Indices i where exactly one tensor crosses from nodes[:i+1] onward.

    The last node is never a cut (nothing follows it).
    """
    return tuple(i for i in range(len(self.nodes) - 1)
                 if len(self.crossing_tensors(i)) == 1)

  def segments(self) -> Tuple[Tuple[int, int], ...]:
    """[start, end) node ranges between consecutive cut points: the blocks."""
    bounds = [0] + [i + 1 for i in self.cut_points()] + [len(self.nodes)]
    return tuple(zip(bounds[:-1], bounds[1:]))

  def neutral_names(self) -> Dict[str, str]:
    """Node name -> the name plans give it (`neutral_layer_name`).

    Raises:
      ValueError: two nodes go by the same neutral name.
    """
    return neutral_names(n.name for n in self.nodes)

  @property
  def param_bytes(self) -> int:
    return sum(n.param_bytes for n in self.nodes)

  def summary(self) -> str:
    """A table: one row per layer, a '--- cut ---' line at every cut point."""
    cuts = set(self.cut_points())
    rows = [f"Layer graph {self.name}: {len(self.nodes)} layers, "
            f"{len(cuts)} cut points, {self.param_bytes / 2**20:.2f} MiB "
            f"parameters, batch {self.batch_size}, input "
            f"{list(self.input_shape)}",
            f"{'#':>4}  {'layer':<34} {'type':<14} {'output':<20} "
            f"{'params MiB':>10} {'act MiB':>9}"]
    for i, n in enumerate(self.nodes):
      rows.append(f"{i:>4}  {n.name:<34} {n.op_type:<14} "
                  f"{str(list(n.output_shape)):<20} "
                  f"{n.param_bytes / 2**20:>10.3f} "
                  f"{n.activation_bytes / 2**20:>9.3f}")
      if i in cuts:
        rows.append(f"{'':>4}  --- cut {i} ---")
    return "\n".join(rows)

  def to_dot(self) -> str:
    """Graphviz DOT text; the nodes after which a cut is allowed are boxed."""
    cuts = {self.nodes[i].name for i in self.cut_points()}
    lines = [f'digraph "{self.name}" {{', "  rankdir=TB;",
             f'  "{MODEL_INPUT}" [shape=oval];']
    for n in self.nodes:
      shape = "box, style=bold" if n.name in cuts else "ellipse"
      lines.append(f'  "{n.name}" [label="{n.name}\\n{n.op_type} '
                   f'{list(n.output_shape)}", shape={shape}];')
    lines += [f'  "{src}" -> "{dst}";' for src, dst in self.edges]
    lines.append("}")
    return "\n".join(lines) + "\n"

  def write_png(self, path: str) -> Optional[str]:
    """Renders to PNG with graphviz `dot` if it is installed; else None."""
    dot = shutil.which("dot")
    if dot is None:
      return None
    subprocess.run([dot, "-Tpng", "-o", path], input=self.to_dot(),
                   text=True, check=True, timeout=120)
    return path

  def to_dict(self) -> dict:
    return {"schema_version": SCHEMA_VERSION, "name": self.name,
            "batch_size": self.batch_size,
            "input_shape": list(self.input_shape),
            "input_bytes": self.input_bytes,
            "nodes": [n.to_dict() for n in self.nodes]}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1)

  @classmethod
  def from_dict(cls, d: dict) -> "LayerGraph":
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
      raise ValueError(f"Invalid layer graph: schema_version={version!r}; "
                       f"allowed: {SCHEMA_VERSION}")
    return cls(name=d["name"], batch_size=int(d["batch_size"]),
               input_shape=tuple(d["input_shape"]),
               input_bytes=int(d["input_bytes"]),
               nodes=tuple(LayerNode.from_dict(n) for n in d["nodes"]))

  @classmethod
  def from_json(cls, text: str) -> "LayerGraph":
    return cls.from_dict(json.loads(text))


def chain(name: str, layers: Sequence[Tuple[str, str, Dict[str, float]]],
          *, batch_size: int = 1, activation_bytes: Sequence[int] = (),
          param_bytes: Sequence[int] = ()) -> LayerGraph:
  """A straight chain of layers: every boundary is a cut. For tests, examples.

  Args:
    name: the graph's name.
    layers: (name, op_type, config) per layer, in order.
    batch_size: the batch the bytes describe.
    activation_bytes: per layer (default 0).
    param_bytes: per layer (default 0).
  """
  nodes, previous = [], MODEL_INPUT
  for k, (layer, op_type, config) in enumerate(layers):
    nodes.append(LayerNode(
        name=layer, op_type=op_type, config=dict(config), inputs=(previous,),
        output_shape=(batch_size,),
        param_bytes=int(param_bytes[k]) if param_bytes else 0,
        activation_bytes=int(activation_bytes[k]) if activation_bytes else 0))
    previous = layer
  return LayerGraph(name=name, batch_size=batch_size,
                    input_shape=(batch_size,), input_bytes=0,
                    nodes=tuple(nodes))
