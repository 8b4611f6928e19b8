"""Per-layer forward and backward times of a PyTorch model, as a Profile.

Every layer of the traced graph runs alone on inputs of the shapes it sees
in the model (recorded by running the whole model once per batch size),
`warmup` times untimed and `repeats` times timed; the median goes into the
shared profile schema (`overlap_core.planning.profile`). Timing is
`time.perf_counter` on the CPU and CUDA events on a GPU. Before every timed
call a buffer larger than the caches is swept (`overlap_core.planning.
cache`): in training a layer's weights come from memory, not from the
cache its previous repeat left them in.

Given the trainer's optimizer (`optimizer_factory`), every layer that owns
parameters also has its update timed: a fresh optimizer over that layer's
parameters alone, stepped once untimed (Adam builds its state on the
first step), then `warmup` and `repeats` times. The gradients are the
model's own, from one backward of the whole model (`_model_gradients`):
an update's time depends on their values (one thread's Adam step over 64
MiB took 1.8 times as long on all-zero gradients as on random ones), and
behind ReLUs many are exactly zero. A pipeline stage updates once per
step, so the update has no batch size.

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
    values = _record_values(traced, make_input(batch).to(dev))
    for node in traced.graph.nodes:
      if node.op not in ("call_module", "call_function", "call_method"):
        continue
      fwd, bwd = _time_node(traced, node, values, warmup, repeats, dev,
                            flush)
      timings.append(LayerTiming(
          layer=names[node], op_type=op_type_of(node, modules),
          batch_size=int(batch), forward_s=statistics.median(fwd),
          backward_s=statistics.median(bwd),
          forward_spread_s=max(fwd) - min(fwd),
          backward_spread_s=max(bwd) - min(bwd)))
  updates, call_s = (), 0.0
  if optimizer_factory is not None:
    _model_gradients(traced, make_input(min(batch_sizes)).to(dev))
    updates = tuple(_time_updates(traced, names, optimizer_factory, warmup,
                                  repeats, dev, flush))
    call_s = _call_seconds(optimizer_factory, warmup, repeats, dev, flush)
  return Profile(model=name or type(model).__name__,
                 framework=f"torch {torch.__version__}",
                 device=_describe(dev), warmup=warmup, repeats=repeats,
                 dtype="float32", date=utc_now_iso(), timings=tuple(timings),
                 threads=torch.get_num_threads(),
                 optimizer=optimizer_name if updates else "",
                 updates=updates, update_call_s=call_s if updates else 0.0)


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
        param_bytes=int(sum(p.numel() * p.element_size() for p in params)),
        update_s=statistics.median(seconds),
        update_spread_s=max(seconds) - min(seconds)))
  return updates


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


def _record_values(traced: fx.GraphModule, example) -> Dict[fx.Node, object]:
  """Every node's output on `example`: the inputs each layer is timed on."""
  values = {}

  class Recorder(fx.Interpreter):

    def run_node(self, n):
      out = super().run_node(n)
      values[n] = out.detach() if isinstance(out, torch.Tensor) else out
      return out

  with torch.no_grad():
    Recorder(traced).run(example)
  return values


def _bind(node: fx.Node, values, traced):
  """A zero-argument forward of `node` on fresh inputs, and those inputs."""
  fresh = {}

  def materialize(arg):
    value = values[arg]
    if isinstance(value, torch.Tensor) and value.is_floating_point():
      leaf = value.clone().requires_grad_(True)
      # A non-leaf copy, so in-place layers (ReLU(inplace=True)) may write it.
      fresh[arg] = (leaf, leaf.clone())
      return fresh[arg][1]
    return value

  args = fx.node.map_arg(node.args, materialize)
  kwargs = fx.node.map_arg(node.kwargs, materialize)
  if node.op == "call_module":
    target = traced.get_submodule(node.target)
    return (lambda: target(*args, **kwargs)), target
  if node.op == "call_method":
    self_arg, rest = args[0], args[1:]
    return (lambda: getattr(self_arg, node.target)(*rest, **kwargs)), None
  return (lambda: node.target(*args, **kwargs)), None


def _time_node(traced, node, values, warmup: int, repeats: int,
               dev: torch.device, flush: Callable[[], None]
               ) -> Tuple[List[float], List[float]]:
  forward_s, backward_s = [], []
  for k in range(warmup + repeats):
    # Weights cold, inputs warm: the previous layer has just written them.
    flush()
    run, module = _bind(node, values, traced)
    if module is not None:
      module.zero_grad(set_to_none=True)
    out, fwd = _timed(run, dev)
    tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out])
               if isinstance(t, torch.Tensor) and t.requires_grad]
    bwd = 0.0
    if tensors:
      flush()
      grads = [torch.ones_like(t) for t in tensors]
      _, bwd = _timed(lambda: torch.autograd.backward(tensors, grads), dev)
    if k >= warmup:
      forward_s.append(fwd)
      backward_s.append(bwd)
  return forward_s, backward_s


def _timed(fn, dev: torch.device):
  """fn()'s result and its seconds: CUDA events on a GPU, else perf_counter."""
  if dev.type == "cuda":
    start, end = (torch.cuda.Event(enable_timing=True),
                  torch.cuda.Event(enable_timing=True))
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize(dev)
    return out, start.elapsed_time(end) / 1e3
  begin = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - begin
