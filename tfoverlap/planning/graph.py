"""A Keras functional model's layer graph, read from the model's own nodes.

A functional model already is a graph: every layer call left a `Node` that
names its input tensors, and every output tensor remembers the node that
made it (`_keras_history`). Walking those links back from the outputs gives
one `LayerNode` per layer call, in the order the model was written (a
depth-first post-order, so a ResNet block's main path comes before its
shortcut, as in the Python code that built it). The cut points (between
plain layers, and between ResNet or Inception blocks, never inside one)
follow from the edges alone, in `overlap_core.planning.graph`.

  graph = build_layer_graph(model, batch_size=8)    # any functional model
  graph = build_zoo_graph("resnet18", image_size=32, batch_size=8)
"""

import math
from typing import Dict, List, Tuple

import keras
import tensorflow as tf

from overlap_core.planning.graph import MODEL_INPUT, LayerGraph, LayerNode
from tfoverlap.models import build_model


def build_zoo_graph(name: str, *, image_size: int, batch_size: int,
                    num_classes: int = 10) -> LayerGraph:
  """The graph of zoo model `name` at that batch size."""
  model = build_model(name, image_size=image_size, num_classes=num_classes)
  return build_layer_graph(model, batch_size=batch_size, name=name)


def build_layer_graph(model: keras.Model, *, batch_size: int,
                      name: str = "") -> LayerGraph:
  """Reads a single-input functional Keras model into a LayerGraph.

  Nothing runs: shapes come from the model's symbolic tensors, with the
  batch dimension set to `batch_size`.

  Args:
    model: a functional `keras.Model` (built from `keras.Input`), or a
      `keras.Sequential` whose input shape is known.
    batch_size: the batch at which shapes and activation bytes are recorded.
    name: the graph's name (default: the model's name).

  Returns:
    The neutral graph; node names are the Keras layer names (a layer called
    twice gets "_" appended to its second node's name).

  Raises:
    ValueError: the model is not functional, or has more than one input.
  """
  if batch_size < 1:
    raise ValueError(f"Invalid value for argument `batch_size`. Received: "
                     f"{batch_size}; allowed: an integer >= 1")
  inputs = _model_inputs(model)
  nodes = ordered_nodes(model)
  names = node_names(nodes)
  producer = {id(inputs[0]): MODEL_INPUT}
  layer_nodes = []
  for node in nodes:
    layer = names[id(node)]
    for tensor in node.outputs:
      producer[id(tensor)] = layer
    layer_nodes.append(_layer_node(node, layer, producer, batch_size))
  input_shape = _at_batch(inputs[0].shape, batch_size)
  return LayerGraph(
      name=name or model.name, batch_size=int(batch_size),
      input_shape=input_shape,
      input_bytes=math.prod(input_shape) * _itemsize(inputs[0].dtype),
      nodes=tuple(layer_nodes))


def _model_inputs(model: keras.Model) -> List:
  try:
    inputs = list(model.inputs)
  except (AttributeError, ValueError):
    inputs = []
  if len(inputs) != 1 or not getattr(model, "outputs", None):
    raise ValueError(f"Invalid value for argument `model`. Received: "
                     f"{model.name!r} with {len(inputs)} symbolic inputs; "
                     "allowed: a functional model (keras.Input -> layers ->"
                     " keras.Model) with exactly one input")
  return inputs


def ordered_nodes(model: keras.Model) -> List:
  """The model's layer-call nodes, producers first (input layers left out).

  Iterative depth-first post-order from the outputs: each node after all
  the nodes it reads, branches in the order their tensors were passed.
  """
  order, done = [], set()
  stack = [(tensor, False) for tensor in reversed(list(model.outputs))]
  while stack:
    tensor, expanded = stack.pop()
    operation, node_index, _ = tensor._keras_history  # pylint: disable=protected-access
    node = operation._inbound_nodes[node_index]  # pylint: disable=protected-access
    if id(node) in done:
      continue
    if node.is_input or expanded:
      done.add(id(node))
      if not node.is_input:
        order.append(node)
      continue
    stack.append((tensor, True))
    stack.extend((t, False) for t in reversed(list(node.input_tensors)))
  return order


def node_names(nodes) -> Dict[int, str]:
  """id(node) -> its LayerGraph name: the layer name, unique per call."""
  names, used = {}, set()
  for node in nodes:
    layer = node.operation.name
    while layer in used:
      layer += "_"
    used.add(layer)
    names[id(node)] = layer
  return names


def _at_batch(shape, batch_size: int) -> Tuple[int, ...]:
  """A symbolic shape with its batch dimension (None) set."""
  dims = list(shape)
  if dims and dims[0] is None:
    dims[0] = batch_size
  return tuple(int(d) if d is not None else 1 for d in dims)


def _itemsize(dtype) -> int:
  # tf.as_dtype knows bfloat16, which NumPy does not by name.
  return tf.as_dtype(getattr(dtype, "name", dtype)).size


def _tensor_bytes(tensors, batch_size: int) -> int:
  return sum(math.prod(_at_batch(t.shape, batch_size)) * _itemsize(t.dtype)
             for t in tensors)


def _layer_config(operation, in_tensors, out_tensors,
                  batch_size: int) -> Dict[str, float]:
  """The numbers the cost model fits on; FLOPs are forward, per sample.

  Channels-last: a 4-D tensor is [batch, height, width, channels].
  """
  config: Dict[str, float] = {}
  first = in_tensors[0] if in_tensors else None
  if first is not None and len(first.shape) == 4:
    config["channels"] = int(first.shape[-1])
    config["spatial"] = int(first.shape[1])
  out_elems = sum(math.prod(_at_batch(t.shape, 1)) for t in out_tensors)
  flops = float(out_elems)  # elementwise layers: about one op per output
  if isinstance(operation, keras.layers.Conv2D) and first is not None:
    out = out_tensors[0].shape
    kernel = tuple(operation.kernel_size)
    in_channels = int(first.shape[-1])
    config.update(in_channels=in_channels, out_channels=operation.filters,
                  kernel=int(kernel[0]), stride=int(operation.strides[0]))
    flops = float(2 * in_channels // operation.groups * operation.filters *
                  kernel[0] * kernel[1] * out[1] * out[2])
  elif isinstance(operation, keras.layers.Dense) and first is not None:
    in_features = int(first.shape[-1])
    config.update(in_features=in_features, out_features=operation.units)
    flops = float(2 * in_features * operation.units)
  config["flops_per_sample"] = flops
  config["bytes_per_sample"] = float(
      _tensor_bytes(in_tensors, batch_size) +
      _tensor_bytes(out_tensors, batch_size)) / batch_size
  return config


def _layer_node(node, layer: str, producer: Dict[int, str],
                batch_size: int) -> LayerNode:
  operation = node.operation
  in_tensors = list(node.input_tensors)
  out_tensors = list(node.outputs)
  params = sum(math.prod(w.shape) * _itemsize(w.dtype)
               for w in getattr(operation, "trainable_weights", ()))
  return LayerNode(
      name=layer, op_type=type(operation).__name__.lower(),
      config=_layer_config(operation, in_tensors, out_tensors, batch_size),
      inputs=tuple(dict.fromkeys(producer[id(t)] for t in in_tensors)),
      output_shape=_at_batch(out_tensors[0].shape, batch_size),
      param_bytes=int(params),
      activation_bytes=_tensor_bytes(out_tensors, batch_size))
