"""The step timed alone before training: TensorFlow's side of
`overlap_core.runtime.contention`.

The run's own step function is called on the run's first batch, held
resident, so no retrace and no input read; the variables of the model
and the optimizer (Keras keeps its dropout seeds among the model's) are
snapshotted first and put back after, so the run trains exactly as it
would without the calibration.

  reference, iterator = reference_step.calibrate(
      train_step, iterator, model=model, optimizer=optimizer, num_steps=5)
"""

import itertools
from typing import Callable, Iterator, Optional, Tuple, Union

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


def calibrate(train_step, iterator: Iterator, *, model, optimizer,
              num_steps: int, offloader=None,
              make_train_step: Optional[Callable] = None
              ) -> Tuple[Union[contention.ReferenceStep,
                               offload_cost.OffloadCost], Iterator]:
  """Times `train_step` on the iterator's first batch.

  Args:
    offloader: the run's `offload.Offloader`, or None. With one, the step
      is timed with offload and without: a step function made anew by
      `make_train_step` and traced inside `Offloader.paused`.

  Returns:
    (the reference step, or with offload the offload's cost; an iterator
    that yields that first batch again and then the rest), so the run
    trains on every batch it would have.
  """
  first = next(iterator)
  restore = snapshot(model, optimizer)
  if offloader is None:
    reference = contention.time_reference(
        # Reading the loss waits for the step's end.
        lambda: float(train_step(first)), num_steps=num_steps,
        restore=restore)
    return reference, itertools.chain([first], iterator)
  step_without_offload = make_train_step()

  def run_without_offload() -> None:
    # Only the first call traces; the context matters to that one.
    with offloader.paused():
      float(step_without_offload(first))

  reference = offload_cost.time_with_and_without(
      lambda: float(train_step(first)), run_without_offload,
      num_steps=num_steps, restore=restore)
  offloader.discard_records()
  return reference, itertools.chain([first], iterator)
