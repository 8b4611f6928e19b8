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
that `exposed_comm` times. A pipeline's stages are timed one rank at a
time (`_one_rank_at_a_time`), each with the host to itself.

  reference = reference_step.calibrate(
      train_step, batch, model=model, optimizer=optimizer,
      strategy=strategy, num_steps=5)
"""

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


def _one_rank_at_a_time(time_alone: Callable[[], object]):
  """`time_alone()` on each rank in turn, the others waiting at a barrier.

  A pipeline's stages take turns in training: one computes while another
  waits for its activations. Timed all at once, each stage shared the
  host with the others throughout, and the stage alone came out above
  its steps in a run of the stages apart, where each waits only for the
  closing loss: 0.79 ms at the median of 11 runs (BENCHMARKS §17), which
  hid as much of the pipeline's contention. So each stage is timed with
  the host to itself, and the other stages' work beside it in training is
  contention, in the pipeline and apart alike.
  """
  rank = torch.distributed.get_rank()
  reference = None
  for turn in range(torch.distributed.get_world_size()):
    if turn == rank:
      reference = time_alone()
    torch.distributed.barrier()
  return reference


def make_step_without_offload(train_step, offloader):
  """`train_step` with the offload hooks off: the step alone without
  offload, as `calibrate` times it and a run's blocks without offload
  (`--paired_removal=offload`) train it."""

  def step_without_offload(batch):
    with offloader.paused():
      return train_step(batch)

  return step_without_offload


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

  def run_step(step=train_step) -> None:
    loss = step(batch)
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

  def time_alone():
    if pauses_ddp:

      def run_step_alone() -> None:
        with strategy.all_reduce_paused():
          run_step()

      return contention.time_reference(
          run_step_alone, num_steps=num_steps, restore=restore,
          before_call=torch.distributed.barrier)
    if offloader is None:
      return contention.time_reference(run_step, num_steps=num_steps,
                                       restore=restore)

    step_without_offload = make_step_without_offload(train_step, offloader)

    def run_step_without_offload() -> None:
      run_step(step_without_offload)

    reference = offload_cost.time_with_and_without(
        run_step, run_step_without_offload, num_steps=num_steps,
        restore=restore)
    offloader.discard_records()
    return reference

  if pipeline is None:
    reference = time_alone()
  else:
    with pipeline.alone():
      reference = _one_rank_at_a_time(time_alone)
  strategy.discard_step_timings()
  if without_all_reduce:
    reference = dataclasses.replace(reference, holds_parts=False)
  return reference
