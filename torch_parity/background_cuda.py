"""The background job on a GPU: a low-priority CUDA stream and a CUDA graph.

DeepPool multiplexes a GPU by running the background job's kernels on a
low-priority stream, so the GPU's scheduler prefers the foreground's
kernels whenever both have work, and by replaying the background step as a
CUDA graph, so one step is launched as a unit rather than kernel by kernel
from Python. CUDA picks the next thread block from the higher-priority
stream; a block already running is not pre-empted, which is why DeepPool
also cuts its graphs into short pieces (not done here: one step, one graph).

This is the PyTorch trainer's --background_job on a CUDA device.
`CudaBackgroundRunner` starts the job halfway through the run on a thread
of the trainer's own process and files the foreground's steps as the
process runner does (`overlap_core/runtime/background.py`), so run.json's
`background` section has the same keys, and the stream priorities as the
streams report them.

Two streams, because the default stream already has the lowest priority:
a background stream alone would rank level with the foreground. The
foreground's steps run on `foreground_stream` (the highest priority
PyTorch offers) for the whole run, the steps before the job included, so
the baseline and the steps with the job differ by the job alone.

The job's step is captured once as a CUDA graph on its stream and replayed
there: a graph launched into a stream runs at that stream's priority. The
capture runs on the job's thread while other threads of the process may
issue work (the device prefetcher copies the next batches), so it uses
capture_error_mode="thread_local": only this thread's unsafe calls would
spoil it. Where the capture fails, the job steps eagerly on the same
stream, and run.json says why.

The job draws its weights and batch from a generator of its own: the
global generators are the foreground's, and a draw from this thread would
move the foreground's random stream.

  runner = CudaBackgroundRunner("small_mlp", "cuda:0", start_after_step=50,
                                warmup_steps=10, global_batch_size=64)
  with torch.cuda.stream(runner.foreground_stream):
    ...after each step: runner.on_step_end(step, step_s)
  runner.stop(); record["background"] = runner.stats()

Status: the tests that run it need CUDA and skip on hosts without it.
"""

import os
import threading
import time
from typing import Callable, Optional, Tuple

import torch
from torch import nn

from overlap_core.runtime import background

JOBS = ("small_mlp",)
START_TIMEOUT_S = 120.0  # the thread's warm-up steps and the capture
STOP_TIMEOUT_S = 30.0  # one step of a small MLP takes well under this
WARMUP_STEPS = 3  # before the capture: lazy state exists, kernels chosen
_FEATURES, _HIDDEN, _CLASSES = 64, 128, 10


def require_cuda(device) -> torch.device:
  """The CUDA device, or a one-line RuntimeError on a host without CUDA."""
  if not torch.cuda.is_available():
    raise RuntimeError("the CUDA background job needs a GPU; this host has "
                       "none (on CPU hosts --background_job runs a separate "
                       "process under SCHED_IDLE)")
  device = torch.device(device)
  if device.type != "cuda":
    raise ValueError(f"Invalid value for argument `device`. Received: "
                     f"{device}; allowed: a CUDA device")
  return device


def priority_range() -> Tuple[int, int]:
  """(lowest, highest) stream priority PyTorch offers on this host; CUDA
  counts down, so highest < lowest, and the default stream has lowest."""
  lowest, highest = torch.cuda.Stream.priority_range()
  return lowest, highest


def foreground_stream(device) -> torch.cuda.Stream:
  """A stream of the highest priority for the foreground's work."""
  return torch.cuda.Stream(require_cuda(device), priority=priority_range()[1])


def background_stream(device) -> torch.cuda.Stream:
  """A stream of the lowest priority for the background job's work."""
  return torch.cuda.Stream(require_cuda(device), priority=priority_range()[0])


class _SmallMlpStep:
  """The job: a 64 -> 128 -> 10 perceptron learning a fixed linear teacher
  by SGD on one static batch (a CUDA graph replays fixed buffers)."""

  def __init__(self, device: torch.device, batch_size: int, seed: int = 0):
    generator = torch.Generator(device=device).manual_seed(seed)
    # Built on the meta device, then filled from the job's own generator:
    # nn.Linear's own initialisation would draw from the global one.
    self.model = nn.Sequential(
        nn.Linear(_FEATURES, _HIDDEN, device="meta"), nn.ReLU(),
        nn.Linear(_HIDDEN, _CLASSES, device="meta")).to_empty(device=device)
    with torch.no_grad():
      for parameter in self.model.parameters():
        parameter.normal_(0.0, 0.1, generator=generator)
    self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
    self.x = torch.randn(batch_size, _FEATURES, generator=generator,
                         device=device)
    teacher = torch.randn(_FEATURES, _CLASSES, generator=generator,
                          device=device)
    self.y = (self.x @ teacher).argmax(dim=1)
    self.loss: Optional[torch.Tensor] = None

  def __call__(self) -> None:
    # Gradients zeroed in place, not dropped: a captured step must write
    # the same buffers every replay.
    self.optimizer.zero_grad(set_to_none=False)
    self.loss = nn.functional.cross_entropy(self.model(self.x), self.y)
    self.loss.backward()
    self.optimizer.step()


class CudaBackgroundRunner(background.JobRunner):
  """The job on the lowest-priority stream, on a thread of this process.

  Raises (at construction):
    RuntimeError: on a host without CUDA.
    ValueError: an unknown job or a device that is not CUDA.
  """

  def __init__(self, job: str, device, *, start_after_step: int,
               global_batch_size: int, warmup_steps: int = 0,
               batch_size: int = 64,
               start_timeout_s: float = START_TIMEOUT_S):
    if job not in JOBS:
      raise ValueError(f"Invalid value for argument `job`. Received: "
                       f"{job!r}; allowed: {', '.join(JOBS)}")
    super().__init__(job, start_after_step=start_after_step,
                     global_batch_size=global_batch_size,
                     warmup_steps=warmup_steps)
    self._device = require_cuda(device)
    self._stream = background_stream(self._device)
    self.foreground_stream = foreground_stream(self._device)
    self._batch_size = batch_size
    self._start_timeout_s = start_timeout_s
    self._stop = threading.Event()
    self._first_step = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._error: Optional[str] = None
    self._graph_error: Optional[str] = None
    self._uses_graph = False
    self._steps = 0
    self._elapsed_s = 0.0
    self._first_loss: Optional[float] = None
    self._last_loss: Optional[float] = None
    self._finished = False

  def _launch(self) -> None:
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name=f"background job {self._job}")
    self._thread.start()
    if not self._first_step.wait(self._start_timeout_s):
      self._halt()
      raise RuntimeError(f"background job {self._job!r} made no step within "
                         f"{self._start_timeout_s:.0f} s")
    if self._error is not None:
      raise RuntimeError(f"background job {self._job!r} failed before its "
                         f"first step: {self._error}")
    print(f"background job {self._job} started: {self._priority_seen()} "
          f"on {self._device}, foreground stream priority "
          f"{self.foreground_stream.priority}"
          f"{'' if self._uses_graph else ', eager steps (no CUDA graph)'}",
          flush=True)

  def _run(self) -> None:
    try:
      with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
        step = _SmallMlpStep(self._device, self._batch_size)
        run_step = self._capture(step)
        start = time.perf_counter()
        while not self._stop.is_set():
          run_step()
          # One step in flight: the next launch waits for this one, so
          # the job never queues more work than one step's.
          self._stream.synchronize()
          self._steps += 1
          if self._steps == 1:
            self._first_loss = float(step.loss.detach())
            self._first_step.set()
        self._elapsed_s = time.perf_counter() - start
        if self._steps:
          self._last_loss = float(step.loss.detach())
        self._finished = True
    except Exception as e:  # pylint: disable=broad-except
      # The trainer's thread reports it: at start, or in run.json.
      self._error = " ".join(f"{type(e).__name__}: {e}".split())
    finally:
      self._first_step.set()

  def _capture(self, step: _SmallMlpStep) -> Callable[[], None]:
    """The step as a CUDA graph replayed on the job's stream, or the eager
    step where the capture fails (the reason kept for run.json)."""
    for _ in range(WARMUP_STEPS):  # on the job's stream, as PyTorch asks
      step()
    graph = torch.cuda.CUDAGraph()
    try:
      with torch.cuda.graph(graph, stream=self._stream,
                            capture_error_mode="thread_local"):
        step()
    except RuntimeError as e:
      self._graph_error = " ".join(str(e).split())
      return step
    self._uses_graph = True
    # Replayed inside the thread's `torch.cuda.stream(self._stream)`:
    # a graph runs on the stream current at replay.
    return graph.replay

  def _halt(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=STOP_TIMEOUT_S)

  def _priority_seen(self) -> str:
    # Read back from the stream, not the number asked for: PyTorch maps a
    # priority outside the range it offers to the nearest it does.
    return f"CUDA stream priority {self._stream.priority}"

  def _job_stats(self) -> dict:
    lowest, highest = priority_range()
    samples = self._steps * self._batch_size
    graph = "CUDA graph" if self._uses_graph else "eager steps"
    return {
        "pid": os.getpid(),  # the trainer's own: the job is a thread of it
        "policy": f"lowest CUDA stream priority ({lowest}), {graph}",
        "policy_seen_by_foreground": self._priority_seen(),
        "device": str(self._device),
        "stream_priority": self._stream.priority,
        "foreground_stream_priority": self.foreground_stream.priority,
        "stream_priority_range": {"lowest": lowest, "highest": highest},
        "cuda_graph": self._uses_graph,
        "cuda_graph_error": self._graph_error,
        "error": self._error,
        "steps": self._steps,
        "samples": samples,
        "samples_per_second": (samples / self._elapsed_s
                               if self._elapsed_s > 0 else 0.0),
        "first_loss": self._first_loss,
        "last_loss": self._last_loss,
        "finished": self._finished,
    }


def make_runner(job: str, device, *, first_step: int, last_step: int,
                global_batch_size: int) -> Optional[CudaBackgroundRunner]:
  """The runner the PyTorch trainer starts halfway through its steps on a
  CUDA device; None when the run is too short to split
  (`background.split_steps`)."""
  split = background.split_steps(first_step=first_step, last_step=last_step)
  if split is None:
    return None
  start_after, warmup = split
  return CudaBackgroundRunner(job, device, start_after_step=start_after,
                              warmup_steps=warmup,
                              global_batch_size=global_batch_size)
