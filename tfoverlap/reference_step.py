"""The step timed alone before training: TensorFlow's side of
`overlap_core.runtime.contention`.

The run's own step function is called on a resident copy of the run's
first batch (`data.make_resident_iterator`: the source's first batch
without its pipeline), before the training iterator exists. A tf.data
iterator starts filling its shuffle and prefetch buffers the moment it is
made, on the host's cores; timed after it, the reference took in that
fill, which the training steps no longer have beside them, and so hid
their contention: the mirrored job's data wait cell of the fidelity
benchmark (BENCHMARKS section 17) attributed less than removing the input
saved in every repeat. The variables of the model and the optimizer
(Keras keeps its dropout seeds among the model's) are snapshotted first
and put back after, so the run trains exactly as it would without the
calibration.

  reference = reference_step.calibrate(
      train_step, batch, model=model, optimizer=optimizer, num_steps=5)
"""

from typing import Callable, Optional, Union

import tensorflow as tf

from overlap_core.runtime import contention, offload_cost


def snapshot(model, optimizer) -> Callable[[], None]:
  """A copy of every variable of `model` and `optimizer`; returns the
  function that puts it back.

  The optimizer's variables must exist (`optimizer.build`, or a step),
  or the ones a later step creates would not be put back.
  """
  variables = list(model.variables) + list(optimizer.variables)
  saved = [tf.identity(v.value) for v in variables]

  def restore() -> None:
    # In cross-replica context an assign sets every replica's copy, so
    # replicas a step parted (a local step) are one again.
    for variable, value in zip(variables, saved):
      variable.value.assign(value)

  return restore


def make_step_without_offload(make_train_step: Callable, offloader):
  """A step function made anew by `make_train_step` and traced inside
  `Offloader.paused`, so its graph holds no offload: the step alone
  without offload, as `calibrate` times it and a run's blocks without
  offload (`--paired_removal=offload`) train it."""
  step = make_train_step()

  def step_without_offload(batch):
    # Only the first call traces; the context matters to that one.
    with offloader.paused():
      return step(batch)

  return step_without_offload


def calibrate(train_step, batch, *, model, optimizer, num_steps: int,
              offloader=None, make_train_step: Optional[Callable] = None
              ) -> Union[contention.ReferenceStep, offload_cost.OffloadCost]:
  """Times `train_step` on `batch`, a batch held resident.

  Args:
    offloader: the run's `offload.Offloader`, or None. With one, the step
      is timed with offload and without: a step function made anew by
      `make_train_step` and traced inside `Offloader.paused`.

  Returns:
    The reference step, or with offload the offload's cost.
  """
  restore = snapshot(model, optimizer)
  if offloader is None:
    return contention.time_reference(
        # Reading the loss waits for the step's end.
        lambda: float(train_step(batch)), num_steps=num_steps,
        restore=restore)
  step_without_offload = make_step_without_offload(make_train_step,
                                                   offloader)

  def run_without_offload() -> None:
    float(step_without_offload(batch))

  reference = offload_cost.time_with_and_without(
      lambda: float(train_step(batch)), run_without_offload,
      num_steps=num_steps, restore=restore)
  offloader.discard_records()
  return reference
