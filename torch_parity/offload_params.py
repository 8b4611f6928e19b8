"""Parameters offload: each layer's weights on the host between its uses.

A layer here is a module with parameters of its own. Its weights come to
the device just before its forward (a forward pre-hook) and just before
its backward (a hook on its output's gradient, which fires before the
layer's own backward nodes run). Between uses the device copy is dropped,
never copied back: forward and backward do not change weights. Each
weight's gradient goes to the host as soon as it is accumulated, and the
optimizer steps on the host copies, so the optimizer's state lives there.

Autograd saves a layer's weights for backward, some as views (a Linear
saves its weight transposed). A view would keep the device copy alive, so
`pack_view` replaces it with a reference rebuilt, at unpack time, from the
weight's device copy of then.
"""

from typing import Dict, List

import torch
from torch import nn

from torch_parity.offload_copy import Copier, SideStream


class _ViewOfParameter:
  """A saved view of a weight, rebuilt from wherever the weight is now."""
  __slots__ = ("parameter", "size", "stride", "offset")

  def __init__(self, view: torch.Tensor):
    self.parameter = view._base  # pylint: disable=protected-access
    self.size, self.stride = view.size(), view.stride()
    self.offset = view.storage_offset()

  def rebuild(self) -> torch.Tensor:
    return self.parameter.detach().as_strided(self.size, self.stride,
                                              self.offset)


class ParameterOffload:
  """Hooks that keep `model`'s weights on the host between layer uses.

  Args:
    model: the device-resident module; its weights move to the host now.
    copier: the timed, counted copies.
    prefetch: fetch the next layer's weights on a side stream.
  """

  def __init__(self, model: nn.Module, copier: Copier, *, prefetch: bool):
    self._copier = copier
    self._side = SideStream(copier) if prefetch else None
    self._layers = [m for m in model.modules()
                    if list(m.parameters(recurse=False))]
    self._host: Dict[nn.Parameter, torch.Tensor] = {}
    self._prefetched: Dict[nn.Module, tuple] = {}
    self._order: List[nn.Module] = []  # forward order, learnt in step 1
    self._recording: List[nn.Module] = []
    self._handles = []
    with torch.no_grad():
      for layer in self._layers:
        for parameter in layer.parameters(recurse=False):
          # Once, at start: not an offload copy of a step, so not counted.
          host = torch.empty_like(parameter, device="cpu",
                                  pin_memory=copier.pin_memory)
          host.copy_(parameter)
          parameter.data = host
          self._host[parameter] = host
          self._handles.append(parameter.register_post_accumulate_grad_hook(
              self._release_after_backward))
        self._handles += [
            layer.register_forward_pre_hook(self._before_forward),
            layer.register_forward_hook(self._after_forward)]

  @staticmethod
  def pack_view(tensor: torch.Tensor):
    if isinstance(getattr(tensor, "_base", None), nn.Parameter):
      return _ViewOfParameter(tensor)
    return tensor

  @staticmethod
  def unpack_view(saved):
    if isinstance(saved, _ViewOfParameter):
      return saved.rebuild()
    return saved

  def start_forward(self) -> None:
    if self._recording and not self._order:
      self._order = self._recording
    self._recording = []
    # A fetch issued ahead but never used holds weights from before the
    # last optimizer step: never let a later forward read it.
    self._prefetched.clear()

  def guard_optimizer(self, optimizer) -> None:
    """Makes the host step wait for gradients still being copied.

    A non-blocking device-to-host copy returns before its bytes land; the
    optimizer must not read a gradient (or write a weight a forward copy
    still reads) before the device is done.
    """
    if self._copier.is_cuda and self._copier.non_blocking:
      device = self._copier.device
      optimizer.register_step_pre_hook(
          lambda *_: torch.cuda.synchronize(device))

  def _on_device(self, parameter: nn.Parameter) -> bool:
    # By address, not device: on a host without a GPU both copies are CPU
    # tensors, and the mechanics must still tell them apart.
    return parameter.data_ptr() != self._host[parameter].data_ptr()

  def _fetch(self, layer: nn.Module) -> None:
    """Puts `layer`'s weights on the device (prefetched or copied now)."""
    parameters = list(layer.parameters(recurse=False))
    if self._on_device(parameters[0]):
      return  # already there (a layer used twice in one forward)
    if layer in self._prefetched:
      tensors, ready = self._prefetched.pop(layer)
      SideStream.wait(ready, self._copier.device)
    else:
      tensors = [self._copier.to_device(self._host[p]) for p in parameters]
    for parameter, tensor in zip(parameters, tensors):
      parameter.data = tensor

  def _prefetch_next(self, layer: nn.Module, step: int) -> None:
    if self._side is None or layer not in self._order:
      return
    index = self._order.index(layer) + step
    if not 0 <= index < len(self._order):
      return
    following = self._order[index]
    if following in self._prefetched:
      return
    hosts = [self._host[p] for p in following.parameters(recurse=False)]
    self._prefetched[following] = self._side.fetch(hosts)
    self._copier.stats.count_prefetched(len(hosts))

  def _release(self, layer: nn.Module) -> None:
    for parameter in layer.parameters(recurse=False):
      parameter.data = self._host[parameter]

  def _before_forward(self, layer, args) -> None:
    del args
    self._recording.append(layer)
    self._fetch(layer)
    self._prefetch_next(layer, +1)

  def _after_forward(self, layer, args, output):
    del args
    self._release(layer)
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    for tensor in outputs:
      if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        # Fires with the gradient of this output, before the layer's own
        # backward runs: the moment its weights are needed again.
        tensor.register_hook(lambda grad, layer=layer: self._before_backward(
            layer))
    return output

  def _before_backward(self, layer) -> None:
    self._fetch(layer)
    self._prefetch_next(layer, -1)

  def _release_after_backward(self, parameter: nn.Parameter) -> None:
    if not self._on_device(parameter):
      return
    grad = parameter.grad
    host_grad = None if grad is None else self._copier.to_host(grad)
    # The weight first: a gradient must match its weight's device.
    parameter.data = self._host[parameter]
    parameter.grad = host_grad

  def remove(self) -> None:
    for handle in self._handles:
      handle.remove()
