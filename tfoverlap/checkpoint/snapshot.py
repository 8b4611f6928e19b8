"""Snapshot and restore of Keras training state, for two-phase checkpoints.

What a snapshot holds, in groups:
  model      `model.variables`: weights, BatchNorm statistics and the
             layers' random-seed states (Keras 3 keeps them as variables,
             so dropout continues its stream after a restore)
  optimizer  `optimizer.variables`: iteration count, learning rate, slots
             (and the loss scale of a LossScaleOptimizer)

The other randomness of a run, the data order, is fixed by the seed and
the data position the trainer stores in the checkpoint's state.

Keys are Keras variable paths ("resnet18/conv1/kernel"), so a checkpoint's
`model.safetensors` loads into plain Keras by path. Restoring matches by
position instead, because a path carries Keras's auto-numbered layer names,
which differ when a process builds a second model; shapes and dtypes must
match one to one, and the first variable that does not is named.

The copy is one `tf.function` of identities, so a snapshot costs one
dispatch, not one per variable. It lands in device memory (a GPU keeps it
there until the persist thread moves it to the host, off the training
thread) and falls back to host memory when the device has no room. On a
CPU, reading a variable shares its buffer and the next update copies it
(TensorFlow's copy-on-write), so the copy's cost moves from the stall into
the next step; the cadence policy sees it there as interference.
"""

from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

from overlap_core.checkpoint import mismatch
from overlap_core.checkpoint.files import LoadedCheckpoint

MODEL_GROUP = "model"
OPTIMIZER_GROUP = "optimizer"


def _raw(variable):
  """The tf.Variable behind a Keras 3 variable (itself for a tf.Variable)."""
  return getattr(variable, "value", variable)


def _path(variable) -> str:
  return getattr(variable, "path", None) or variable.name.split(":")[0]


class SnapshotTaker:
  """Copies model and optimizer state between two training steps.

  Usage:
    take = SnapshotTaker(model.variables, optimizer.variables)
    groups = take()           # name -> tensor, per group
    arrays = {k: to_host(t) for k, t in groups["model"].items()}
  """

  def __init__(self, model_variables: Sequence, optimizer_variables: Sequence):
    self._groups = {
        MODEL_GROUP: [(_path(v), _raw(v)) for v in model_variables],
        OPTIMIZER_GROUP: [(_path(v), _raw(v)) for v in optimizer_variables],
    }
    flat = [v for pairs in self._groups.values() for _, v in pairs]
    self._copy = tf.function(lambda: [tf.identity(v) for v in flat],
                             autograph=False)
    self.on_device = bool(tf.config.list_logical_devices("GPU"))
    # Run once now: the first call traces and optimizes the graph, which
    # would otherwise land in the first checkpoint's stall.
    self._copy_somewhere()

  def __call__(self) -> Dict[str, Dict[str, tf.Tensor]]:
    tensors = self._copy_somewhere()
    groups, position = {}, 0
    for group, pairs in self._groups.items():
      groups[group] = {name: tensors[position + i]
                       for i, (name, _) in enumerate(pairs)}
      position += len(pairs)
    return groups

  def _copy_somewhere(self) -> List[tf.Tensor]:
    if self.on_device:
      try:
        return self._copy()
      except tf.errors.ResourceExhaustedError:
        # No room on the device: from now on copy straight to the host.
        self.on_device = False
    with tf.device("/cpu:0"):
      return self._copy()


def to_host(tensor) -> np.ndarray:
  """Runs on the persist thread: the device-to-host copy, if any."""
  return tensor.numpy()


def _specs(variables: Sequence) -> List[mismatch.TensorSpec]:
  return [(_path(v), tuple(_raw(v).shape),
           np.dtype(_raw(v).dtype.as_numpy_dtype)) for v in variables]


def restore(loaded: LoadedCheckpoint, *, model_variables: Sequence,
            optimizer_variables: Sequence) -> None:
  """Assigns a loaded checkpoint to the variables, after checking them all.

  Raises:
    CheckpointMismatchError: naming the first variable that differs; no
      variable has been changed then.
  """
  groups = ((MODEL_GROUP, model_variables),
            (OPTIMIZER_GROUP, optimizer_variables))
  for group, variables in groups:
    # By position: a path carries Keras's per-process layer numbers.
    mismatch.check_fits(
        loaded.path, f"{group} variable", _specs(variables),
        mismatch.stored_specs(loaded.groups.get(group, {})),
        compare_names=False)
  for group, variables in groups:
    for variable, array in zip(variables, loaded.groups[group].values()):
      _raw(variable).assign(array)
