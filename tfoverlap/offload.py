"""CPU offload in TensorFlow: each weighted layer's input kept in host memory.

TensorFlow's tape keeps the tensors each op saves for its gradient to
itself: there is no hook like PyTorch's saved-tensor hooks. So the
TensorFlow side offloads at layer granularity, with `tf.custom_gradient`:
every Conv and Dense layer's forward places a copy of its input on the host
(`with tf.device("/cpu:0")`) and keeps only that; its gradient function
copies the input back to the layer's device and recomputes the layer under
a tape to get the gradients. The cost is one extra forward of each of those
layers; what the rest of the model saves (BatchNorm, pooling) stays where
TensorFlow puts it. The recomputation runs the same ops on the same values,
so training computes exactly what it computes without offload.

What TensorFlow cannot express is refused (the compatibility table,
`overlap_core.runtime.compat_table`): pinned host
memory and non-blocking copies (the runtime decides both), a side-stream
prefetch, and weights living on the host between layer uses.

The ledger's `offload` phase is what offload adds to each step: in the
custom loop's one step per call, the step timed alone against the same
step traced without offload (`Offloader.paused`, `overlap_core.runtime.
offload_cost`), which holds the recomputation too; elsewhere, the copies.

Copies are counted in the graph, per executed step, in host variables,
and timed there: `tf.timestamp` before and after each copy, ordered by
control dependencies (the copy's source waits for the first stamp, the
second waits for the copy), each layer's seconds per direction summed in a
host variable that the loop reads after every step. Those seconds become
run.json's copy times and, where the step is not timed alone, the
ledger's `offload` phase (`Offloader.split_compute`). The stamps are the
host's clock around the ops, not the device's: on a GPU the span of a
copy to the host also holds the wait for the layer's input to be
computed. Op determinism (--deterministic) refuses to run `tf.timestamp`,
so there the copies are counted only (`time_copies=False`).

A restore is placed on the device the layer computes on: that of its
forward's ops where the trace gave them one (`strategy.run` traces each
replica under its device's scope), else the one its variables live on,
recorded when the layer is wrapped. Inside a tf.function a tensor's device
is usually unset (the layer's input too, even in a replica), and a restore
placed by default could land beside its host input, leaving TensorFlow to
copy it to the device implicitly, untimed and uncounted.
"""

import contextlib
import sys
from typing import Optional

import keras
import tensorflow as tf

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.offload_stats import (DIRECTIONS, TO_DEVICE,
                                                TO_HOST, CopyStats)

NO_GPU_NOTICE = ("offload: this host has no GPU, so offloaded tensors are "
                 "copied CPU to CPU: the mechanics and counts are real, no "
                 "memory is saved")
HOST_DEVICE = "/cpu:0"
# Layers whose call is a pure function of input and trainable weights, so
# recomputing them in backward changes no state (BatchNorm would update its
# moving statistics twice; Dropout would draw a new mask).
OFFLOADED_LAYERS = (keras.layers.Conv1D, keras.layers.Conv2D,
                    keras.layers.Conv3D, keras.layers.DepthwiseConv2D,
                    keras.layers.Dense)
def _num_bytes(tensor: tf.Tensor) -> tf.Tensor:
  return tf.size(tensor, out_type=tf.int64) * tensor.dtype.size


def _variable_device(layer) -> Optional[str]:
  """Where `layer`'s first weight lives (a mirrored one: its primary)."""
  for weight in layer.weights:
    return getattr(weight, "value", weight).device or None
  return None


class Offloader:
  """Wraps the weighted layers of a built Keras model; counts the copies.

  Args:
    model: a built Keras model.
    time_copies: time each copy with `tf.timestamp` (refused under op
      determinism).
    num_replicas: the replicas this process runs side by side; their copy
      times are averaged into a step's `offload`.
  """

  def __init__(self, model: keras.Model, *, time_copies: bool = True,
               num_replicas: int = 1):
    self.timed = time_copies
    self._num_replicas = num_replicas
    self._paused = False  # read when a step is traced
    layers = [layer for layer in model._flatten_layers(include_self=False)  # pylint: disable=protected-access
              if isinstance(layer, OFFLOADED_LAYERS)]
    # Created outside any strategy scope: host variables, not mirrors.
    with tf.device(HOST_DEVICE):
      # [tensors to host, bytes to host, tensors to device, bytes to device]
      self._counts = tf.Variable(tf.zeros([4], tf.int64), trainable=False,
                                 name="offload_counts")
      # Per direction (DIRECTIONS) and layer: timed copies, their seconds.
      self._timed = tf.Variable(tf.zeros([2, len(layers)], tf.int64),
                                trainable=False, name="offload_timed")
      self._copy_s = tf.Variable(tf.zeros([2, len(layers)], tf.float64),
                                 trainable=False, name="offload_copy_s")
    self._seen = (self._timed.numpy(), self._copy_s.numpy())
    self._durations_s = {d: [] for d in DIRECTIONS}
    self.layer_names = []
    for slot, layer in enumerate(layers):
      self._wrap(layer, slot, _variable_device(layer))
      self.layer_names.append(layer.name)

  def _count(self, direction: str, tensor: tf.Tensor) -> None:
    offset = 0 if direction == TO_HOST else 2
    update = tf.scatter_nd([[offset], [offset + 1]],
                           tf.stack([tf.constant(1, tf.int64),
                                     _num_bytes(tensor)]), [4])
    self._counts.assign_add(update)

  def _copy(self, tensor: tf.Tensor, *, source: Optional[str],
            destination: Optional[str], direction: str,
            slot: int) -> tf.Tensor:
    """`tensor` copied from `source` to `destination`, counted, and timed
    when the copies are."""
    self._count(direction, tensor)
    name = f"offload_{direction}"
    if not self.timed:
      with tf.device(destination):
        return tf.identity(tensor, name=name)
    with tf.control_dependencies([tensor]):
      start = tf.timestamp()
    # The copy reads this identity, so it cannot start before the stamp.
    with tf.device(source), tf.control_dependencies([start]):
      ready = tf.identity(tensor)
    with tf.device(destination):
      copy = tf.identity(ready, name=name)
    with tf.control_dependencies([copy]):
      end = tf.timestamp()
    where = [[DIRECTIONS.index(direction), slot]]
    self._timed.scatter_nd_add(where, tf.ones([1], tf.int64))
    self._copy_s.scatter_nd_add(where, tf.reshape(end - start, [1]))
    return copy

  def _wrap(self, layer, slot: int, variable_device: Optional[str]) -> None:
    original = layer.call

    def call(inputs, *args, **kwargs):
      if self._paused:
        return original(inputs, *args, **kwargs)

      @tf.custom_gradient
      def offloaded(x):
        outputs = original(x, *args, **kwargs)
        # The layer's ops carry the device scope strategy.run traces a
        # replica under; with no scope they are unplaced, and the layer
        # computes where its variables live.
        device = tf.nest.flatten(outputs)[0].device or variable_device
        host = self._copy(x, source=device, destination=HOST_DEVICE,
                          direction=TO_HOST, slot=slot)

        def grad(upstream, variables=None):
          variables = list(variables or [])
          again = self._copy(host, source=HOST_DEVICE, destination=device,
                             direction=TO_DEVICE, slot=slot)
          with tf.GradientTape() as tape:
            tape.watch(again)
            recomputed = original(again, *args, **kwargs)
          grads = tape.gradient(recomputed, [again] + variables,
                                output_gradients=upstream)
          # The input's gradient reads the weights again. Their own
          # gradients do not need that read, so only an automatic control
          # edge put it before the optimizer's update of them, and
          # Grappler's dependency optimization can drop that edge: about
          # one offloaded step in 25 then differed from the plain step.
          # Released together, no weight's gradient (so no update)
          # precedes the read.
          grads = tf.tuple(grads)
          return grads[0], grads[1:]

        return outputs, grad

      return offloaded(inputs)

    # Keras tracks attributes it is given; the wrapper is not state.
    object.__setattr__(layer, "call", call)

  @contextlib.contextmanager
  def paused(self):
    """A step function traced in this context runs without offload (its
    layers' own calls); one traced outside it keeps offloading."""
    self._paused = True
    try:
      yield
    finally:
      self._paused = False

  def discard_records(self) -> None:
    """Forgets the copies so far (a calibration's steps), so run.json and
    the phase count the training steps only."""
    self._counts.assign(tf.zeros_like(self._counts))
    self._seen = (self._timed.numpy(), self._copy_s.numpy())
    self._durations_s = {d: [] for d in DIRECTIONS}

  def _collect_s(self) -> float:
    """Reads the copies timed since the last read into the per-copy times;
    returns their seconds. A layer's copies of one direction are summed in
    the graph: those of several replicas, or of a layer called twice, are
    each given their mean."""
    timed, copy_s = self._timed.numpy(), self._copy_s.numpy()
    new_timed, new_s = timed - self._seen[0], copy_s - self._seen[1]
    self._seen = (timed, copy_s)
    for row, direction in enumerate(DIRECTIONS):
      for count, seconds in zip(new_timed[row].tolist(),
                                new_s[row].tolist()):
        if count:
          self._durations_s[direction] += [seconds / count] * count
    return float(new_s.sum())

  def take_copy_s(self) -> float:
    """Seconds of copies per replica since the last call: the steps since
    then, read once they are over."""
    return self._collect_s() / self._num_replicas

  def split_compute(self, start_s: float, end_s: float) -> list:
    """A step's compute span as the ledger records it with timed copies:
    `offload`, then the rest (`compute`)."""
    return ledger_lib.carve_compute(start_s, end_s, ledger_lib.OFFLOAD,
                                    self.take_copy_s())

  def summary(self, *, num_steps: int) -> dict:
    """run.json's `offload` section, in the PyTorch side's shape."""
    if self.timed:
      self._collect_s()
    tensors_host, bytes_host, tensors_device, bytes_device = (
        int(v) for v in self._counts.numpy())
    stats = CopyStats()
    stats.add(TO_HOST, num_bytes=bytes_host, tensors=tensors_host)
    stats.add(TO_DEVICE, num_bytes=bytes_device, tensors=tensors_device)
    for direction, durations_s in self._durations_s.items():
      for duration_s in durations_s:
        stats.add_duration(direction, duration_s)
    return {
        "targets": ["activations"],
        "pin_memory": False,
        "non_blocking": False,
        "prefetch": False,
        "device": "GPU" if tf.config.list_physical_devices("GPU") else "CPU",
        "copies_timed_with": "tf.timestamp" if self.timed else None,
        "offloaded_layers": list(self.layer_names),
        **stats.summary(num_steps=num_steps),
    }


def apply_offload(model: keras.Model, config, *, time_copies: bool = True,
                  num_replicas: int = 1) -> Optional[Offloader]:
  """Installs activation offload on `model`; None when nothing is offloaded.

  Args:
    model: the built Keras model.
    config: the validated `OffloadConfig` (checked by the compatibility table).
    time_copies: time the copies in the graph; False under op determinism,
      which refuses `tf.timestamp`.
    num_replicas: the replicas this process runs side by side.
  """
  if not config.enabled:
    return None
  if not tf.config.list_physical_devices("GPU"):
    print(NO_GPU_NOTICE, file=sys.stderr, flush=True)
  return Offloader(model, time_copies=time_copies, num_replicas=num_replicas)
