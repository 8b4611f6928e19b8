"""Burst parallelism in TensorFlow, in one process: a width per layer.

Each layer of a Keras model whose layers form one chain (Sequential, or a
functional model without branches) runs on its planned number k of
devices (GPUs, or logical CPU devices): its input batch is split into k
contiguous parts (`split_samples`, the planner's split), the layer runs on
each part on its own device, and the parts are concatenated on the first
device. The layers' variables are shared, so the gradient of each
variable is already the sum over the parts: no all-reduce is needed in one
process. TensorFlow moves the parts between devices itself.

  forward = make_burst_forward(model, plan.widths_by_layer(),
                               ["/cpu:0", "/cpu:1"])
  with tf.GradientTape() as tape:
    loss = loss_fn(y, forward(x, training=True))

On a CPU host the logical devices share one thread pool, so this shows the
mechanics and their overhead, not a speed-up. BatchNorm normalizes over
each part, as unsynchronized data parallelism does.
"""

from typing import Callable, Mapping, Optional, Sequence

import keras
import tensorflow as tf

from overlap_core.planning.burst_costs import split_samples


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


def widths_for_model(model: keras.Model,
                     widths_by_layer: Mapping[str, int]) -> dict:
  """A plan's widths (named after the PyTorch graph) for a Keras model.

  The zoo's PyTorch modules carry the Keras layer names; what PyTorch
  traces as separate functions (a ReLU, the float32 cast) is part of a
  Keras layer or a layer of its own. So a Keras layer the plan names takes
  its width; one it does not name runs at the width of the layer before
  it, where its input already is; plan entries with no Keras layer run
  inside the Keras layer that holds them.

  Raises:
    ValueError: the plan names none of the model's layers, or not its
      first one.
  """
  layers = chain_layers(model)
  if layers[0].name not in widths_by_layer:
    raise ValueError(f"the plan has no width for the model's first layer "
                     f"{layers[0].name!r}; is it a plan for this model?")
  widths, k = {}, None
  for layer in layers:
    k = widths_by_layer.get(layer.name, k)
    widths[layer.name] = k
  return widths


def check_plan(model: keras.Model, widths_by_layer: Mapping[str, int],
               devices: Sequence[str]) -> None:
  """Refuses a plan that does not name exactly the model's layers, or that
  needs more devices than given.

  Raises:
    ValueError: one line naming the first layer at fault.
  """
  names = [layer.name for layer in chain_layers(model)]
  missing = [n for n in names if n not in widths_by_layer]
  if missing:
    raise ValueError(f"layer {missing[0]!r} of the model has no width in "
                     f"the plan ({len(missing)} layers lack one)")
  extra = sorted(set(widths_by_layer) - set(names))
  if extra:
    raise ValueError(f"the plan names layer {extra[0]!r}, which the model "
                     "lacks")
  for name in names:
    k = widths_by_layer[name]
    if not 1 <= k <= len(devices):
      raise ValueError(f"layer {name!r} has width {k}; allowed: 1 to "
                       f"{len(devices)} (the devices given)")


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
    for layer in layers:
      k = widths_by_layer[layer.name]
      if k == 1:
        with tf.device(devices[0]):
          x = layer(x, training=training)
        continue
      parts = tf.split(x, list(split_samples(int(x.shape[0]), k)), axis=0)
      outs = []
      for device, part in zip(devices, parts):
        with tf.device(device):
          outs.append(layer(part, training=training))
        if placements is not None and tf.executing_eagerly():
          placements.append((layer.name, int(part.shape[0]),
                             outs[-1].device))
      with tf.device(devices[0]):
        x = tf.concat(outs, axis=0)
    return x

  return forward
