"""Burst parallelism in PyTorch: every layer on its planned number of ranks.

A burst plan (`overlap_core/planning/burst.py`) gives each layer a width k:
the layer runs on ranks 0 .. k-1, each on its contiguous part of the
global batch (`split_samples`). This module runs such a plan in a
torch.distributed world (gloo on CPU, NCCL on GPUs):

- **groups**: one process group per distinct width (ranks 0 .. k-1),
  created by every rank in the same order, as torch requires;
- **scatter and gather** between layers of different width: an autograd
  Function moves exactly the samples that change rank, point to point
  (isend/irecv), and moves their gradients back the same way in backward;
- **idle ranks**: every rank holds a local part of every activation, empty
  on the ranks outside a layer's set. Such a rank does not run the layer;
  its empty output stays tied to its empty input in autograd, so that its
  backward still reaches every exchange it took part in;
- **gradient all-reduce** of each layer's parameters within its own
  group, after backward (`allreduce_gradients`).

Every rank builds the same autograd graph of exchanges, created in the
same order, and PyTorch's engine runs ready nodes newest first: so the
exchanges meet in the same order in backward on every rank.

  model = BurstModel(module, plan.widths_by_layer(), global_batch=B,
                     example_input=x[:2])
  out = model(model.local_input(x))           # this rank's part
  loss = loss_fn(out, model.local_rows(y), reduction="sum") / B
  loss.backward(); model.allreduce_gradients(); optimizer.step()

Limits: every layer must output one batch-first tensor (a traced
`x.size(0)` is refused: use nn.Flatten); BatchNorm normalizes over each
rank's part, as unsynchronized data parallelism does.
"""

from typing import Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from overlap_core.planning.burst import check_plan_layers
from overlap_core.planning.burst_costs import sample_ranges
from overlap_core.planning.graph import MODEL_INPUT, neutral_names
from torch_parity.planning.graph import layer_names

_LAYER_OPS = ("call_module", "call_function", "call_method")


def _overlap(a: Tuple[int, int], b: Tuple[int, int]) -> Tuple[int, int]:
  return max(a[0], b[0]), min(a[1], b[1])


def _exchange(local: torch.Tensor, src: List[Tuple[int, int]],
              dst: List[Tuple[int, int]], rank: int, tag: int) -> torch.Tensor:
  """Rows laid out by `src` ranges (one per rank) re-laid out by `dst`."""
  mine_src, mine_dst = src[rank], dst[rank]
  out = local.new_empty((mine_dst[1] - mine_dst[0],) + local.shape[1:])
  lo, hi = _overlap(mine_src, mine_dst)
  if lo < hi:
    out[lo - mine_dst[0]:hi - mine_dst[0]] = local[lo - mine_src[0]:
                                                   hi - mine_src[0]]
  pending, inbox = [], []
  for peer in range(len(src)):
    if peer == rank:
      continue
    lo, hi = _overlap(mine_src, dst[peer])
    if lo < hi:
      pending.append(dist.isend(
          local[lo - mine_src[0]:hi - mine_src[0]].contiguous(), peer,
          tag=tag))
    lo, hi = _overlap(src[peer], mine_dst)
    if lo < hi:
      buffer = out.new_empty((hi - lo,) + out.shape[1:])
      pending.append(dist.irecv(buffer, peer, tag=tag))
      inbox.append((lo - mine_dst[0], hi - mine_dst[0], buffer))
  for request in pending:
    request.wait()
  for start, end, buffer in inbox:
    out[start:end] = buffer
  return out


class _Redistribute(torch.autograd.Function):
  """Forward: rows from `src` to `dst` layout; backward: gradients back."""

  @staticmethod
  def forward(ctx, local, anchor, src, dst, rank, tag):
    # The anchor only makes the output require grad on every rank. Its
    # gradient must live where it does: autograd refuses a CPU gradient
    # for a CUDA input.
    ctx.anchor_like = (anchor.device, anchor.dtype)
    ctx.layout = (src, dst, rank, tag)
    return _exchange(local, src, dst, rank, tag)

  @staticmethod
  def backward(ctx, grad):
    src, dst, rank, tag = ctx.layout
    back = _exchange(grad.contiguous(), dst, src, rank, tag + 1)
    device, dtype = ctx.anchor_like
    anchor_grad = torch.zeros((), device=device, dtype=dtype)
    return back, anchor_grad, None, None, None, None


def build_groups(widths: List[int], world_size: int) -> Dict[int, object]:
  """One process group per width (ranks 0 .. k-1); every rank calls this."""
  groups = {}
  for k in sorted(set(widths)):
    if k == world_size:
      groups[k] = dist.group.WORLD
    elif k > 1:
      groups[k] = dist.new_group(ranks=list(range(k)))
  return groups


class BurstModel(nn.Module):
  """Runs `module` with every layer on its planned width; see the module
  docstring. Construct it in every rank, after init_process_group."""

  def __init__(self, module: nn.Module, widths_by_layer: Mapping[str, int],
               *, global_batch: int, example_input: torch.Tensor,
               rank: Optional[int] = None,
               world_size: Optional[int] = None):
    super().__init__()
    self.rank = dist.get_rank() if rank is None else rank
    self.world_size = (dist.get_world_size() if world_size is None
                       else world_size)
    self.global_batch = global_batch
    self.traced = fx.symbolic_trace(module)
    # Plans name layers neutrally ("features_0" for "features.0"): one plan
    # serves both trainers. Keys here are those names from the start.
    names = layer_names(self.traced)
    neutral = neutral_names(names.values())
    self._names = {node: neutral[name] for node, name in names.items()}
    self._widths = self._check_widths(widths_by_layer)
    self._per_sample, self._dtypes = self._per_sample_shapes(example_input)
    self._ranges = {k: self._padded_ranges(k)
                    for k in set(self._widths.values())}
    self._groups = build_groups(list(self._widths.values()), self.world_size)
    self._modules_by_width = self._owned_modules()

  def _check_widths(self, widths_by_layer) -> Dict[str, int]:
    """The plan's widths, refused unless they name exactly the model's
    layers (neutral names), each at a width this world can run.

    Raises:
      ValueError: one line naming the first layer at fault.
    """
    layers = [self._names[n] for n in self.traced.graph.nodes
              if n.op in _LAYER_OPS]
    check_plan_layers(layers, widths_by_layer,
                      max_width=min(self.world_size, self.global_batch))
    widths = dict(widths_by_layer)
    first = next(n for n in self.traced.graph.nodes if n.op in _LAYER_OPS)
    # The input arrives where its first reader runs: no exchange there.
    widths[MODEL_INPUT] = widths[self._names[first]]
    return widths

  def _per_sample_shapes(self, example_input
                         ) -> Tuple[Dict[str, torch.Size],
                                    Dict[str, torch.dtype]]:
    """Each layer's output shape past the batch, and its dtype."""
    was_training = self.traced.training
    self.traced.eval()
    try:
      with torch.no_grad():
        ShapeProp(self.traced).propagate(example_input)
    finally:
      self.traced.train(was_training)
    shapes, dtypes = {}, {}
    for node in self.traced.graph.nodes:
      meta = node.meta.get("tensor_meta")
      if node.op == "output":
        continue
      if not hasattr(meta, "shape") or (
          len(meta.shape) == 0 or meta.shape[0] != example_input.shape[0]):
        raise ValueError(f"layer {self._names[node]!r} does not output one "
                         "batch-first tensor; the burst runtime needs every "
                         "layer to")
      shapes[self._names[node]] = meta.shape[1:]
      dtypes[self._names[node]] = meta.dtype
    return shapes, dtypes

  def _padded_ranges(self, k: int) -> List[Tuple[int, int]]:
    """Each rank's sample range at width k; empty beyond the k-th rank."""
    ranges = list(sample_ranges(self.global_batch, k))
    end = self.global_batch
    return ranges + [(end, end)] * (self.world_size - k)

  def _owned_modules(self) -> Dict[int, List[nn.Module]]:
    by_width: Dict[int, List[nn.Module]] = {}
    modules = dict(self.traced.named_modules())
    for node in self.traced.graph.nodes:
      if node.op == "call_module":
        k = self._widths[self._names[node]]
        by_width.setdefault(k, []).append(modules[node.target])
    return by_width

  def local_rows(self, batch: torch.Tensor,
                 layer: Optional[str] = None) -> torch.Tensor:
    """This rank's rows of a whole batch under `layer`'s width (default:
    the output layer's, for labels)."""
    if layer is None:
      layer = self._names[self._output_node().args[0]]
    start, end = self._ranges[self._widths[layer]][self.rank]
    return batch[start:end]

  def local_input(self, batch: torch.Tensor) -> torch.Tensor:
    return self.local_rows(batch, MODEL_INPUT)

  def _output_node(self) -> fx.Node:
    return next(n for n in self.traced.graph.nodes if n.op == "output")

  def forward(self, local_input: torch.Tensor) -> torch.Tensor:
    env: Dict[fx.Node, torch.Tensor] = {}
    # On the input's device: on CUDA every part, empty or not, must be a
    # CUDA tensor, or NCCL would be handed a host buffer.
    device = local_input.device
    anchor = torch.zeros((), device=device, requires_grad=True)
    modules = dict(self.traced.named_modules())
    tag = 0
    for node in self.traced.graph.nodes:
      if node.op == "placeholder":
        env[node] = local_input
        continue
      if node.op == "output":
        return env[node.args[0]]
      if node.op == "get_attr":
        env[node] = getattr(self.traced, node.target)
        continue
      k = self._widths[self._names[node]]

      def arrive(producer: fx.Node, k=k):
        nonlocal tag
        value = env[producer]
        k_from = self._widths[self._names[producer]]
        tag += 2  # a forward and a backward tag per exchange
        if k_from == k:
          return value
        return _Redistribute.apply(value, anchor, self._ranges[k_from],
                                   self._ranges[k], self.rank, tag)

      args = fx.node.map_arg(node.args, arrive)
      kwargs = fx.node.map_arg(node.kwargs, arrive)
      if self.rank < k:
        env[node] = self._run(node, modules, args, kwargs)
      else:
        env[node] = self._idle_output(node, args, kwargs, device)
    raise ValueError("the traced graph has no output")

  @staticmethod
  def _run(node, modules, args, kwargs):
    if node.op == "call_module":
      return modules[node.target](*args, **kwargs)
    if node.op == "call_method":
      return getattr(args[0], node.target)(*args[1:], **kwargs)
    return node.target(*args, **kwargs)

  def _idle_output(self, node, args, kwargs,
                   device: torch.device) -> torch.Tensor:
    """An empty part, tied in autograd to this rank's empty inputs.

    It has the dtype the layer gave the example input (an embedding's
    output is not its input's dtype), on the device of the input.
    """
    name = self._names[node]
    shape = (0,) + tuple(self._per_sample[name])
    empty = torch.zeros(shape, device=device, dtype=self._dtypes[name])
    for value in list(args) + list(kwargs.values()):
      if isinstance(value, torch.Tensor) and value.requires_grad:
        # The sum of an empty part is 0; cast, so that a tie to an input
        # of another dtype does not promote the part's.
        empty = empty + (value.sum() * 0).to(empty.dtype)
    return empty

  def allreduce_gradients(self) -> None:
    """Sums each layer's parameter gradients within its own group."""
    for k in sorted(self._modules_by_width):
      if k == 1 or self.rank >= k:
        continue
      for module in self._modules_by_width[k]:
        for p in module.parameters():
          if p.grad is not None:
            dist.all_reduce(p.grad, group=self._groups[k])

  def share_first_rank_state(self, module: nn.Module) -> None:
    """Makes every rank hold rank 0's parameters and buffers.

    Rank 0 takes part in every layer (every width's ranks start at 0), so
    it alone holds the whole trained model; the other ranks' copies of the
    layers they did not run stay at their initial values. After this, any
    rank can evaluate or report the whole model.
    """
    with torch.no_grad():
      for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)
