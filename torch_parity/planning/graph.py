"""A PyTorch model's layer graph, read with torch.fx.

`torch.fx.symbolic_trace` gives one node per leaf module and per traced
function (the residual add, a concatenation, a functional ReLU);
`ShapeProp` runs an example batch through it to record every output's shape.
Each becomes a `LayerNode` of the framework-neutral graph; the cut points
(between plain layers, and between ResNet or Inception blocks, never inside
one) follow from the edges alone, in `overlap_core.planning.graph`.

  graph = build_layer_graph(model, example_input)   # any traceable nn.Module
  graph = build_zoo_graph("resnet18", image_size=32, batch_size=8)
"""

from typing import Dict, Tuple

import torch
from torch import fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from overlap_core.planning.graph import MODEL_INPUT, LayerGraph, LayerNode
from torch_parity.models import build_model


def build_zoo_graph(name: str, *, image_size: int, batch_size: int,
                    num_classes: int = 10) -> LayerGraph:
  """The graph of zoo model `name` on a random batch of that size."""
  model = build_model(name, image_size=image_size, num_classes=num_classes)
  side = image_size // 2 if name == "edsr" else image_size
  example = torch.randn(batch_size, 3, side, side)
  return build_layer_graph(model, example, name=name)


def build_layer_graph(model: nn.Module, example_input: torch.Tensor, *,
                      name: str = "") -> LayerGraph:
  """Reads any symbolically traceable single-input module into a LayerGraph.

  Args:
    model: the module; it must trace with `torch.fx.symbolic_trace` (no
      data-dependent control flow) and take one tensor.
    example_input: a batch; its first dimension is the graph's batch size,
      at which shapes and activation bytes are recorded.
    name: the graph's name (default: the module's class name).

  Returns:
    The neutral graph; node names are module paths ("layer1.0.conv1"), and
    for traced functions "<enclosing module path>.<fx node name>".

  Raises:
    torch.fx.proxy.TraceError: the module cannot be traced symbolically.
  """
  traced = fx.symbolic_trace(model)
  was_training = traced.training
  # Eval mode: shapes are the same, and BatchNorm's running statistics
  # (shared with the caller's model) stay untouched, even at batch 1.
  traced.eval()
  try:
    with torch.no_grad():
      ShapeProp(traced).propagate(example_input)
  finally:
    traced.train(was_training)
  modules = dict(traced.named_modules())
  names = layer_names(traced)
  nodes = []
  for node in traced.graph.nodes:
    if node.op in ("call_module", "call_function", "call_method"):
      nodes.append(_layer_node(node, names, modules))
  batch = example_input.shape[0]
  return LayerGraph(
      name=name or type(model).__name__, batch_size=int(batch),
      input_shape=tuple(example_input.shape),
      input_bytes=example_input.numel() * example_input.element_size(),
      nodes=tuple(nodes))


def layer_names(traced: fx.GraphModule) -> Dict[fx.Node, str]:
  """The LayerGraph name of every fx node (MODEL_INPUT for placeholders)."""
  names, used = {}, set()
  for node in traced.graph.nodes:
    if node.op == "placeholder":
      names[node] = MODEL_INPUT
      continue
    if node.op == "call_module":
      layer = str(node.target)
    else:
      stack = node.meta.get("nn_module_stack") or {}
      path = next(reversed(stack.values()))[0] if stack else ""
      layer = f"{path}.{node.name}" if path else node.name
    while layer in used:
      layer += "_"
    used.add(layer)
    names[node] = layer
  return names


def _tensor_meta(value):
  """The TensorMetadata leaves of a node's recorded output."""
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return [value]
  if isinstance(value, (list, tuple)):
    return [m for v in value for m in _tensor_meta(v)]
  return []


def _bytes(meta) -> int:
  return sum(m.shape.numel() * _itemsize(m.dtype) for m in meta)


def _itemsize(dtype) -> int:
  return torch.empty((), dtype=dtype).element_size()


def op_type_of(node: fx.Node, modules) -> str:
  """The neutral op_type of an fx node: module class or function name."""
  if node.op == "call_module":
    return type(modules[node.target]).__name__.lower()
  if node.op == "call_method":
    return str(node.target)
  return getattr(node.target, "__name__", str(node.target)).lower()


def _layer_config(node: fx.Node, module, in_meta, out_meta,
                  batch: int) -> Dict[str, float]:
  """The numbers the cost model fits on; FLOPs are forward, per sample."""
  out_elems = sum(m.shape.numel() for m in out_meta) / batch
  config: Dict[str, float] = {}
  first = in_meta[0] if in_meta else None
  if first is not None and len(first.shape) == 4:
    config["channels"] = int(first.shape[1])
    config["spatial"] = int(first.shape[2])
  flops = out_elems  # elementwise layers: about one op per output element
  if isinstance(module, nn.Conv2d):
    out = out_meta[0].shape
    config.update(in_channels=module.in_channels,
                  out_channels=module.out_channels,
                  kernel=int(module.kernel_size[0]),
                  stride=int(module.stride[0]))
    flops = (2 * module.in_channels // module.groups * module.out_channels *
             module.kernel_size[0] * module.kernel_size[1] * out[2] * out[3])
  elif isinstance(module, nn.Linear):
    config.update(in_features=module.in_features,
                  out_features=module.out_features)
    flops = 2 * module.in_features * module.out_features
  config["flops_per_sample"] = float(flops)
  config["bytes_per_sample"] = float((_bytes(in_meta) + _bytes(out_meta)) /
                                     batch)
  return config


def _layer_node(node: fx.Node, names, modules) -> LayerNode:
  module = modules.get(node.target) if node.op == "call_module" else None
  out_meta = _tensor_meta(node.meta.get("tensor_meta"))
  producers = [a for a in node.all_input_nodes if a.op != "get_attr"]
  in_meta = [m for a in producers for m in _tensor_meta(a.meta.get(
      "tensor_meta"))]
  shape: Tuple[int, ...] = tuple(out_meta[0].shape) if out_meta else ()
  batch = int(shape[0]) if shape else 1
  params = 0 if module is None else sum(
      p.numel() * p.element_size() for p in module.parameters()
      if p.requires_grad)
  return LayerNode(
      name=names[node], op_type=op_type_of(node, modules),
      config=_layer_config(node, module, in_meta, out_meta, batch),
      inputs=tuple(dict.fromkeys(names[a] for a in producers)),
      output_shape=shape, param_bytes=int(params),
      activation_bytes=_bytes(out_meta))
