"""Per-layer forward and backward times of a PyTorch model, as a Profile.

Every layer is timed inside whole training passes of the traced model
(`_TimedPass`), as PipeDream's profiler does: per batch size, `warmup`
passes untimed and `repeats` timed, each pass a forward and a backward,
starting with caches swept (`overlap_core.planning.cache`: the step before
ended with an optimizer streaming every weight) and fresh gradients. The
medians go into the shared profile schema (`overlap_core.planning.
profile`). Timing is `time.perf_counter` on the CPU and CUDA events on a
GPU.

Given the trainer's optimizer (`optimizer_factory`), every layer that owns
parameters also has its update timed: a fresh optimizer over that layer's
parameters alone, stepped once untimed (Adam builds its state on the
first step), then `warmup` and `repeats` times. The gradients are the
model's own, from one backward of the whole model (`_model_gradients`):
an update's time depends on their values (one thread's Adam step over 64
MiB took 1.8 times as long on all-zero gradients as on random ones), and
behind ReLUs many are exactly zero. A pipeline stage updates once per
step, so the update has no batch size. On the same gradients, the
profile times adding them into a running sum, a parameter at a time:
what each micro-batch after a step's first costs a stage beyond its
backward (`Profile.gradient_sum_s_per_byte`).

  profile = profile_layers(model, make_input, batch_sizes=(4, 8, 16),
                           optimizer_factory=torch.optim.Adam,
                           optimizer_name="adam")
  open("resnet18.profile.json", "w").write(profile.to_json())
"""

import copy
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import fx
from torch import nn

from overlap_core.planning import cache
from overlap_core.planning.profile import (LayerTiming, Profile,
                                           UpdateTiming, utc_now_iso)
from torch_parity.planning.graph import layer_names, op_type_of


def profile_layers(model: nn.Module,
                   make_input: Callable[[int], torch.Tensor], *,
                   batch_sizes: Sequence[int] = (2, 4, 8), warmup: int = 2,
                   repeats: int = 5, name: str = "",
                   device: str = "cpu",
                   optimizer_factory: Optional[Callable] = None,
                   optimizer_name: str = "") -> Profile:
  """Times every layer of `model`, forward and backward, at each batch.

  Args:
    model: a symbolically traceable module with one tensor input.
    make_input: batch size -> an input batch (on the CPU).
    batch_sizes: the batch sizes to time each layer at.
    warmup: untimed runs before timing, per layer and batch.
    repeats: timed runs; the profile keeps their median and spread.
    name: the model name the profile records (default: the class name).
    device: "cpu" or a CUDA device such as "cuda:0".
    optimizer_factory: parameters -> the trainer's optimizer; None times
      no updates.
    optimizer_name: what the profile records as its optimizer.

  Returns:
    A Profile whose layer names match `build_layer_graph(model, ...)`.
  """
  if warmup < 0 or repeats < 1:
    raise ValueError(f"Invalid warmup/repeats: {warmup}, {repeats}; allowed: "
                     "warmup >= 0 and repeats >= 1")
  dev = torch.device(device)
  # A copy: timing runs in training mode, which would move the caller's
  # BatchNorm statistics, and `.to(dev)` would move the caller's weights.
  traced = fx.symbolic_trace(copy.deepcopy(model)).to(dev)
  names = layer_names(traced)
  modules = dict(traced.named_modules())
  flush = _cache_flusher(dev)
  timings: List[LayerTiming] = []
  for batch in batch_sizes:
    forward_s, backward_s = _time_in_context(
        traced, make_input(batch).to(dev), warmup, repeats, dev, flush)
    for node, fwd in forward_s.items():
      bwd = backward_s[node]
      timings.append(LayerTiming(
          layer=names[node], op_type=op_type_of(node, modules),
          batch_size=int(batch), forward_s=statistics.median(fwd),
          backward_s=statistics.median(bwd),
          forward_spread_s=max(fwd) - min(fwd),
          backward_spread_s=max(bwd) - min(bwd)))
  updates, call_s = (), 0.0
  _model_gradients(traced, make_input(min(batch_sizes)).to(dev))
  gradient_sum_rate = _gradient_sum_s_per_byte(traced, warmup, repeats, dev,
                                               flush)
  if optimizer_factory is not None:
    updates = tuple(_time_updates(traced, names, optimizer_factory, warmup,
                                  repeats, dev, flush))
    call_s = _call_seconds(optimizer_factory, warmup, repeats, dev, flush)
  return Profile(model=name or type(model).__name__,
                 framework=f"torch {torch.__version__}",
                 device=_describe(dev), warmup=warmup, repeats=repeats,
                 dtype="float32", date=utc_now_iso(), timings=tuple(timings),
                 threads=torch.get_num_threads(),
                 optimizer=optimizer_name if updates else "",
                 updates=updates, update_call_s=call_s if updates else 0.0,
                 gradient_sum_s_per_byte=gradient_sum_rate)


def _param_bytes(params) -> int:
  return int(sum(p.numel() * p.element_size() for p in params
                 if p.requires_grad))


def _cache_flusher(dev: torch.device) -> Callable[[], None]:
  """A call that sweeps a buffer larger than `dev`'s caches."""
  buffer = torch.zeros(cache.flush_bytes(dev.type) // 4, device=dev)
  return lambda: buffer.add_(1.0)


def _model_gradients(traced: fx.GraphModule, example: torch.Tensor) -> None:
  """Leaves one backward's gradients in every parameter's .grad.

  The loss is the outputs' mean square: the profiler knows no targets,
  and which gradients are zero is decided by the activations (a ReLU
  that did not fire passes none back), not by the loss.
  """
  traced.zero_grad(set_to_none=True)
  outputs = traced(example)
  tensors = [t for t in (outputs if isinstance(outputs, (list, tuple))
                         else [outputs]) if isinstance(t, torch.Tensor)]
  sum(t.float().square().mean() for t in tensors).backward()


def _time_updates(traced: fx.GraphModule, names, optimizer_factory,
                  warmup: int, repeats: int, dev: torch.device,
                  flush: Callable[[], None]) -> List[UpdateTiming]:
  """Each parameter-owning layer's optimizer step on the gradients
  `_model_gradients` left, over the traced copy's parameters (so the
  caller's model is untouched); a parameter with no gradient gets zeros."""
  updates = []
  for node in traced.graph.nodes:
    if node.op != "call_module":
      continue
    params = [p for p in traced.get_submodule(node.target).parameters()
              if p.requires_grad]
    if not params:
      continue
    for p in params:
      if p.grad is None:
        p.grad = torch.zeros_like(p)
    seconds = _step_seconds(optimizer_factory(params), warmup, repeats, dev,
                            flush)
    updates.append(UpdateTiming(
        layer=names[node],
        param_bytes=_param_bytes(params),
        update_s=statistics.median(seconds),
        update_spread_s=max(seconds) - min(seconds)))
  return updates


def _gradient_sum_s_per_byte(traced: fx.GraphModule, warmup: int,
                             repeats: int, dev: torch.device,
                             flush: Callable[[], None]) -> float:
  """Seconds per gradient byte of adding the gradients `_model_gradients`
  left into a running sum, as autograd does for each micro-batch after a
  step's first: a parameter at a time, in place. 0 without weights."""
  params = [p for p in traced.parameters() if p.requires_grad]
  if not params:
    return 0.0
  grads = [p.grad if p.grad is not None else torch.zeros_like(p)
           for p in params]
  sums = [g.clone() for g in grads]

  def add_all():
    for total, grad in zip(sums, grads):
      total.add_(grad)

  seconds = []
  for k in range(warmup + repeats):
    flush()
    _, took = _timed(add_all, dev)
    if k >= warmup:
      seconds.append(took)
  return statistics.median(seconds) / _param_bytes(params)


def _call_seconds(optimizer_factory, warmup: int, repeats: int,
                  dev: torch.device, flush: Callable[[], None]) -> float:
  """The optimizer's step over one 1-element parameter: what every call
  costs whatever it updates."""
  param = nn.Parameter(torch.zeros(1, device=dev))
  param.grad = torch.zeros_like(param)
  return statistics.median(_step_seconds(optimizer_factory([param]), warmup,
                                         repeats, dev, flush))


def _step_seconds(optimizer, warmup: int, repeats: int, dev: torch.device,
                  flush: Callable[[], None]) -> List[float]:
  """`repeats` timed steps, each after a cache sweep; one untimed step
  first (Adam and momentum allocate their state on it), then `warmup`."""
  seconds = []
  for k in range(1 + warmup + repeats):
    flush()
    _, took = _timed(optimizer.step, dev)
    if k > warmup:
      seconds.append(took)
  return seconds


def _describe(dev: torch.device) -> str:
  if dev.type == "cuda":
    return f"{dev} ({torch.cuda.get_device_name(dev)})"
  return str(dev)


_LAYER_OPS = ("call_module", "call_function", "call_method")


class _Clock:
  """Timestamps of a pass: perf_counter on the CPU (layers run in order on
  the calling thread); CUDA events on a GPU, read after the pass, since
  kernels run behind the Python that launches them."""

  def __init__(self, dev: torch.device):
    self._cuda = dev.type == "cuda"
    self._dev = dev

  def mark(self):
    if not self._cuda:
      return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event

  def seconds(self, begin, end) -> float:
    """Seconds between two marks of a pass that `settle` has finished."""
    if not self._cuda:
      return end - begin
    return begin.elapsed_time(end) / 1e3

  def settle(self) -> None:
    if self._cuda:
      torch.cuda.synchronize(self._dev)


class _TimedPass(fx.Interpreter):
  """One training pass of the traced model, every layer timed where it runs.

  Forward: a mark before and after each layer's node. Backward: a pre-hook
  on the autograd node that made each layer's output marks when backward
  reaches it; a layer's backward lasts from its mark to the next mark (any
  layer's) or the end of backward. The engine runs a CPU graph's nodes one
  at a time on the calling thread, and a layer's weight-gradient
  accumulation (AccumulateGrad, which the engine runs first among the
  ready nodes) falls inside its own interval.
  """

  def __init__(self, traced: fx.GraphModule, clock: _Clock):
    super().__init__(traced)
    self._clock = clock
    self.forward_marks: Dict[fx.Node, Tuple[object, object]] = {}
    self.backward_marks: List[Tuple[object, fx.Node]] = []
    self._hooked = set()

  def run_node(self, n):
    if n.op not in _LAYER_OPS:
      return super().run_node(n)
    begin = self._clock.mark()
    out = super().run_node(n)
    self.forward_marks[n] = (begin, self._clock.mark())
    for t in out if isinstance(out, (list, tuple)) else [out]:
      grad_fn = getattr(t, "grad_fn", None)
      # A getitem of a multi-output op (split, chunk) hands on that op's
      # autograd node: the op's layer owns the interval.
      if grad_fn is not None and id(grad_fn) not in self._hooked:
        self._hooked.add(id(grad_fn))
        grad_fn.register_prehook(self._marker(n))
    return out

  def _marker(self, node: fx.Node):
    def mark(grad_outputs):
      self.backward_marks.append((self._clock.mark(), node))
      return grad_outputs
    return mark


def _time_in_context(traced: fx.GraphModule, example: torch.Tensor,
                     warmup: int, repeats: int, dev: torch.device,
                     flush: Callable[[], None]
                     ) -> Tuple[Dict[fx.Node, List[float]],
                                Dict[fx.Node, List[float]]]:
  """Every layer's forward and backward seconds, one entry per repeat.

  Each repeat is a whole training pass (forward, then backward of the
  outputs' mean square, as `_model_gradients`), from cold caches and
  with fresh gradients, as a step starts after the optimizer has
  streamed every weight. Timed in the pass, a layer pays what it pays in
  training, and no more: timed alone, every layer paid a backward call
  of its own (0.1 ms on this project's CPU host, more than a small
  layer's work) and a cold cache for data a stage keeps warm, and the
  sums of such timings over ResNet-50's stages came out well above what
  the stages took.
  """
  clock = _Clock(dev)
  layers = [n for n in traced.graph.nodes if n.op in _LAYER_OPS]
  forward_s = {n: [] for n in layers}
  backward_s = {n: [] for n in layers}
  for k in range(warmup + repeats):
    traced.zero_grad(set_to_none=True)
    flush()
    timed = _TimedPass(traced, clock)
    outputs = timed.run(example)
    tensors = [t for t in (outputs if isinstance(outputs, (list, tuple))
                           else [outputs]) if isinstance(t, torch.Tensor)]
    sum(t.float().square().mean() for t in tensors).backward()
    end = clock.mark()
    clock.settle()
    if k < warmup:
      continue
    for n in layers:
      begin_fwd, end_fwd = timed.forward_marks[n]
      forward_s[n].append(clock.seconds(begin_fwd, end_fwd))
      backward_s[n].append(0.0)
    marks = timed.backward_marks + [(end, None)]
    for (begin, n), (next_mark, _) in zip(marks, marks[1:]):
      backward_s[n][-1] += clock.seconds(begin, next_mark)
  return forward_s, backward_s


def _timed(fn, dev: torch.device):
  """fn()'s result and its seconds, on `dev`'s clock (`_Clock`)."""
  clock = _Clock(dev)
  begin = clock.mark()
  out = fn()
  end = clock.mark()
  clock.settle()
  return out, clock.seconds(begin, end)
