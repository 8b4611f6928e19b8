"""Timed, counted copies between the device and host memory for offload.

Every offload copy in PyTorch goes through a `Copier`, so pinning and
non-blocking are two independent settings and every copy is counted and
timed the same way:

- pinned host buffers are allocated as such (`pin_memory=True`), never
  implied by `non_blocking`;
- a non-blocking copy is `dst.copy_(src, non_blocking=True)` into a buffer
  this module allocated. `tensor.to("cpu", non_blocking=True)` would
  allocate a pinned buffer behind the user's back, so it is never used.
  Into pageable memory CUDA makes the host wait for a device-to-host copy
  anyway (it stages through a driver buffer); that is the cost the
  "non-blocking only" variant measures, not a bug to hide;
- on CUDA each copy is timed with a pair of events on the stream it runs
  on, read once the step is over (`resolve_timings`); on the CPU the copy
  is synchronous and perf_counter times it;
- the copies the training stream runs in series with compute are also
  summed per step (`take_serial_s`), the ledger's `offload` phase where
  the step is not timed alone with and without offload: on CUDA all but
  the side stream's prefetches, on the CPU all of them (there is no side
  stream: a prefetch runs on the training thread at once).

Usage:

  copier = Copier(torch.device("cuda"), pin_memory=True,
                  non_blocking=True, stats=CopyStats())
  host = copier.to_host(activation)
  again = copier.to_device(host)
"""

import contextlib
import threading
import time

import torch

from overlap_core.runtime.offload_stats import TO_DEVICE, TO_HOST, CopyStats


def _empty_host_like(tensor: torch.Tensor, *, pin_memory: bool):
  """An uninitialized host tensor with `tensor`'s layout (so a channels-last
  activation comes back channels-last), pinned or pageable as asked."""
  stride = torch.empty_like(tensor, device="meta").stride()
  return torch.empty_strided(tensor.size(), stride, dtype=tensor.dtype,
                             device="cpu", pin_memory=pin_memory)


class Copier:
  """Copies tensors to host memory and back, counting and timing each.

  Args:
    device: the training device; on the CPU the "device" copy is a second
      CPU tensor, so the mechanics (and the counts) are those of a GPU run.
    pin_memory: allocate host buffers page-locked (needs CUDA).
    non_blocking: issue copies with non_blocking=True (meaningful on CUDA).
    stats: where copies are counted.
  """

  def __init__(self, device: torch.device, *, pin_memory: bool,
               non_blocking: bool, stats: CopyStats):
    self.device = torch.device(device)
    self.is_cuda = self.device.type == "cuda"
    if self.is_cuda and self.device.index is None:
      # Tensors name their device with its index; "cuda" alone would
      # compare unequal to every one of them.
      self.device = torch.device("cuda", torch.cuda.current_device())
    if pin_memory and not self.is_cuda:
      raise ValueError("Invalid value for argument `pin_memory`. Received: "
                       "True; pinned memory needs a CUDA device, and this "
                       f"one is {self.device}")
    self.pin_memory = pin_memory
    self.non_blocking = non_blocking
    self.stats = stats
    # (direction, start event, end event, in series) on CUDA
    self._pending = []
    self._serial_s = 0.0  # copies in series since the last take_serial_s
    self._lock = threading.Lock()  # autograd restores on a thread of its own

  @contextlib.contextmanager
  def _timed(self, direction: str, num_bytes: int, serial: bool):
    if not self.is_cuda:
      start = time.perf_counter()
      yield
      duration_s = time.perf_counter() - start
      self.stats.add(direction, num_bytes=num_bytes, duration_s=duration_s)
      with self._lock:
        self._serial_s += duration_s  # one thread: every copy is in series
      return
    # On the stream the copy runs on: the current one of the copies'
    # device (a side stream's inside its `torch.cuda.stream` block).
    stream = torch.cuda.current_stream(self.device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record(stream)
    yield
    end.record(stream)
    self.stats.add(direction, num_bytes=num_bytes)  # time comes later
    with self._lock:
      self._pending.append((direction, start, end, serial))

  def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of a device tensor."""
    host = _empty_host_like(tensor, pin_memory=self.pin_memory)
    with self._timed(TO_HOST, tensor.numel() * tensor.element_size(),
                     serial=True):
      host.copy_(tensor, non_blocking=self.non_blocking)
    return host

  def to_device(self, host: torch.Tensor, *,
                serial: bool = True) -> torch.Tensor:
    """A device copy of a host tensor, on the current stream.

    Args:
      serial: False for a side stream's copy, which overlaps compute.
    """
    device_tensor = torch.empty_like(host, device=self.device)
    with self._timed(TO_DEVICE, host.numel() * host.element_size(),
                     serial=serial):
      device_tensor.copy_(host, non_blocking=self.non_blocking)
    return device_tensor

  def resolve_timings(self) -> None:
    """Reads the CUDA events of finished copies into the stats.

    Called between steps (the loop has waited for the device by then), and
    before the stats are reported; waits for any copy still running.
    """
    with self._lock:
      pending, self._pending = self._pending, []
    for direction, start, end, serial in pending:
      end.synchronize()
      duration_s = start.elapsed_time(end) / 1e3
      self.stats.add_duration(direction, duration_s)
      if serial:
        with self._lock:
          self._serial_s += duration_s

  def take_serial_s(self) -> float:
    """Seconds of copies run in series with compute since the last call:
    a step's `offload` phase where it is not derived, read once the step
    is over."""
    self.resolve_timings()
    with self._lock:
      serial_s, self._serial_s = self._serial_s, 0.0
    return serial_s


class SideStream:
  """Copies issued ahead of use on a second stream, joined by events.

  On the CPU there is no second stream: the copies run at once, in order,
  so prefetch changes when a copy happens but not what it computes.
  """

  def __init__(self, copier: Copier):
    self._copier = copier
    self._stream = (torch.cuda.Stream(device=copier.device)
                    if copier.is_cuda else None)

  def fetch(self, hosts):
    """Starts device copies of `hosts`; returns (tensors, ready event)."""
    if self._stream is None:
      return [self._copier.to_device(h) for h in hosts], None
    main = torch.cuda.current_stream(self._copier.device)
    # The host buffers may still be filling from copies queued on the main
    # stream (a non-blocking save); the side stream starts after them.
    self._stream.wait_stream(main)
    with torch.cuda.stream(self._stream):
      tensors = [self._copier.to_device(h, serial=False) for h in hosts]
      ready = torch.cuda.Event()
      ready.record(self._stream)
    for tensor in tensors:
      # Allocated on the side stream, used on the main one: the allocator
      # must not hand the memory out again before the main stream is done.
      tensor.record_stream(main)
    return tensors, ready

  @staticmethod
  def wait(ready, device: torch.device) -> None:
    """Makes `device`'s current stream wait for a fetch (no host wait).

    The stream of the copies' device, not of whatever device is current:
    in backward, autograd's thread may have another one current.
    """
    if ready is not None:
      torch.cuda.current_stream(device).wait_event(ready)
