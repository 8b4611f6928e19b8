"""Per-layer forward and backward times of a Keras model, as a Profile.

Every layer call of the functional graph runs alone on inputs of the shapes
it sees in the model (recorded by running the whole model once per batch
size, in inference mode so that BatchNorm's statistics stay put), `warmup`
times untimed and `repeats` times timed; the medians go into the shared
profile schema (`overlap_core.planning.profile`).

Each layer is timed through two `tf.function`s on the device: its forward,
and its forward followed by the gradient with respect to its inputs and
weights. TensorFlow has no separate backward call to time, so

  backward_s = median(forward + backward) - median(forward)   (>= 0)

Both functions return a scalar sum of what they computed: reading it waits
for the device, and it keeps the forward from being pruned out of the
gradient function (a convolution's gradient does not need its output).

  profile = profile_layers(model, batch_sizes=(4, 8, 16))
  open("resnet18.profile.json", "w").write(profile.to_json())
"""

import statistics
import time
from typing import Callable, Dict, List, Sequence

import keras
import tensorflow as tf

from overlap_core.planning.profile import LayerTiming, Profile, utc_now_iso
from tfoverlap.planning.graph import node_names, ordered_nodes


def profile_layers(model: keras.Model, *,
                   batch_sizes: Sequence[int] = (2, 4, 8), warmup: int = 2,
                   repeats: int = 5, name: str = "", device: str = "",
                   seed: int = 0) -> Profile:
  """Times every layer of `model`, forward and backward, at each batch.

  Args:
    model: a functional model with one input (see `build_layer_graph`).
    batch_sizes: the batch sizes to time each layer at.
    warmup: untimed runs before timing, per layer and batch.
    repeats: timed runs; the profile keeps their median and spread.
    name: the model name the profile records (default: the model's name).
    device: where layers run ("/gpu:0", "/cpu:0"; default: the first GPU,
      else the CPU).
    seed: of the random inputs.

  Returns:
    A Profile whose layer names match `build_layer_graph(model, ...)`.
    The model's weights and statistics are as they were before.
  """
  if warmup < 0 or repeats < 1:
    raise ValueError(f"Invalid warmup/repeats: {warmup}, {repeats}; allowed: "
                     "warmup >= 0 and repeats >= 1")
  device = device or _default_device()
  nodes = ordered_nodes(model)
  names = node_names(nodes)
  # Training-mode calls move BatchNorm statistics and seed states: put every
  # variable back afterwards, so profiling leaves the caller's model as is.
  saved = [v.numpy() for v in model.variables]
  timings: List[LayerTiming] = []
  generator = tf.random.Generator.from_seed(seed)
  try:
    with tf.device(device):
      for batch in batch_sizes:
        shape = (int(batch),) + tuple(model.inputs[0].shape[1:])
        values = _record_values(model, nodes,
                                generator.normal(shape, dtype=tf.float32))
        for node in nodes:
          fwd, bwd = _time_node(node, values, warmup, repeats)
          timings.append(LayerTiming(
              layer=names[id(node)],
              op_type=type(node.operation).__name__.lower(),
              batch_size=int(batch), forward_s=statistics.median(fwd),
              backward_s=max(0.0, statistics.median(bwd) -
                             statistics.median(fwd)),
              forward_spread_s=max(fwd) - min(fwd),
              # The spread of forward + backward: backward alone is never
              # timed.
              backward_spread_s=max(bwd) - min(bwd)))
  finally:
    for variable, value in zip(model.variables, saved):
      variable.assign(value)
  return Profile(model=name or model.name,
                 framework=f"tensorflow {tf.__version__}",
                 device=device, warmup=warmup, repeats=repeats,
                 dtype=keras.config.dtype_policy().compute_dtype,
                 date=utc_now_iso(), timings=tuple(timings))


def _default_device() -> str:
  gpus = tf.config.list_logical_devices("GPU")
  return gpus[0].name if gpus else "/cpu:0"


def _call(operation, args, kwargs, training: bool):
  if getattr(operation, "_call_has_training_arg", False):
    kwargs = dict(kwargs, training=training)
  return operation(*args, **kwargs)


def _record_values(model, nodes, example) -> Dict[int, object]:
  """id(symbolic tensor) -> its value on `example`, for every tensor."""
  values = {id(model.inputs[0]): example}
  for node in nodes:
    args, kwargs = node.arguments.fill_in(values)
    outputs = _call(node.operation, args, kwargs, training=False)
    for tensor, value in zip(node.outputs, tf.nest.flatten(outputs)):
      values[id(tensor)] = value
  return values


def _bind(node, values) -> Callable:
  """The layer on its recorded inputs: (forward fn, forward+grad fn)."""
  args, kwargs = node.arguments.fill_in(values)
  structure = (args, kwargs)
  flat = tf.nest.flatten(structure)
  positions = [i for i, v in enumerate(flat)
               if tf.is_tensor(v) and v.dtype.is_floating]
  operation = node.operation

  def run(tensors):
    filled = list(flat)
    for i, tensor in zip(positions, tensors):
      filled[i] = tensor
    call_args, call_kwargs = tf.nest.pack_sequence_as(structure, filled)
    return tf.nest.flatten(_call(operation, call_args, call_kwargs,
                                 training=True))

  @tf.function
  def forward(tensors):
    return tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32))
                     for o in run(tensors)])

  @tf.function
  def forward_backward(tensors):
    with tf.GradientTape() as tape:
      tape.watch(tensors)
      outputs = run(tensors)
    sources = list(tensors) + list(operation.trainable_variables)
    grads = tape.gradient(outputs, sources,
                          output_gradients=[tf.ones_like(o) for o in outputs])
    sums = [tf.reduce_sum(tf.cast(o, tf.float32)) for o in outputs]
    sums += [tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads
             if g is not None]
    return tf.add_n(sums)

  inputs = [flat[i] for i in positions]
  return (lambda: forward(inputs)), (lambda: forward_backward(inputs))


def _time_node(node, values, warmup: int, repeats: int):
  forward, forward_backward = _bind(node, values)
  # Tracing is not a warm-up: the first calls build the graphs, untimed.
  forward().numpy()
  forward_backward().numpy()
  forward_s, total_s = [], []
  for k in range(warmup + repeats):
    fwd = _timed(forward)
    both = _timed(forward_backward)
    if k >= warmup:
      forward_s.append(fwd)
      total_s.append(both)
  return forward_s, total_s


def _timed(fn) -> float:
  """Seconds of fn(), until its scalar result is on the host."""
  begin = time.perf_counter()
  fn().numpy()
  return time.perf_counter() - begin
