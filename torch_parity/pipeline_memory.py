"""Activation memory of a pipeline stage: bytes of tensors saved for backward.

What a schedule changes in memory is how many micro-batches' activations a
stage holds at once: GPipe runs every forward before any backward, so a
stage holds all M; 1F1B starts a backward as soon as one can, so stage s
holds at most S - s. Autograd's saved-tensor hooks see every tensor a
forward saves for its backward, on any device, and the saved tensor is let
go when its backward has run (or its graph is freed): counting the bytes
between the two gives the stage's activation memory exactly, with no
allocator in the way.

A storage is counted once however many saved tensors view it (one
layer's output is the next one's input), and the stage's own
parameters (which backward saves too, for the input's gradient) and
buffers (BatchNorm's running statistics, which its backward saves) are
its state, not activations, and are left out: counted, they would add
the same bytes once to every schedule's peak, so 1F1B's share of GPipe's
would sit above S/M by them. The peak is of what a step adds: counted
from what was held when the step began (a stage may keep its last
micro-batch's graph until the next step replaces it, the same under
every schedule).

  meter = SavedTensorMeter(stage_state(stage))
  with meter.counting():
    schedule.step(...)
  meter.peak_bytes   # the most a step added at once, over the steps
"""

import contextlib
import itertools
import threading
from typing import Dict, Iterable, List, Optional

import torch


def _storage_key_and_bytes(tensor: torch.Tensor):
  try:
    storage = tensor.untyped_storage()
    return (tensor.device, storage.data_ptr()), storage.nbytes()
  except (RuntimeError, NotImplementedError):
    # No storage of its own (a wrapper subclass): its own bytes, alone.
    return ("tensor", id(tensor)), tensor.numel() * tensor.element_size()


class _Held:
  """What autograd keeps in place of a saved tensor: the tensor, and a
  release of its bytes when autograd lets go of it."""

  __slots__ = ("tensor", "_release")

  def __init__(self, tensor: torch.Tensor, release):
    self.tensor = tensor
    self._release = release

  def __del__(self):
    self._release()


def stage_state(*modules: torch.nn.Module) -> List[torch.Tensor]:
  """The tensors a meter leaves out: the modules' parameters and
  buffers."""
  return [t for m in modules
          for t in itertools.chain(m.parameters(), m.buffers())]


class SavedTensorMeter:
  """Counts the bytes of tensors saved for backward while `counting()`.

  Thread-safe: on a GPU, backward (and so the release) runs on autograd's
  device thread.
  """

  def __init__(self, state: Iterable[torch.Tensor] = ()):
    """`state`: the stage's own tensors (`stage_state`), never counted."""
    self._lock = threading.Lock()
    self._excluded = {_storage_key_and_bytes(t)[0] for t in state}
    # storage key -> [saved tensors holding it, its bytes]
    self._live: Dict[object, List[int]] = {}
    self.current_bytes = 0
    self.peak_bytes = 0
    self._step_base = 0
    self._step_excluded = set()

  @contextlib.contextmanager
  def counting(self, *batch: Optional[torch.Tensor]):
    """Counts what the enclosed step's forwards save (backward may run
    later), its peak from what was held when it began. The step's `batch`
    (inputs, targets) is left out like the parameters: the caller holds
    it whatever the schedule, and its micro-batches are views of it."""
    with self._lock:
      self._step_base = self.current_bytes
      self._step_excluded = {_storage_key_and_bytes(t)[0]
                             for t in batch if t is not None}
    with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
      yield

  def _pack(self, tensor: torch.Tensor):
    key, nbytes = _storage_key_and_bytes(tensor)
    if key in self._excluded or key in self._step_excluded:
      return tensor
    with self._lock:
      entry = self._live.get(key)
      if entry is None:
        self._live[key] = [1, nbytes]
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes,
                              self.current_bytes - self._step_base)
      else:
        entry[0] += 1
    return _Held(tensor, lambda: self._release(key))

  def _release(self, key) -> None:
    with self._lock:
      entry = self._live[key]
      entry[0] -= 1
      if entry[0] == 0:
        self.current_bytes -= entry[1]
        del self._live[key]


def _unpack(held):
  return held.tensor if isinstance(held, _Held) else held
