"""Snapshot and restore of PyTorch training state, for two-phase checkpoints.

What a snapshot holds, in groups (one safetensors file each):
  model      `model.state_dict()`: parameters and buffers (BatchNorm's
             statistics and counters), keyed by state_dict name. A DDP or
             torch.compile wrapper is looked through, so a checkpoint is the
             same with and without one and loads into the plain module.
  optimizer  the tensors of `optimizer.state_dict()`: moments, momentum
             buffers, step counts, keyed "<parameter name>.<slot>"
             ("fc1.weight.exp_avg"). The rest of the state_dict (the
             param_groups' hyperparameters, Python numbers) is stored in the
             checkpoint's state.json as a skeleton that names those tensors,
             so a restore rebuilds a state_dict equal to the saved one.
  rng        torch's generator states: the CPU one, and the model's CUDA
             device's when it has one, so dropout continues its stream.

The data order, the run's other randomness, is fixed by the seed and the
data position the trainer stores in state.json.

The copy happens between two steps, on the training thread. On CUDA every
device tensor is copied non-blocking, on a side stream, into page-locked
host buffers allocated once and reused; the default stream waits for those
copies before the next step writes the weights, and the persist thread waits
for them (an event) before it reads. On the CPU the copy is a clone.

Restoring checks everything first, then assigns: a checkpoint that does not
fit raises `CheckpointMismatchError` naming the first tensor that differs,
with nothing changed. How tensors become arrays and an optimizer state_dict
becomes names and a skeleton is `state_layout`.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from overlap_core.checkpoint import mismatch
from overlap_core.checkpoint.files import (CheckpointError,
                                           CheckpointMismatchError,
                                           LoadedCheckpoint)
from torch_parity.checkpoint import state_layout
from torch_parity.checkpoint.state_layout import (from_array, numpy_dtype,
                                                  unwrap_model)

MODEL_GROUP = "model"
OPTIMIZER_GROUP = "optimizer"
RNG_GROUP = "rng"
OPTIMIZER_STATE_KEY = "optimizer"  # where state.json keeps the skeleton
CPU_RNG = "cpu"
CUDA_RNG = "cuda"


@dataclasses.dataclass(frozen=True)
class HostCopy:
  """A tensor copied to host memory; on CUDA, complete once `ready` is."""
  tensor: torch.Tensor
  ready: Optional[Any] = None  # a torch.cuda.Event


def to_host(value: HostCopy) -> np.ndarray:
  """Runs on the persist thread: waits for the copy, returns its array.

  The array shares the host buffer, which is not reused before the persist
  that reads it has finished (the engine takes no snapshot while one runs).
  """
  if value.ready is not None:
    value.ready.synchronize()
  return state_layout.tensor_to_array(value.tensor)


class _HostCopier:
  """Copies named tensors to host memory; reuses its page-locked buffers."""

  def __init__(self):
    self._buffers: Dict[str, torch.Tensor] = {}
    self._streams: Dict[torch.device, Any] = {}

  def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
    buffer = self._buffers.get(name)
    if (buffer is None or buffer.shape != like.shape
        or buffer.dtype != like.dtype):
      buffer = torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
      self._buffers[name] = buffer
    return buffer

  def reserve(self, tensors: Dict[str, torch.Tensor]) -> None:
    """Allocates the buffers now, so the first snapshot does not."""
    for name, tensor in tensors.items():
      if tensor.is_cuda:
        self._buffer(name, tensor)

  def __call__(self, tensors: Dict[str, torch.Tensor]
               ) -> Dict[str, HostCopy]:
    copies = {}
    by_device: Dict[torch.device, List[Tuple[str, torch.Tensor]]] = {}
    for name, tensor in tensors.items():
      if tensor.is_cuda:
        by_device.setdefault(tensor.device, []).append((name, tensor))
      else:
        copies[name] = HostCopy(tensor.detach().clone(
            memory_format=torch.contiguous_format))
    for device, named in by_device.items():
      stream = self._streams.get(device)
      if stream is None:
        stream = self._streams[device] = torch.cuda.Stream(device)
      training = torch.cuda.current_stream(device)
      # The copies read what the step just wrote ...
      stream.wait_stream(training)
      with torch.cuda.stream(stream):
        for name, tensor in named:
          buffer = self._buffer(name, tensor)
          buffer.copy_(tensor.detach(), non_blocking=True)
      ready = torch.cuda.Event()
      ready.record(stream)
      # ... and the next step may overwrite it only after they have: the
      # device waits, the training thread does not.
      training.wait_event(ready)
      for name, _ in named:
        copies[name] = HostCopy(self._buffers[name], ready)
    return copies


class SnapshotTaker:
  """Copies model, optimizer and RNG state between two training steps.

  Usage:
    take = SnapshotTaker(model, optimizer)
    groups, state = take()    # group -> name -> HostCopy; JSON-able state
    arrays = {k: to_host(v) for k, v in groups["model"].items()}

  Raises:
    CheckpointError: at construction (or, for optimizer state created
      later, at a snapshot) for a tensor of a dtype checkpoints cannot store.
  """

  def __init__(self, model: nn.Module, optimizer):
    self._model = unwrap_model(model)
    self._optimizer = optimizer
    self._copy = _HostCopier()
    model_tensors = self._model.state_dict()
    tensors = self._named(model_tensors, self._optimizer_tensors()[0])
    for (_, name), tensor in tensors.items():
      numpy_dtype(tensor.dtype, name)
    self._copy.reserve(tensors)
    self._cuda_device = next(
        (t.device for t in model_tensors.values() if t.is_cuda), None)

  @staticmethod
  def _named(model_tensors, optimizer_tensors):
    """(group, name) -> tensor: one copier call covers both groups, so on
    CUDA one event says when all of them are on the host."""
    return {**{(MODEL_GROUP, k): v for k, v in model_tensors.items()},
            **{(OPTIMIZER_GROUP, k): v for k, v in optimizer_tensors.items()}}

  def _optimizer_tensors(self):
    tensors = {}
    skeleton = state_layout.encode_state_dict(
        self._optimizer.state_dict(), (), tensors,
        state_layout.parameter_names(self._model, self._optimizer))
    return tensors, skeleton

  def __call__(self) -> Tuple[Dict[str, Dict[str, HostCopy]], dict]:
    model_tensors = self._model.state_dict()
    optimizer_tensors, skeleton = self._optimizer_tensors()
    for name, tensor in optimizer_tensors.items():
      numpy_dtype(tensor.dtype, name)
    copies = self._copy(self._named(model_tensors, optimizer_tensors))
    groups = {MODEL_GROUP: {}, OPTIMIZER_GROUP: {}}
    for (group, name), copy in copies.items():
      groups[group][name] = copy
    # get_rng_state returns a copy already.
    rng = {CPU_RNG: HostCopy(torch.get_rng_state())}
    if self._cuda_device is not None:
      rng[CUDA_RNG] = HostCopy(torch.cuda.get_rng_state(self._cuda_device))
    groups[RNG_GROUP] = rng
    state = {OPTIMIZER_STATE_KEY: {"class": type(self._optimizer).__name__,
                                   "state_dict": skeleton}}
    return groups, state


def _check_model(loaded: LoadedCheckpoint, model: nn.Module) -> None:
  """Raises unless the stored tensors are the model's, one to one, in
  state_dict order, with equal names, shapes and dtypes."""
  expected = [(name, tuple(t.shape), numpy_dtype(t.dtype, name))
              for name, t in model.state_dict().items()]
  mismatch.check_fits(
      loaded.path, "model tensor", expected,
      mismatch.stored_specs(loaded.groups.get(MODEL_GROUP, {})),
      compare_names=True)


def _rebuild_optimizer_state(loaded: LoadedCheckpoint, model: nn.Module,
                             optimizer) -> dict:
  """The saved optimizer.state_dict(), after checking it fits `optimizer`.

  torch creates optimizer state lazily, so there is none to compare with;
  what must fit is the optimizer's class, its param_groups' sizes, and
  each per-parameter tensor against its parameter (a slot that is not a
  scalar has the parameter's shape).
  """
  saved = loaded.state.get(OPTIMIZER_STATE_KEY)
  if saved is None:
    raise CheckpointMismatchError(
        f"{loaded.path} does not fit: it has no PyTorch optimizer state "
        f"(was it written by another framework?)")
  if saved["class"] != type(optimizer).__name__:
    raise CheckpointMismatchError(
        f"{loaded.path} does not fit: it holds {saved['class']} state, the "
        f"optimizer is {type(optimizer).__name__}")
  arrays = loaded.groups.get(OPTIMIZER_GROUP, {})
  tensors = {name: from_array(array) for name, array in arrays.items()}
  try:
    saved_state = state_layout.decode_state_dict(saved["state_dict"],
                                                 tensors)
  except KeyError as e:
    raise CheckpointError(f"{loaded.path}: the optimizer state names "
                          f"tensor {e} that optimizer.safetensors lacks"
                          ) from e
  groups = saved_state["param_groups"]
  current = optimizer.param_groups
  if len(groups) != len(current):
    raise CheckpointMismatchError(
        f"{loaded.path} does not fit: the checkpoint has {len(groups)} "
        f"optimizer param groups, the optimizer {len(current)}")
  parameters = [p for group in current for p in group["params"]]
  names = state_layout.parameter_names(model, optimizer)
  for index, (group, now) in enumerate(zip(groups, current)):
    if len(group["params"]) != len(now["params"]):
      raise CheckpointMismatchError(
          f"{loaded.path} does not fit: optimizer param group {index} has "
          f"{len(group['params'])} parameters in the checkpoint, "
          f"{len(now['params'])} in the optimizer")
  for index, slots in saved_state["state"].items():
    parameter = parameters[index] if index < len(parameters) else None
    for slot, value in slots.items():
      if not isinstance(value, torch.Tensor) or value.dim() == 0:
        continue
      name = f"{names.get(index, f'param{index}')}.{slot}"
      if parameter is None or value.shape != parameter.shape:
        stored_side = mismatch.describe(name, value.shape,
                                        numpy_dtype(value.dtype))
        model_side = ("no such parameter" if parameter is None else
                      mismatch.describe(names[index], parameter.shape,
                                        numpy_dtype(parameter.dtype)))
        raise CheckpointMismatchError(
            f"{loaded.path} does not fit: the optimizer's parameter "
            f"{index} is {model_side}, the checkpoint's state for it is "
            f"{stored_side}")
  return saved_state


def restore(loaded: LoadedCheckpoint, *, model: nn.Module,
            optimizer) -> None:
  """Assigns a loaded checkpoint to model, optimizer and RNGs.

  Everything is checked before anything is assigned.

  Raises:
    CheckpointMismatchError: naming the first tensor that differs; nothing
      has been changed then.
  """
  model = unwrap_model(model)
  _check_model(loaded, model)
  optimizer_state = _rebuild_optimizer_state(loaded, model, optimizer)
  with torch.no_grad():
    model.load_state_dict({name: from_array(array) for name, array
                           in loaded.groups[MODEL_GROUP].items()})
  # Moves each slot to its parameter's device (and "step" where the
  # optimizer keeps it), as torch does for any loaded state_dict.
  optimizer.load_state_dict(optimizer_state)
  rng = loaded.groups.get(RNG_GROUP, {})
  if CPU_RNG in rng:
    torch.set_rng_state(from_array(rng[CPU_RNG]))
  device = next((t.device for t in model.state_dict().values() if t.is_cuda),
                None)
  if CUDA_RNG in rng and device is not None:
    torch.cuda.set_rng_state(from_array(rng[CUDA_RNG]), device)
