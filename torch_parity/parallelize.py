"""The one place a PyTorch run's parallelism is applied to its model.

`parallelize` takes the model (on this process's device) and its optimizer
and applies, in a fixed order:

  1. pipeline stages: keep this rank's stage of the model (not yet: the
     run's ParallelDims has pipeline = 1, and the trainers refuse more);
  2. data parallelism: DDP wraps the module, so gradient buckets are
     all-reduced while backward still runs; or Horovod wraps the optimizer,
     which all-reduces from backward hooks;
  3. offload: saved activations and/or each layer's weights live in host
     memory between uses (`torch_parity.offload.apply_offload`).

Why this order: DDP and Horovod must wrap the module a rank really runs, so
the model is cut into stages first; offload moves the tensors of an already
wrapped module, whose hooks must not see them move underneath.
"""

from typing import Callable, NamedTuple, Optional

from torch import nn

from overlap_core.planning.dims import ParallelDims
from overlap_core.runtime.config import OffloadConfig
from torch_parity import offload as offload_lib
from torch_parity.distribute import Strategy


class Parallelized(NamedTuple):
  """A model with the run's parallelism applied.

  Attributes:
    model: the module itself, on this process's device; its state_dict is
      what checkpoints save.
    train_model: what the train step calls (DDP's wrapper, or the module).
    optimizer: what the train step steps, and whose state checkpoints save:
      Horovod's DistributedOptimizer is a new optimizer of its own.
    dims: the run's degrees of parallelism.
    offload: the `Offloader` whose hooks move tensors, or None.
  """
  model: nn.Module
  train_model: nn.Module
  optimizer: object
  dims: ParallelDims
  offload: Optional[offload_lib.Offloader] = None


def parallelize(strategy: Strategy, build_model: Callable[[], nn.Module],
                build_optimizer: Callable[[nn.Module], object],
                offload: OffloadConfig = OffloadConfig()) -> Parallelized:
  """Builds the model and optimizer with the run's parallelism applied.

  Args:
    strategy: this process's part in the run's parallelism.
    build_model: makes the whole model (on the CPU; it is moved here).
    build_optimizer: makes its optimizer from the device-resident module.
    offload: what to keep in host memory between uses.
  """
  dims = strategy.dims
  if dims.is_pipelined:
    raise ValueError(f"Invalid value for argument `strategy`. Received: "
                     f"pipeline={dims.pipeline}; allowed: 1 (PyTorch "
                     "pipeline stages are not built yet)")
  model = build_model().to(strategy.device)
  optimizer = build_optimizer(model)
  train_model = strategy.wrap_model(model)
  optimizer = strategy.wrap_optimizer(optimizer, model)
  offloader = offload_lib.apply_offload(model, optimizer, offload,
                                        strategy.device)
  return Parallelized(model, train_model, optimizer, dims, offloader)
