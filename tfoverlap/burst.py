"""Burst parallelism in TensorFlow, in one process: a width per layer.

Each layer of a Keras model whose layers form one chain (Sequential, or a
functional model without branches) runs on its planned number k of
devices (GPUs, or logical CPU devices): its input batch is split into k
contiguous parts (`split_samples`, the planner's split), the layer runs on
each part on its own device, and the parts are concatenated on the first
device. Each part's backward runs on the part's device too (`_run_part`).
The layers' variables are shared, so the gradient of each
variable is already the sum over the parts: no all-reduce is needed in one
process. TensorFlow moves the parts between devices itself.

  forward = make_burst_forward(model, widths_for_model(model, plan),
                               ["/cpu:0", "/cpu:1"])
  with tf.GradientTape() as tape:
    loss = loss_fn(y, forward(x, training=True))

On a CPU host the logical devices share one thread pool, so this shows the
mechanics and their overhead, not a speed-up. BatchNorm normalizes over
each part, as unsynchronized data parallelism does.
"""

import re
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import keras
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from overlap_core.planning.burst import BurstPlan, check_plan_layers
from overlap_core.planning.burst_costs import split_samples
from overlap_core.planning.graph import neutral_names


def chain_layers(model: keras.Model) -> list:
  """The model's layers in order, when each reads the one before it.

  Raises:
    ValueError: a layer reads something else (a branch or a skip).
  """
  layers = [l for l in model.layers
            if not isinstance(l, keras.layers.InputLayer)]
  for before, layer in zip(layers, layers[1:]):
    parents = [n.operation for node in layer._inbound_nodes  # pylint: disable=protected-access
               for n in node.parent_nodes]
    if parents and parents != [before]:
      raise ValueError(f"layer {layer.name!r} does not read only layer "
                       f"{before.name!r}; the TensorFlow burst runtime runs "
                       "models whose layers form one chain")
  return layers


# PyTorch traces these as nodes of their own, and the zoo's Keras layers
# hold them: a ReLU is its Conv2D's or Dense's activation, the float32 cast
# is the float32_output layer. A plan entry of any other kind with no Keras
# layer means the plan is for another model.
HELD_OP_TYPES = ("relu", "float")


def widths_for_model(model: keras.Model, plan: BurstPlan) -> dict:
  """A plan's widths for a Keras model, by Keras layer name.

  Plans name layers neutrally (`neutral_layer_name`), and the zoo's Keras
  layers carry those names. A Keras layer the plan names takes its width;
  one it does not name runs at the width of the layer before it, where its
  input already is; a plan entry PyTorch traces apart (HELD_OP_TYPES) runs
  inside the Keras layer that holds it.

  Raises:
    ValueError: one line: the plan does not name the model's first layer,
      or names a layer the model lacks, or lacks a layer with weights.
  """
  layers = chain_layers(model)
  neutral = neutral_names(layer.name for layer in layers)
  by_name = {neutral[layer.name]: layer for layer in layers}
  foreign = [lp for lp in plan.layers
             if lp.layer not in by_name and lp.op_type not in HELD_OP_TYPES]
  if foreign:
    raise ValueError(f"the plan names layer {foreign[0].layer!r} "
                     f"({foreign[0].op_type}), which model {model.name!r} "
                     f"lacks ({len(foreign)} such layers); allowed: a plan "
                     "made for this model by python -m "
                     "tfoverlap.burst_plan (or torch_parity.burst_plan)")
  widths_by_layer = plan.widths_by_layer()
  first = neutral[layers[0].name]
  if first not in widths_by_layer:
    raise ValueError(f"the plan has no width for the model's first layer "
                     f"{first!r}; is it a plan for this model?")
  unplanned = [layer.name for layer in layers if layer.trainable_weights
               and neutral[layer.name] not in widths_by_layer]
  if unplanned:
    raise ValueError(f"layer {unplanned[0]!r} of the model has weights and "
                     f"no width in the plan ({len(unplanned)} such layers)")
  widths, k = {}, None
  for layer in layers:
    k = widths_by_layer.get(neutral[layer.name], k)
    widths[layer.name] = k
  return widths


def check_plan(model: keras.Model, widths_by_layer: Mapping[str, int],
               devices: Sequence[str]) -> None:
  """Refuses a plan that does not name exactly the model's layers, or that
  needs more devices than given.

  Raises:
    ValueError: one line naming the first layer at fault.
  """
  check_plan_layers([layer.name for layer in chain_layers(model)],
                    widths_by_layer, max_width=len(devices),
                    max_width_reason="the devices given")


def make_burst_forward(model: keras.Model,
                       widths_by_layer: Mapping[str, int],
                       devices: Sequence[str],
                       placements: Optional[list] = None) -> Callable:
  """A forward function running every layer on its planned devices.

  Args:
    model: a Keras model whose layers form one chain.
    widths_by_layer: the plan's width of every layer, by layer name.
    devices: device names; a layer of width k runs on the first k.
    placements: if given, gets (layer, samples, device) for every part
      computed in eager mode: where the work really ran.
  """
  check_plan(model, widths_by_layer, devices)
  layers = chain_layers(model)

  def forward(x, training: bool = False):
    for index, layer in enumerate(layers):
      k = widths_by_layer[layer.name]
      if k == 1:
        with tf.device(devices[0]), tf.name_scope(_part_scope(index, 0)):
          x = _run_part(layer, x, training, devices[0])
        continue
      parts = tf.split(x, list(split_samples(int(x.shape[0]), k)), axis=0)
      outs = []
      for part_index, (device, part) in enumerate(zip(devices, parts)):
        with tf.device(device), tf.name_scope(_part_scope(index, part_index)):
          outs.append(_run_part(layer, part, training, device))
        if placements is not None and tf.executing_eagerly():
          placements.append((layer.name, int(part.shape[0]),
                             outs[-1].device))
      with tf.device(devices[0]):
        x = tf.concat(outs, axis=0)
    return x

  return forward


def _run_part(layer, x, training: bool, device: str):
  """layer(x), whose backward runs on `device` as its forward does.

  TensorFlow 2's tape places a gradient op by the device scope around
  `tape.gradient`, not beside the op it differentiates (TF1's
  `colocate_gradients_with_ops` has no TF2 counterpart), so without this
  every part's backward ran where the step calls `tape.gradient`: one
  device. The part becomes one `tf.custom_gradient` op whose gradient
  function replays an inner tape under `tf.device(device)`. The inner tape
  keeps the forward's activations, as the outer tape would: nothing is
  recomputed, unlike `tf.recompute_grad`, and the gradient ops are the ones
  the plain tape would make, so the step's numbers do not change. A
  hand-written backward loop in the step would do the same with more code
  to keep equal to the tape's.
  """

  # Graph-mode custom_gradient takes no keyword arguments: `training` is
  # closed over.
  @tf.custom_gradient
  def part(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x, training=training)

    # `variables`: those the forward read (the layer's weights, and state
    # such as BatchNorm's moving averages, whose gradient is None).
    def backward(dy, variables=()):
      with tf.device(device):
        grads = tape.gradient(y, [x, *variables], output_gradients=dy)
      return grads[0], grads[1:]

    return y, backward

  return part(x)


# Every part of a layer runs under its own name scope, so the ops of an
# executed step tell which layer and part they computed, wherever they ran.
# The tape names a gradient op "gradient_tape/<its forward op's scope>/...",
# so a part's backward ops carry the part's scope too.
_PART_OP = re.compile(r"^(gradient_tape/)?burst(\d+)_(\d+)/")
# Ops that move or read tensors around a part's compute, not the compute.
_NOT_COMPUTE = ("_Send", "_Recv", "_Arg", "_Retval", "ReadVariableOp",
                "Identity", "Const", "NoOp")


def _part_scope(layer_index: int, part_index: int) -> str:
  return f"burst{layer_index}_{part_index}"


def placements_of_step(model: keras.Model, run_metadata) -> Dict[str, dict]:
  """Where each layer's parts computed in an executed step.

  Args:
    model: the model the burst forward ran.
    run_metadata: the `RunMetadata` of a step that ran it (its functions'
      partition graphs: the graphs as TensorFlow placed them).

  Returns:
    layer name -> {"forward": per part, "backward": per part}, each part
    the sorted devices ("CPU:1") of its compute ops in that direction; []
    for a part with none (no gradient flows back into a first layer
    without weights). A step that did not run the burst forward gives {}.
  """
  layers = chain_layers(model)
  found: Dict[Tuple[str, int, int], set] = {}
  for function in run_metadata.function_graphs:
    for graph in function.partition_graphs:
      for node in graph.node:
        match = _PART_OP.match(node.name)
        if match is None or node.op in _NOT_COMPUTE or not node.device:
          continue
        spec = tf.DeviceSpec.from_string(node.device)
        direction = "backward" if match.group(1) else "forward"
        key = (direction, int(match.group(2)), int(match.group(3)))
        found.setdefault(key, set()).add(
            f"{spec.device_type}:{spec.device_index}")
  num_parts: Dict[int, int] = {}
  for _, index, part in found:
    num_parts[index] = max(num_parts.get(index, 0), part + 1)
  placements: Dict[str, dict] = {}
  for index, k in sorted(num_parts.items()):
    placements[layers[index].name] = {
        direction: [sorted(found.get((direction, index, part), ()))
                    for part in range(k)]
        for direction in ("forward", "backward")}
  return placements


def record_first_step_placements(train_step: Callable, model: keras.Model,
                                 placements: dict) -> Callable:
  """train_step, whose first call fills `placements` (placements_of_step).

  Only the first call collects run metadata: it costs time on every op.
  """

  measured = False

  def step(batch):
    nonlocal measured
    if measured:
      return train_step(batch)
    measured = True
    # tf.function exposes no public per-call RunMetadata in TF2; the eager
    # context's is the one that holds the partition graphs.
    context.enable_run_metadata()
    try:
      loss = train_step(batch)
    finally:
      metadata = context.export_run_metadata()
      context.disable_run_metadata()
    placements.update(placements_of_step(model, metadata))
    return loss

  return step
