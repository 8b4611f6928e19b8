"""Whether a checkpoint fits a model: the first tensor that differs, named.

Both frameworks check a checkpoint before they assign any of it, so that a
checkpoint that does not fit changes nothing. Each side lists its tensors
as (name, shape, dtype) in the order it stores them; the comparison and its
message are the same for both:

  check_fits(loaded.path, "model tensor", model_specs, stored_specs(...),
             compare_names=True)
"""

from typing import Mapping, Sequence, Tuple

import numpy as np

from overlap_core.checkpoint.files import CheckpointMismatchError

TensorSpec = Tuple[str, Tuple[int, ...], np.dtype]


def describe(name: str, shape, dtype) -> str:
  """How a message shows one tensor: `'dense/kernel' (8, 16) float32`."""
  return f"{name!r} {tuple(shape)} {np.dtype(dtype)}"


def stored_specs(arrays: Mapping[str, np.ndarray]) -> Sequence[TensorSpec]:
  """A loaded group's arrays as specs, in their stored order."""
  return [(name, tuple(a.shape), np.dtype(a.dtype))
          for name, a in arrays.items()]


def check_fits(path: str, kind: str, model: Sequence[TensorSpec],
               stored: Sequence[TensorSpec], *, compare_names: bool) -> None:
  """Raises unless `stored` matches `model` one to one, in order.

  Args:
    path: the checkpoint, for the message.
    kind: what one entry is called ("model variable", "model tensor").
    model: what the model has, as (name, shape, dtype).
    stored: what the checkpoint has, in the same form.
    compare_names: whether names must match too; Keras names carry
      per-process layer numbers, so TensorFlow matches by position only.

  Raises:
    CheckpointMismatchError: naming the first entry that differs, with its
      name, shape and dtype on both sides.
  """
  for index, want in enumerate(model):
    if index >= len(stored):
      raise CheckpointMismatchError(
          f"{path} does not fit: {kind} {index} {describe(*want)} is missing "
          f"from the checkpoint, which has {len(stored)} {kind}s")
    got = stored[index]
    same = (got == want) if compare_names else (got[1:] == want[1:])
    if not same:
      raise CheckpointMismatchError(
          f"{path} does not fit: {kind} {index} of the model is "
          f"{describe(*want)}, the checkpoint has {describe(*got)}")
  if len(stored) > len(model):
    raise CheckpointMismatchError(
        f"{path} does not fit: the checkpoint has {len(stored)} {kind}s, the "
        f"model {len(model)}; the first extra is "
        f"{describe(*stored[len(model)])}")
