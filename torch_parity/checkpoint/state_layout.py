"""How PyTorch state maps onto checkpoint files: dtypes, names, a skeleton.

Tensors become NumPy arrays of the same dtype (bfloat16 through ml_dtypes,
which NumPy lacks) and back. An optimizer state_dict becomes named tensors
plus a JSON skeleton that references them, keeping tuples and integer keys,
so decoding gives back a state_dict equal to the one encoded.
"""

from typing import Dict, Tuple

import numpy as np
import torch
from torch import nn

from overlap_core.checkpoint.files import CheckpointError

# torch dtypes the checkpoint format stores, with their NumPy dtype.
# bfloat16 has none in NumPy itself; it goes through ml_dtypes.
_NUMPY_DTYPES = {
    torch.float64: np.float64, torch.float32: np.float32,
    torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
    torch.int16: np.int16, torch.int8: np.int8, torch.uint8: np.uint8,
    torch.bool: np.bool_,
}
# The skeleton's markers for what JSON has no form of.
_TENSOR = "__tensor__"
_TUPLE = "__tuple__"
_INT_KEYS = "__int_keys__"


def _bfloat16():
  try:
    import ml_dtypes  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return np.dtype(ml_dtypes.bfloat16)


def numpy_dtype(dtype: torch.dtype, name: str = "") -> np.dtype:
  """The NumPy dtype a torch dtype is stored as.

  Raises:
    CheckpointError: the format has no such dtype (naming the tensor).
  """
  if dtype == torch.bfloat16:
    bfloat16 = _bfloat16()
    if bfloat16 is None:
      raise CheckpointError(f"tensor {name!r} is bfloat16, which needs the "
                            "ml_dtypes package (pip install ml_dtypes)")
    return bfloat16
  if dtype not in _NUMPY_DTYPES:
    raise CheckpointError(f"tensor {name!r} has dtype {dtype}, which "
                          "checkpoints cannot store; allowed: "
                          "float64/32/16, bfloat16, int64/32/16/8, uint8, "
                          "bool")
  return np.dtype(_NUMPY_DTYPES[dtype])


def unwrap_model(model: nn.Module) -> nn.Module:
  """The module inside DDP and torch.compile wrappers (their state_dict
  names carry a "module." or "_orig_mod." prefix)."""
  while True:
    if isinstance(model, nn.parallel.DistributedDataParallel):
      model = model.module
    elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod,  # pylint: disable=protected-access
                                                    nn.Module):
      model = model._orig_mod  # pylint: disable=protected-access
    else:
      return model


def parameter_names(model: nn.Module, optimizer) -> Dict[int, str]:
  """optimizer.state_dict()'s parameter index -> the model's name for it.

  The state_dict numbers parameters in the order of its param_groups; a
  parameter that is not the model's keeps its number as name.
  """
  by_id = {id(p): name for name, p in model.named_parameters()}
  names, index = {}, 0
  for group in optimizer.param_groups:
    for parameter in group["params"]:
      names[index] = by_id.get(id(parameter), f"param{index}")
      index += 1
  return names


def encode_state_dict(value, path: Tuple, tensors: Dict[str, torch.Tensor],
                      parameter_names: Dict[int, str]):
  """A JSON-able skeleton of an optimizer state_dict; tensors go aside.

  Each tensor is put in `tensors` under a name and replaced by a reference
  to it; tuples and integer-keyed dicts are marked, so decoding gives back
  exactly the types that were saved.
  """
  if isinstance(value, torch.Tensor):
    parts = list(path)
    if len(parts) >= 2 and parts[0] == "state":
      parts = [parameter_names.get(parts[1], f"param{parts[1]}")] + parts[2:]
    name = ".".join(str(p) for p in parts)
    tensors[name] = value
    return {_TENSOR: name}
  if isinstance(value, dict):
    encoded = {str(k): encode_state_dict(v, path + (k,), tensors,
                                         parameter_names)
               for k, v in value.items()}
    if value and all(isinstance(k, int) for k in value):
      return {_INT_KEYS: encoded}
    return encoded
  if isinstance(value, tuple):
    return {_TUPLE: [encode_state_dict(v, path + (i,), tensors,
                                       parameter_names)
                     for i, v in enumerate(value)]}
  if isinstance(value, list):
    return [encode_state_dict(v, path + (i,), tensors, parameter_names)
            for i, v in enumerate(value)]
  return value


def decode_state_dict(skeleton, tensors: Dict[str, torch.Tensor]):
  """The inverse of `encode_state_dict`.

  Raises:
    KeyError: the skeleton names a tensor `tensors` lacks.
  """
  if isinstance(skeleton, dict):
    if set(skeleton) == {_TENSOR}:
      return tensors[skeleton[_TENSOR]]
    if set(skeleton) == {_TUPLE}:
      return tuple(decode_state_dict(v, tensors) for v in skeleton[_TUPLE])
    if set(skeleton) == {_INT_KEYS}:
      return {int(k): decode_state_dict(v, tensors)
              for k, v in skeleton[_INT_KEYS].items()}
    return {k: decode_state_dict(v, tensors) for k, v in skeleton.items()}
  if isinstance(skeleton, list):
    return [decode_state_dict(v, tensors) for v in skeleton]
  return skeleton


def tensor_to_array(tensor: torch.Tensor) -> np.ndarray:
  """A host tensor's array, sharing its memory."""
  if tensor.dtype == torch.bfloat16:
    return tensor.view(torch.int16).numpy().view(numpy_dtype(tensor.dtype))
  return tensor.numpy()


def from_array(array: np.ndarray) -> torch.Tensor:
  """A torch tensor (its own memory) holding a loaded array."""
  if array.dtype == _bfloat16():
    return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
  return torch.from_numpy(np.array(array))
