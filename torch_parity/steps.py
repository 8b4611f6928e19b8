"""The training and evaluation steps, matching tfoverlap/steps.py.

The gradient all-reduce happens inside `loss.backward()`: DDP all-reduces
each gradient bucket from autograd hooks as soon as it is ready, and
Horovod's DistributedOptimizer does the same per tensor (fused up to its
threshold); `optimizer.step()` waits for what is still in flight. The part of that
communication backward did not hide is timed by the strategy
(`Strategy.backward`, `Strategy.synchronize`) and recorded apart from
compute as `exposed_comm`; TensorFlow's stays inside its compiled step.
"""

import contextlib
import math
import time

import torch
from torch import nn
from torch.nn import functional as F

from overlap_core.runtime.config import ModelConfig
from overlap_core.runtime.evaluation import evaluation_result
from overlap_core.runtime.pipeline_stats import BUBBLE
from overlap_core.runtime.user_code import REGRESSION
from overlap_core.runtime.zoo import CLASSIFICATION, SUPER_RESOLUTION

# Keras' defaults, which the TensorFlow side uses, where torch's differ.
MOMENTUM = 0.9  # --optimizer=momentum, as on the TensorFlow side
ADAM_EPSILON = 1e-7  # Keras; torch's default is 1e-8
LOSS_SCALE_INITIAL = 2.0**15  # Keras' LossScaleOptimizer; torch's is 2**16
LOSS_SCALE_GROWTH_STEPS = 2000  # both frameworks

_AUTOCAST_DTYPES = {
    "mixed_float16": torch.float16,
    "mixed_bfloat16": torch.bfloat16,
}


def build_optimizer(cfg: ModelConfig, parameters) -> torch.optim.Optimizer:
  """sgd, momentum or adam with the TensorFlow side's hyperparameters.

  Keras' SGD with momentum (velocity = m * velocity - lr * g) and torch's
  (buffer = m * buffer + g; w -= lr * buffer) take identical steps at a
  constant learning rate. Adam differs in one detail no setting removes:
  Keras adds epsilon to sqrt(v) before bias correction, torch after, so
  Keras' 1e-7 is torch's 1e-7 * sqrt(1 - beta_2**t); only steps whose
  second moment is near zero notice.
  """
  if cfg.optimizer == "sgd":
    return torch.optim.SGD(parameters, lr=cfg.learning_rate)
  if cfg.optimizer == "momentum":
    return torch.optim.SGD(parameters, lr=cfg.learning_rate,
                           momentum=MOMENTUM)
  if cfg.optimizer == "adam":
    return torch.optim.Adam(parameters, lr=cfg.learning_rate,
                            betas=(0.9, 0.999), eps=ADAM_EPSILON)
  raise ValueError(f"optimizer={cfg.optimizer!r}: allowed: sgd, momentum, "
                   "adam")


def build_grad_scaler(precision: str, device: torch.device):
  """A loss scaler for mixed_float16, else None.

  float16 gradients underflow without scaling; bfloat16 has float32's
  exponent range and needs none. As on the TensorFlow side, the scaler is
  used on every device (torch runs float16 autocast on the CPU too).
  """
  if precision != "mixed_float16":
    return None
  return torch.amp.GradScaler(device.type, init_scale=LOSS_SCALE_INITIAL,
                              growth_interval=LOSS_SCALE_GROWTH_STEPS)


def autocast(precision: str, device: torch.device):
  """torch.autocast for mixed_*: float32 weights, low-precision compute."""
  dtype = _AUTOCAST_DTYPES.get(precision)
  if dtype is None:
    return contextlib.nullcontext()
  return torch.autocast(device_type=device.type, dtype=dtype)


def per_example_loss(task: str, targets, outputs) -> torch.Tensor:
  """Cross-entropy on logits, EDSR's L1 loss, or a regression's squared
  error, one value per example."""
  outputs = outputs.float()
  if task == SUPER_RESOLUTION:
    return (targets - outputs).abs().mean(dim=(1, 2, 3))
  if task == REGRESSION:
    errors = targets.float().reshape(outputs.shape) - outputs
    return errors.square().reshape(errors.shape[0], -1).mean(dim=1)
  return F.cross_entropy(outputs, targets.long(), reduction="none")


def _mean_loss(task: str, targets, outputs) -> torch.Tensor:
  """The mean of `per_example_loss` over the batch, by each loss's own
  mean reduction: one kernel, not a per-example vector and then its mean,
  and no casts where the types already fit. On a 3 ms CPU step the
  two-step form and its casts cost 1.5% of the step, the trainer's largest
  cost over a plain loop. Every example has as many elements, so the mean
  over elements is the mean over examples."""
  if outputs.dtype != torch.float32:
    outputs = outputs.float()
  if task == SUPER_RESOLUTION:
    return F.l1_loss(outputs, targets.to(outputs.dtype))
  if task == REGRESSION:
    return F.mse_loss(outputs,
                      targets.reshape(outputs.shape).to(outputs.dtype))
  if targets.dtype != torch.long:
    targets = targets.long()
  return F.cross_entropy(outputs, targets)


def make_train_step(model: nn.Module, optimizer, strategy, *, task: str,
                    precision: str):
  """One optimizer step on this process's batch.

  Args:
    model: the module to train, wrapped by `strategy.wrap_model`.
    optimizer: wrapped by `strategy.wrap_optimizer`.
    strategy: a `torch_parity.distribute.Strategy`.
    task: CLASSIFICATION or SUPER_RESOLUTION.
    precision: the --precision value.

  Returns:
    train_step((inputs, targets)) -> the global mean loss, a scalar tensor
    on the device (mean over every process's examples).
  """
  device = strategy.device
  scaler = build_grad_scaler(precision, device)
  all_reduces_in_optimizer = strategy.all_reduces_in_optimizer

  def train_step(batch):
    inputs, targets = batch
    inputs = inputs.to(device, non_blocking=True)
    targets = targets.to(device, non_blocking=True)
    optimizer.zero_grad()  # set_to_none by default; Horovod takes no args
    with autocast(precision, device):
      outputs = model(inputs)
    # This process's mean; DDP and Horovod average gradients over
    # processes, which makes it the global mean, as TensorFlow's
    # compute_average_loss over the global batch with a SUM all-reduce.
    loss = _mean_loss(task, targets, outputs)
    # The strategy runs backward and, for Horovod, the synchronize, so
    # that it can time the all-reduce they wait for (`exposed_comm`).
    if scaler is None:
      strategy.backward(loss)
      if all_reduces_in_optimizer:
        strategy.synchronize(optimizer)
        with optimizer.skip_synchronize():
          optimizer.step()
      else:
        optimizer.step()
    else:
      strategy.backward(scaler.scale(loss))
      if all_reduces_in_optimizer:
        # Horovod's documented order with a scaler: finish the all-reduce,
        # unscale the averaged gradients, then step without a second sync.
        strategy.synchronize(optimizer)
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
          scaler.step(optimizer)
      else:
        scaler.step(optimizer)
      scaler.update()
    return strategy.mean_over_replicas(loss.detach())

  # What the step changes besides the model and optimizer, for those that
  # must put it back (`reference_step.snapshot`).
  train_step.grad_scaler = scaler
  return train_step


def make_local_train_step(train_step, strategy):
  """`train_step` with no gradient all-reduced (DDP's no_sync), so each
  replica applies its own gradients, its loss still averaged over the
  replicas: a step of --all_reduce=off, for the blocks of
  --paired_removal=all_reduce. TensorFlow's makes the same step from its
  model and optimizer (`tfoverlap.steps.make_local_train_step`)."""

  def step_without_all_reduce(batch):
    with strategy.gradients_unsynced():
      return train_step(batch)

  return step_without_all_reduce


def make_apart_train_step(train_step, pipeline):
  """`train_step` with this rank's stage apart (`PipelineRuntime.apart`):
  on stand-ins for its neighbours' tensors, neither waiting for them nor
  transferring, for the blocks of --paired_removal=pipeline_waits.
  TensorFlow's client makes its step apart from its stages
  (`ProcessPipelineRuntime.make_train_step(apart=True)`)."""

  def step_apart(batch):
    with pipeline.apart():
      return train_step(batch)

  return step_apart


@torch.no_grad()
def _batch_sums(model, task, inputs, targets, precision, device):
  with autocast(precision, device):
    outputs = model(inputs)
  losses = per_example_loss(task, targets, outputs)
  if task == SUPER_RESOLUTION:
    squared = (targets - outputs.float()).square().mean(dim=(1, 2, 3))
    # PSNR of images in [0, 1]; the epsilon keeps a perfect match finite.
    quality = (-10.0 * torch.log(squared + 1e-10) / math.log(10.0)).sum()
  elif task == REGRESSION:
    errors = targets.float().reshape(outputs.shape) - outputs.float()
    quality = errors.abs().reshape(errors.shape[0], -1).mean(dim=1).sum()
  else:
    quality = (outputs.argmax(dim=-1) == targets.long()).float().sum()
  return losses.sum(), quality, float(losses.shape[0])


def evaluate(model: nn.Module, batches, strategy, *, task: str,
             precision: str) -> dict:
  """One pass over this process's share of the eval data, summed over all.

  Args:
    model: the plain module (not the DDP wrapper: evaluation needs no
      gradient synchronization).

  Returns:
    {"eval_loss", "eval_accuracy"} for classification, {"eval_loss",
    "eval_psnr_db"} for super-resolution, and "eval_examples"; {} when no
    process saw an example.
  """
  device = strategy.device
  was_training = model.training
  model.eval()
  sums = torch.zeros(3, dtype=torch.float64, device=device)
  try:
    for inputs, targets in batches:
      inputs = inputs.to(device, non_blocking=True)
      targets = targets.to(device, non_blocking=True)
      loss_sum, quality_sum, count = _batch_sums(model, task, inputs,
                                                 targets, precision, device)
      sums += torch.stack([loss_sum.double(), quality_sum.double(),
                           torch.tensor(count, dtype=torch.float64,
                                        device=device)])
  finally:
    model.train(was_training)
  loss_sum, quality_sum, count = strategy.sum_over_replicas(sums).tolist()
  return evaluation_result(task, loss_sum=loss_sum, quality_sum=quality_sum,
                           count=count)


def make_pipeline_loss(task: str):
  """The last stage's loss of one micro-batch: its mean per-example loss
  (the pipeline runtime divides it by M, DDP averages over replicas)."""

  def loss_fn(outputs, targets):
    return _mean_loss(task, targets, outputs)

  return loss_fn


def make_pipeline_train_step(runtime, optimizer, strategy):
  """One optimizer step of a pipelined batch.

  Every rank reads the same batch of its replica; the first stage feeds
  the inputs in, the last compares its outputs with the targets.

  Returns:
    train_step((inputs, targets)) -> the global mean loss on every rank:
    the last stages' losses summed over the world (other ranks add zero)
    and divided by the replicas.
  """
  device = strategy.device
  replicas = strategy.dims.data_parallel

  def train_step(batch):
    inputs, targets = batch
    optimizer.zero_grad()
    loss = runtime.step(inputs.to(device, non_blocking=True),
                        targets.to(device, non_blocking=True))
    start = time.perf_counter()
    optimizer.step()
    runtime.recorder.record_update(start, time.perf_counter())
    if loss is None:
      loss = torch.zeros((), device=device)
    if not runtime.waits_for_loss:
      return loss  # a stage timed alone: its own work, nobody else's loss
    # Every rank waits here for the last stage's loss, which the last
    # backward on the first stage comes after: time spent idle on a
    # neighbour, so it counts as bubble.
    start = time.perf_counter()
    total = strategy.sum_over_replicas(loss)
    runtime.timer.record(BUBBLE, start, time.perf_counter())
    return total / replicas

  return train_step


def make_burst_train_step(burst, optimizer, strategy, *, task: str,
                          global_batch_size: int):
  """One optimizer step of a burst plan.

  Args:
    burst: the `torch_parity.burst.BurstModel` running the plan.
    optimizer: the optimizer of the module it runs.
    strategy: a `torch_parity.distribute.Strategy`.
    task: CLASSIFICATION or SUPER_RESOLUTION.
    global_batch_size: the batch every rank reads whole.

  Every rank reads the whole global batch and keeps the rows its first
  layer needs (inputs) and its last layer produces (targets).

  Returns:
    train_step((inputs, targets)) -> the global mean loss on every rank.
  """
  device = strategy.device

  def train_step(batch):
    inputs, targets = batch
    optimizer.zero_grad()
    outputs = burst(burst.local_input(
        inputs.to(device, non_blocking=True)))
    targets = burst.local_rows(targets.to(device, non_blocking=True))
    # This rank's rows summed over the global batch: the group all-reduce
    # of each layer's gradients then gives the global mean's gradient (a
    # rank outside the last layer's set has no rows and adds zero).
    loss = per_example_loss(task, targets, outputs).sum() / global_batch_size
    loss.backward()
    burst.allreduce_gradients()
    optimizer.step()
    return strategy.sum_over_replicas(loss.detach())

  return train_step
