"""The step timed alone before training: PyTorch's side of
`overlap_core.runtime.contention`.

The run's own step function is called on a resident copy of this rank's
first batch (`data.make_resident_iterator`: the loader's first batch
without its workers), before the training loader's iterator exists: its
workers start filling their prefetch queues the moment it is made, on the
host's cores, and timed beside that fill the reference would hide the
training steps' contention (TensorFlow's side says where this was seen).
The model's state (weights
and buffers such as BatchNorm's running statistics), the optimizer's
state, the loss scaler's and the random streams are copied first and put
back after, so the run trains exactly as it would without the
calibration. Under DDP or Horovod every process calibrates at the same
point (the steps all-reduce their loss), and what the steps left in the
all-reduce clock is dropped. Under DDP the step is timed with its
gradient all-reduce paused (no_sync): the buckets' all-reduce runs beside
backward and slows it, which is then contention, apart from the wait
that `exposed_comm` times.

  reference = reference_step.calibrate(
      train_step, batch, model=model, optimizer=optimizer,
      strategy=strategy, num_steps=5)
"""

import contextlib
import copy
import dataclasses
from typing import Callable, Union

import torch

from overlap_core.runtime import contention, offload_cost


def snapshot(model: torch.nn.Module, optimizer, *, grad_scaler=None,
             device: torch.device) -> Callable[[], None]:
  """A copy of what a step changes; returns the function that puts it
  back."""
  model_state = copy.deepcopy(model.state_dict())
  optimizer_state = copy.deepcopy(optimizer.state_dict())
  scaler_state = (copy.deepcopy(grad_scaler.state_dict())
                  if grad_scaler is not None else None)
  cpu_rng = torch.get_rng_state()
  cuda_rng = (torch.cuda.get_rng_state(device) if device.type == "cuda"
              else None)

  def restore() -> None:
    model.load_state_dict(model_state)
    # Before the first step the optimizer holds no state: loading the
    # empty copy drops what the calibration's steps made.
    optimizer.load_state_dict(optimizer_state)
    if grad_scaler is not None:
      grad_scaler.load_state_dict(scaler_state)
    torch.set_rng_state(cpu_rng)
    if cuda_rng is not None:
      torch.cuda.set_rng_state(cuda_rng, device)
    optimizer.zero_grad()

  return restore


def calibrate(train_step, batch, *, model: torch.nn.Module, optimizer,
              strategy, num_steps: int, offloader=None, pipeline=None
              ) -> Union[contention.ReferenceStep, offload_cost.OffloadCost]:
  """Times `train_step` on `batch`, a batch held resident.

  Args:
    train_step: `steps.make_train_step`'s function.
    model: the plain module (not its DDP wrapper), whose state is saved.
    strategy: the run's `distribute.Strategy`.
    offloader: the run's `offload.Offloader`, one that `can_pause`, or
      None. With one, the step is timed with offload and without.
    pipeline: the run's `pipeline.PipelineRuntime`, one that
      `can_run_alone`, or None. With one, the rank's stage is timed alone
      (`PipelineRuntime.alone`), on stand-ins for its neighbours' tensors.

  Returns:
    The reference step, or with an offloader the offload's cost.
  """

  def run_step() -> None:
    loss = train_step(batch)
    if strategy.device.type == "cuda":
      torch.cuda.synchronize(strategy.device)
    float(loss)

  restore = snapshot(model, optimizer,
                     grad_scaler=getattr(train_step, "grad_scaler", None),
                     device=strategy.device)
  # Alone, a step leaves its gradient all-reduce out. DDP's buckets
  # all-reduce while backward runs, on threads that take cores from it:
  # timed without them, the slower backward is contention, beside the wait
  # exposed_comm times (BENCHMARKS §17); a replicated stage's all-reduce,
  # likewise, is paused by `PipelineRuntime.alone`.
  pauses_ddp = offloader is None and strategy.can_pause_all_reduce
  without_all_reduce = pauses_ddp or (
      pipeline is not None and pipeline.mesh.dims.data_parallel > 1)
  with pipeline.alone() if pipeline else contextlib.nullcontext():
    if pauses_ddp:

      def run_step_alone() -> None:
        with strategy.all_reduce_paused():
          run_step()

      reference = contention.time_reference(
          run_step_alone, num_steps=num_steps, restore=restore)
    elif offloader is None:
      reference = contention.time_reference(run_step, num_steps=num_steps,
                                            restore=restore)
    else:

      def run_step_without_offload() -> None:
        with offloader.paused():
          run_step()

      reference = offload_cost.time_with_and_without(
          run_step, run_step_without_offload, num_steps=num_steps,
          restore=restore)
      offloader.discard_records()
  strategy.discard_step_timings()
  if without_all_reduce:
    reference = dataclasses.replace(reference, holds_parts=False)
  return reference
