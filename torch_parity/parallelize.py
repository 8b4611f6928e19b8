"""The one place a PyTorch run's parallelism is applied to its model.

`parallelize` takes the model (on this process's device) and its optimizer
and applies, in a fixed order:

  1. pipeline stages: keep this rank's stage of the model (not yet: the
     run's ParallelDims has pipeline = 1, and the trainers refuse more);
  2. data parallelism: DDP wraps the module, so gradient buckets are
     all-reduced while backward still runs; or Horovod wraps the optimizer,
     which all-reduces from backward hooks;
  3. offload: where tensors live between uses (not yet).

Why this order: DDP and Horovod must wrap the module a rank really runs, so
the model is cut into stages first; offload moves the tensors of an already
wrapped module, whose hooks must not see them move underneath.
"""

from typing import Tuple

from torch import nn

from torch_parity.distribute import Strategy


def parallelize(model: nn.Module, optimizer,
                strategy: Strategy) -> Tuple[nn.Module, object]:
  """The module the train step calls and the optimizer it steps.

  Args:
    model: the whole model, already on `strategy.device`.
    optimizer: its optimizer, built on the device-resident parameters.
    strategy: this process's part in the run's parallelism.

  Returns:
    (train_model, optimizer). Checkpoints keep using `model` itself (the
    unwrapped module) and the returned optimizer, whose state is the one to
    save: Horovod's DistributedOptimizer is a new optimizer of its own.
  """
  if strategy.dims.is_pipelined:
    raise ValueError(f"Invalid value for argument `strategy`. Received: "
                     f"pipeline={strategy.dims.pipeline}; allowed: 1 "
                     "(PyTorch pipeline stages are not built yet)")
  train_model = strategy.wrap_model(model)
  optimizer = strategy.wrap_optimizer(optimizer, model)
  return train_model, optimizer
