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

What TensorFlow cannot express is refused (`check_offload`): pinned host
memory and non-blocking copies (the runtime decides both), a side-stream
prefetch, and weights living on the host between layer uses.

Copies are counted in the graph, per executed step, in a host variable;
they are not timed: they run inside the compiled step, where no Python
code sees them start or end.
"""

import sys
from typing import Optional

import keras
import tensorflow as tf

from overlap_core.runtime.config import ConfigError, TrainConfig
from overlap_core.runtime.offload_stats import CopyStats, TO_DEVICE, TO_HOST

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
_NOT_IN_TENSORFLOW = {
    "offload_pin_memory": "TensorFlow allocates and pins host buffers "
                          "itself and has no setting for it",
    "offload_non_blocking": "TensorFlow's runtime schedules its copies "
                            "and has no setting for it",
    "offload_prefetch": "TensorFlow places its copies inside the compiled "
                        "step and has no side-stream prefetch of them",
}


def check_offload(config: TrainConfig) -> None:
  """Refuses the offload knobs TensorFlow cannot express, one line each.

  Raises:
    ConfigError: naming the flag and why.
  """
  offload = config.offload
  knobs = {"offload_pin_memory": offload.pin_memory,
           "offload_non_blocking": offload.non_blocking,
           "offload_prefetch": offload.prefetch}
  for flag, value in knobs.items():
    if value:
      raise ConfigError(flag, True, f"{_NOT_IN_TENSORFLOW[flag]}; allowed "
                        "on the TensorFlow side: false")
  if offload.parameters:
    raise ConfigError("offload", ",".join(offload.targets),
                      "TensorFlow keeps a layer's weights where their "
                      "variables live and has no per-layer move; allowed "
                      "on the TensorFlow side: none or activations")
  if offload.enabled and config.run.loop == "fit":
    raise ConfigError("loop", "fit", "Keras' fit may compile the step with "
                      "XLA, which ignores host placement; with --offload "
                      "allowed: ctl")


def _num_bytes(tensor: tf.Tensor) -> tf.Tensor:
  return tf.size(tensor, out_type=tf.int64) * tensor.dtype.size


class Offloader:
  """Wraps the weighted layers of a built Keras model; counts the copies.

  Args:
    model: a built Keras model.
  """

  def __init__(self, model: keras.Model):
    # [tensors to host, bytes to host, tensors to device, bytes to device],
    # created outside any strategy scope: one host counter, not a mirror.
    with tf.device(HOST_DEVICE):
      self._counts = tf.Variable(tf.zeros([4], tf.int64), trainable=False,
                                 name="offload_counts")
    self.layer_names = []
    for layer in model._flatten_layers(include_self=False):  # pylint: disable=protected-access
      if isinstance(layer, OFFLOADED_LAYERS):
        self._wrap(layer)
        self.layer_names.append(layer.name)

  def _count(self, direction: str, tensor: tf.Tensor) -> None:
    offset = 0 if direction == TO_HOST else 2
    update = tf.scatter_nd([[offset], [offset + 1]],
                           tf.stack([tf.constant(1, tf.int64),
                                     _num_bytes(tensor)]), [4])
    self._counts.assign_add(update)

  def _wrap(self, layer) -> None:
    original = layer.call

    def call(inputs, *args, **kwargs):

      @tf.custom_gradient
      def offloaded(x):
        device = x.device
        with tf.device(HOST_DEVICE):
          host = tf.identity(x)
        self._count(TO_HOST, x)
        outputs = original(x, *args, **kwargs)

        def grad(upstream, variables=None):
          variables = list(variables or [])
          with tf.device(device or None):
            again = tf.identity(host)
          self._count(TO_DEVICE, again)
          with tf.GradientTape() as tape:
            tape.watch(again)
            recomputed = original(again, *args, **kwargs)
          grads = tape.gradient(recomputed, [again] + variables,
                                output_gradients=upstream)
          return grads[0], grads[1:]

        return outputs, grad

      return offloaded(inputs)

    # Keras tracks attributes it is given; the wrapper is not state.
    object.__setattr__(layer, "call", call)

  def summary(self, *, num_steps: int) -> dict:
    """run.json's `offload` section, in the PyTorch side's shape."""
    tensors_host, bytes_host, tensors_device, bytes_device = (
        int(v) for v in self._counts.numpy())
    stats = CopyStats()
    stats.add(TO_HOST, num_bytes=bytes_host, tensors=tensors_host)
    stats.add(TO_DEVICE, num_bytes=bytes_device, tensors=tensors_device)
    return {
        "targets": ["activations"],
        "pin_memory": False,
        "non_blocking": False,
        "prefetch": False,
        "device": "GPU" if tf.config.list_physical_devices("GPU") else "CPU",
        "copies_timed_with": None,
        "offloaded_layers": list(self.layer_names),
        **stats.summary(num_steps=num_steps),
    }


def apply_offload(model: keras.Model, config) -> Optional[Offloader]:
  """Installs activation offload on `model`; None when nothing is offloaded.

  Args:
    model: the built Keras model.
    config: the validated `OffloadConfig` (checked by `check_offload`).
  """
  if not config.enabled:
    return None
  if not tf.config.list_physical_devices("GPU"):
    print(NO_GPU_NOTICE, file=sys.stderr, flush=True)
  return Offloader(model)
