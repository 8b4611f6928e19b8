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
Before every timed call a buffer larger than the caches is swept
(`overlap_core.planning.cache`): in training a layer's weights come from
memory, not from the cache its previous repeat left them in.

Given the trainer's optimizer (`optimizer_factory`), every layer with
trainable weights also has its update timed: a fresh optimizer built over
that layer's weights alone, applying gradients in a `tf.function`, once
untimed (the trace), then `warmup` and `repeats` times. The gradients are
the model's own, from one backward of the whole model: an update's time
depends on their values, and behind ReLUs many are exactly zero. A pipeline
stage updates once per step, so the update has no batch size. On the same
gradients, the profile times adding them to a running sum in a
`tf.function`, as the pipeline's GPipe schedule does for each micro-batch
after a step's first (`Profile.gradient_sum_s_per_byte`).

  profile = profile_layers(model, batch_sizes=(4, 8, 16),
                           optimizer_factory=keras.optimizers.Adam,
                           optimizer_name="adam")
  open("resnet18.profile.json", "w").write(profile.to_json())
"""

import os
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import keras
import tensorflow as tf

from overlap_core.planning import cache
from overlap_core.planning.profile import (LayerTiming, Profile,
                                           UpdateTiming, utc_now_iso)
from tfoverlap.planning.graph import node_names, ordered_nodes


def profile_layers(model: keras.Model, *,
                   batch_sizes: Sequence[int] = (2, 4, 8), warmup: int = 2,
                   repeats: int = 5, name: str = "", device: str = "",
                   seed: int = 0,
                   optimizer_factory: Optional[Callable[[], object]] = None,
                   optimizer_name: str = "") -> Profile:
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
    optimizer_factory: () -> the trainer's (unbuilt) optimizer; None
      times no updates.
    optimizer_name: what the profile records as its optimizer.

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
  updates: List[UpdateTiming] = []
  call_s = gradient_sum_rate = 0.0
  generator = tf.random.Generator.from_seed(seed)
  try:
    with tf.device(device):
      flush = _cache_flusher(device)
      for batch in batch_sizes:
        shape = (int(batch),) + tuple(model.inputs[0].shape[1:])
        values = _record_values(model, nodes,
                                generator.normal(shape, dtype=tf.float32))
        for node in nodes:
          fwd, bwd = _time_node(node, values, warmup, repeats, flush)
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
      smallest = (int(min(batch_sizes)),) + tuple(model.inputs[0].shape[1:])
      grads = _model_gradients(model, generator.normal(smallest))
      gradient_sum_rate = _gradient_sum_s_per_byte(list(grads.values()),
                                                   warmup, repeats, flush)
      if optimizer_factory is not None:
        updates = _time_updates(nodes, names, optimizer_factory, grads,
                                warmup, repeats, flush)
        call_s = _call_seconds(optimizer_factory, warmup, repeats, flush)
  finally:
    for variable, value in zip(model.variables, saved):
      variable.assign(value)
  return Profile(model=name or model.name,
                 framework=f"tensorflow {tf.__version__}",
                 device=device, warmup=warmup, repeats=repeats,
                 dtype=keras.config.dtype_policy().compute_dtype,
                 date=utc_now_iso(), timings=tuple(timings),
                 # 0 is TensorFlow's "size the pool to the host".
                 threads=(tf.config.threading.get_intra_op_parallelism_threads()
                          or os.cpu_count() or 0),
                 optimizer=optimizer_name if updates else "",
                 updates=tuple(updates),
                 update_call_s=call_s if updates else 0.0,
                 gradient_sum_s_per_byte=gradient_sum_rate)


def _cache_flusher(device: str) -> Callable[[], None]:
  """A call that sweeps a buffer larger than the device's caches (made
  under the caller's `tf.device`)."""
  kind = tf.DeviceSpec.from_string(device).device_type or "CPU"
  size = cache.flush_bytes(kind) // 4
  buffer = tf.Variable(tf.zeros([size]), trainable=False)

  @tf.function
  def sweep():
    buffer.assign_add(tf.ones([size]))
    return buffer[0]

  return lambda: sweep().numpy()


def _model_gradients(model, example) -> Dict[int, tf.Tensor]:
  """id(variable) -> its gradient from one backward of the whole model.

  The loss is the outputs' mean square: the profiler knows no targets,
  and which gradients are zero is decided by the activations (a ReLU
  that did not fire passes none back), not by the loss.
  """
  with tf.GradientTape() as tape:
    outputs = model(example, training=True)
    loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, tf.float32)))
                     for o in tf.nest.flatten(outputs)])
  variables = model.trainable_variables
  grads = tape.gradient(loss, variables)
  return {id(v): tf.zeros_like(v) if g is None else g
          for v, g in zip(variables, grads)}


def _gradient_sum_s_per_byte(grads: List[tf.Tensor], warmup: int,
                             repeats: int, flush: Callable[[], None]) -> float:
  """Seconds per gradient byte of adding the model's gradients to a
  running sum of them, in a `tf.function` (the first call traces it,
  untimed); 0 for a model without weights."""
  num_bytes = sum(int(tf.size(g)) * g.dtype.size for g in grads)
  if not num_bytes:
    return 0.0
  add_all = tf.function(lambda sums, new: [a + b for a, b in zip(sums, new)])
  add_all(grads, grads)
  seconds = []
  for k in range(warmup + repeats):
    flush()
    begin = time.perf_counter()
    # A function call returns once its ops ran; reading a sum makes sure.
    add_all(grads, grads)[-1].numpy()
    if k >= warmup:
      seconds.append(time.perf_counter() - begin)
  return statistics.median(seconds) / num_bytes


def _time_updates(nodes, names, optimizer_factory, grads_by_variable,
                  warmup: int, repeats: int, flush: Callable[[], None]
                  ) -> List[UpdateTiming]:
  """Each weighted layer's optimizer step on the model's gradients (the
  caller puts the weights back afterwards)."""
  updates = []
  for node in nodes:
    variables = list(getattr(node.operation, "trainable_variables", ()))
    if not variables:
      continue
    grads = [grads_by_variable[id(v)] for v in variables]
    seconds = _apply_seconds(optimizer_factory(), grads, variables, warmup,
                             repeats, flush)
    updates.append(UpdateTiming(
        layer=names[id(node)],
        param_bytes=int(sum(v.numpy().nbytes for v in variables)),
        update_s=statistics.median(seconds),
        update_spread_s=max(seconds) - min(seconds)))
  return updates


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


def _call_seconds(optimizer_factory, warmup: int, repeats: int,
                  flush: Callable[[], None]) -> float:
  """The optimizer's step over one 1-element variable: what every call
  costs whatever it updates."""
  variable = keras.Variable(tf.zeros([1]))
  return statistics.median(_apply_seconds(
      optimizer_factory(), [tf.zeros([1])], [variable], warmup, repeats,
      flush))


def _apply_seconds(optimizer, grads, variables, warmup: int, repeats: int,
                   flush: Callable[[], None]) -> List[float]:
  """`repeats` timed applies, each after a cache sweep; one untimed apply
  first (the trace), then `warmup`."""
  # Built outside the traced function: it creates the slot variables.
  optimizer.build(variables)
  apply = tf.function(lambda: optimizer.apply(grads, variables))
  seconds = []
  for k in range(1 + warmup + repeats):
    flush()
    begin = time.perf_counter()
    apply()
    # The update returns nothing to wait on; reading a weight does.
    variables[0].numpy()
    if k > warmup:
      seconds.append(time.perf_counter() - begin)
  return seconds


def _time_node(node, values, warmup: int, repeats: int,
               flush: Callable[[], None]):
  forward, forward_backward = _bind(node, values)
  # Tracing is not a warm-up: the first calls build the graphs, untimed.
  forward().numpy()
  forward_backward().numpy()
  forward_s, total_s = [], []
  for k in range(warmup + repeats):
    flush()
    fwd = _timed(forward)
    flush()
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
