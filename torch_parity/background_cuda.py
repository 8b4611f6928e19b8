"""The background job on a GPU: a low-priority CUDA stream and a CUDA graph.

DeepPool multiplexes a GPU by running the background job's kernels on a
low-priority stream, so the GPU's scheduler prefers the foreground's
kernels whenever both have work, and by replaying the background step as a
CUDA graph, so one step is launched as a unit rather than kernel by kernel
from Python. CUDA picks the next thread block from the higher-priority
stream; a block already running is not pre-empted, which is why DeepPool
also cuts its graphs into short pieces (not done here: one step, one graph).

  job = CudaBackgroundJob("cuda:0")      # refuses a host without CUDA
  job.start(); ...; job.stop(); job.stats()

The foreground gets `foreground_stream(device)`, the highest priority: the
default stream already has the lowest, so a background stream alone would
not rank below it.

Status: written against the CUDA stream and graph API and never run by the
tests, which run on CPU-only hosts; the trainers refuse --background_job on
GPU hosts until this is wired in and measured.
"""

import threading
import time

import torch
from torch import nn


def require_cuda(device: str) -> torch.device:
  """The CUDA device, or a one-line RuntimeError on a host without CUDA."""
  if not torch.cuda.is_available():
    raise RuntimeError("the CUDA background job needs a GPU; this host has "
                       "none (on CPU hosts --background_job runs a separate "
                       "process under SCHED_IDLE)")
  return torch.device(device)


def foreground_stream(device: str) -> torch.cuda.Stream:
  """A stream of the highest priority for the foreground's work."""
  _, highest = torch.cuda.Stream.priority_range()
  return torch.cuda.Stream(require_cuda(device), priority=highest)


def background_stream(device: str) -> torch.cuda.Stream:
  """A stream of the lowest priority for the background job's work."""
  lowest, _ = torch.cuda.Stream.priority_range()
  return torch.cuda.Stream(require_cuda(device), priority=lowest)


class CudaBackgroundJob:
  """A small MLP trained on a low-priority stream, one CUDA graph per step,
  on a thread of the foreground's process."""

  def __init__(self, device: str = "cuda:0", batch_size: int = 64):
    self._device = require_cuda(device)
    self._stream = background_stream(device)
    self._batch_size = batch_size
    self._stop = threading.Event()
    self._thread = None
    self._steps = 0
    self._elapsed_s = 0.0

  def _build_graph(self):
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(),
                          nn.Linear(128, 10)).to(self._device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(self._batch_size, 64, device=self._device)
    y = torch.randint(0, 10, (self._batch_size,), device=self._device)
    with torch.cuda.stream(self._stream):
      for _ in range(3):  # warm-up on the side stream before capture
        optimizer.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=self._stream):
      optimizer.zero_grad(set_to_none=False)
      nn.functional.cross_entropy(model(x), y).backward()
      optimizer.step()
    return graph

  def _run(self) -> None:
    graph = self._build_graph()
    start = time.perf_counter()
    with torch.cuda.stream(self._stream):
      while not self._stop.is_set():
        graph.replay()
        self._stream.synchronize()
        self._steps += 1
    self._elapsed_s = time.perf_counter() - start

  def start(self) -> None:
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()

  def stats(self) -> dict:
    samples = self._steps * self._batch_size
    return {"policy": "CUDA stream priority (lowest) + CUDA graph",
            "steps": self._steps, "samples": samples,
            "samples_per_second": (samples / self._elapsed_s
                                   if self._elapsed_s else 0.0)}
