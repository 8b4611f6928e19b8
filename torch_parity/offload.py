"""CPU offload in PyTorch: saved activations, parameters, or both.

`apply_offload(model, config, device)` installs hooks on the model and
returns an `Offloader` whose `summary()` is run.json's `offload` section.

- activations: saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`,
  not `save_on_cpu`, which ties pinning and non-blocking together) copy
  every tensor autograd saves during the model's forward to host memory
  and back in backward. Parameters (and views of them) are not copied:
  they are on the device anyway, or offloaded by `parameters`. What the
  loss saves, computed after the model's forward, stays on the device.
- parameters: each layer's weights live on the host; a forward pre-hook
  brings them to the device for its forward, and a hook on its output's
  gradient for its backward. After forward the device copy is dropped
  (the weights did not change); after a weight's gradient is accumulated,
  the gradient goes to the host and the optimizer steps there, so its
  state lives on the host too (ZeRO-Offload's split); optimizer state has
  no target of its own.
- prefetch: the next layer's tensors are copied back on a side stream while
  the current layer computes (the large-image study's future work); the
  next layer is the one before in backward, the one after in forward, and
  only that one: at most one layer waits on the device ahead of use.

Every copy is counted and timed (`torch_parity.offload_copy`). The
ledger's `offload` phase is what offload adds to each step: where the run
times its step alone, the step with the hooks against the same step with
them paused (`Offloader.paused`, `overlap_core.runtime.offload_cost`);
otherwise (parameters offload, whose weights live on the host, cannot be
paused) the copies run in series with compute (`Offloader.split_compute`).

On a host without a GPU the copies go CPU to CPU: the hooks, counts and
bytes are those of a GPU run, no memory is saved. The trainer says so once.
"""

import contextlib
import sys
from typing import Optional

import torch
from torch import nn

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.config import OffloadConfig
from overlap_core.runtime.offload_stats import CopyStats
from torch_parity.offload_copy import Copier, SideStream
from torch_parity.offload_params import ParameterOffload

NO_GPU_NOTICE = ("offload: this host has no GPU, so offloaded tensors are "
                 "copied CPU to CPU: the mechanics and counts are real, no "
                 "memory is saved")


def _leaf_modules(model: nn.Module):
  return [m for m in model.modules() if not list(m.children())]


def _is_parameter_or_view(tensor: torch.Tensor) -> bool:
  return isinstance(tensor, nn.Parameter) or isinstance(
      getattr(tensor, "_base", None), nn.Parameter)


class _Saved:
  """One offloaded activation: its host copy, and a prefetched device copy
  with the event that says it has landed."""
  __slots__ = ("host", "layer", "device_tensor", "ready")

  def __init__(self, host, layer):
    self.host, self.layer = host, layer
    self.device_tensor, self.ready = None, None


class ActivationOffload:
  """Saved-tensor hooks that keep activations in host memory.

  Layers are numbered in forward order (leaf modules' forward pre-hooks),
  so that restoring one layer's tensors in backward can prefetch those of
  the layer before it. Each layer triggers one prefetch, at its first
  restore: a layer saves several tensors (a BatchNorm four), and letting
  every restore fetch another layer would run ahead of backward until
  every activation was back on the device, the memory offload saved.
  """

  def __init__(self, copier: Copier, *, prefetch: bool):
    self._copier = copier
    self._side = SideStream(copier) if prefetch else None
    self._layer = 0
    self._by_layer = {}  # layer -> its _Saved, until restored or fetched
    self._reached = set()  # layers whose restore has started
    self._fetched = {}  # layer -> its _Saved, fetched ahead

  def start_forward(self) -> None:
    self._layer = 0
    # The last step's records are gone with its graph.
    self._by_layer, self._reached, self._fetched = {}, set(), {}

  def enter_layer(self, module, args) -> None:
    del module, args
    self._layer += 1

  def layers_fetched_ahead(self) -> list:
    """The layers whose tensors were fetched ahead and wait on the device
    for backward to use them, in forward order."""
    return sorted(layer for layer, saved in self._fetched.items()
                  if any(s.device_tensor is not None for s in saved))

  def pack(self, tensor: torch.Tensor):
    if (tensor.device != self._copier.device or
        tensor.layout != torch.strided or _is_parameter_or_view(tensor)):
      return tensor
    saved = _Saved(self._copier.to_host(tensor), self._layer)
    self._by_layer.setdefault(self._layer, []).append(saved)
    return saved

  def unpack(self, saved):
    if not isinstance(saved, _Saved):
      return saved
    if saved.device_tensor is not None:
      SideStream.wait(saved.ready, self._copier.device)
      tensor, saved.device_tensor = saved.device_tensor, None
    else:
      tensor = self._copier.to_device(saved.host)
    if self._side is not None and saved.layer not in self._reached:
      self._reached.add(saved.layer)
      # Its other tensors are restored now, on demand: none to fetch ahead.
      self._by_layer.pop(saved.layer, None)
      self._prefetch_before(saved.layer)
    return tensor

  def _prefetch_before(self, layer: int) -> None:
    """Prefetches the nearest earlier layer not yet fetched or restored."""
    for earlier in range(layer - 1, 0, -1):
      if earlier in self._by_layer:
        break
    else:
      return
    # Fetched once: a second backward over the graph copies again.
    waiting = self._by_layer.pop(earlier)
    tensors, ready = self._side.fetch([s.host for s in waiting])
    for saved, tensor in zip(waiting, tensors):
      saved.device_tensor, saved.ready = tensor, ready
    self._fetched[earlier] = waiting
    self._copier.stats.count_prefetched(len(waiting))


class Offloader:
  """The hooks of one model's offload, and the copies they made."""

  def __init__(self, model: nn.Module, config: OffloadConfig,
               device: torch.device):
    self.config = config
    self.stats = CopyStats()
    self.copier = Copier(device, pin_memory=config.pin_memory,
                         non_blocking=config.non_blocking, stats=self.stats)
    self.activations = (ActivationOffload(self.copier,
                                          prefetch=config.prefetch)
                        if config.activations else None)
    self.parameters = (ParameterOffload(model, self.copier,
                                        prefetch=config.prefetch)
                       if config.parameters else None)
    self._hooks_context = None
    self._model = model
    self._handles = []
    self._install_hooks()

  def _install_hooks(self) -> None:
    model = self._model
    self._handles = [
        model.register_forward_pre_hook(self._start_forward),
        model.register_forward_hook(self._end_forward, always_call=True)]
    if self.activations is not None:
      self._handles += [m.register_forward_pre_hook(
          self.activations.enter_layer) for m in _leaf_modules(model)]

  def _remove_hooks(self) -> None:
    for handle in self._handles:
      handle.remove()
    self._handles = []

  def _pack(self, tensor):
    if self.parameters is not None:
      tensor = self.parameters.pack_view(tensor)
    if self.activations is not None and isinstance(tensor, torch.Tensor):
      return self.activations.pack(tensor)
    return tensor

  def _unpack(self, saved):
    if self.activations is not None:
      saved = self.activations.unpack(saved)
    if self.parameters is not None:
      saved = self.parameters.unpack_view(saved)
    return saved

  @property
  def can_pause(self) -> bool:
    """Whether a step can run without offload: not with parameters
    offload, which keeps the weights on the host between layer uses."""
    return self.parameters is None

  @contextlib.contextmanager
  def paused(self):
    """Steps in this context run as without offload: its hooks are off
    the model (activations offload only, `can_pause`)."""
    if not self.can_pause:
      raise RuntimeError("parameters offload cannot be paused: the weights "
                         "live on the host")
    self._remove_hooks()
    try:
      yield
    finally:
      self._install_hooks()

  def discard_records(self) -> None:
    """Forgets the copies so far (a calibration's steps), so run.json and
    the phase count the training steps only."""
    self.copier.resolve_timings()
    self.copier.take_serial_s()
    self.stats.reset()

  def _start_forward(self, module, args) -> None:
    del module, args
    # The previous step is over (the loop waited for the device): its
    # copies' events can be read now without stalling anything.
    self.copier.resolve_timings()
    if self.activations is not None:
      self.activations.start_forward()
    if self.parameters is not None:
      self.parameters.start_forward()
    if torch.is_grad_enabled():
      self._hooks_context = torch.autograd.graph.saved_tensors_hooks(
          self._pack, self._unpack)
      self._hooks_context.__enter__()

  def _end_forward(self, module, args, output) -> None:
    del module, args
    if self._hooks_context is not None:
      self._hooks_context.__exit__(None, None, None)
      self._hooks_context = None
    return output

  def split_compute(self, start_s: float, end_s: float) -> list:
    """A step's compute span as the ledger records it with offload: the
    copies run in series with compute (`offload`), then the rest
    (`compute`). Called once the step is over and the device waited for.
    """
    return ledger_lib.carve_compute(start_s, end_s, ledger_lib.OFFLOAD,
                                    self.copier.take_serial_s())

  def summary(self, *, num_steps: int) -> dict:
    """run.json's `offload` section: settings and copies per direction."""
    self.copier.resolve_timings()
    return {
        "targets": list(self.config.targets),
        "pin_memory": self.config.pin_memory,
        "non_blocking": self.config.non_blocking,
        "prefetch": self.config.prefetch,
        "device": str(self.copier.device),
        "copies_timed_with": ("cuda_events" if self.copier.is_cuda
                              else "perf_counter"),
        **self.stats.summary(num_steps=num_steps),
    }

  def remove(self) -> None:
    """Takes the hooks off; parameters offload leaves weights on the host."""
    self._remove_hooks()
    if self.parameters is not None:
      self.parameters.remove()


def apply_offload(model: nn.Module, optimizer, config: OffloadConfig,
                  device: torch.device) -> Optional[Offloader]:
  """Installs the configured offload on `model`; None when nothing is.

  Args:
    model: the device-resident module (under any DDP wrapper: module hooks
      fire through it).
    optimizer: its optimizer; with parameters offload it steps on the host.
    config: the validated offload settings.
    device: the training device.
  """
  if not config.enabled:
    return None
  if torch.device(device).type == "cpu":
    print(NO_GPU_NOTICE, file=sys.stderr, flush=True)
  offloader = Offloader(model, config, torch.device(device))
  if offloader.parameters is not None:
    offloader.parameters.guard_optimizer(optimizer)
  return offloader
