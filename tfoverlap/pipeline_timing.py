"""Timing a GPipe step's parts when the whole step is one traced function.

Inside one `tf.function` the host cannot see when each stage runs, so the
parts are timed alone, before training: each stage's forward + backward of
one micro-batch, traced on its device, each cut's activation copy to the
next stage's device and gradient copy back, and the optimizer's update of
each stage's variables (medians of repeats). The bubble is then what is
left of a step (see `MEASUREMENT_SOURCES`, which run.json repeats so that
nobody mistakes a derived figure for a measured one).

The update is timed apart so that the bubble is measured as PyTorch's is:
there, `optimizer.step()` is timed on the host inside stage_compute; here
the step applies every stage's gradients after the pipeline drains, and
without its own timing the update would fall into the derived bubble.

  stage_s, transfer_s = time_stages(runtime, inputs, targets, loss_fn)
  update_s = time_updates(runtime, optimizer)
"""

import statistics
import time
from typing import Callable, List, Tuple

import tensorflow as tf

from overlap_core.runtime import pipeline_stats

MEASUREMENT_SOURCES = {
    pipeline_stats.STAGE_COMPUTE:
        "measured: the stage's forward + backward of one micro-batch, "
        "traced and timed alone on its device (median of repeats), times M, "
        "plus the stage's update (as PyTorch counts optimizer.step() in "
        "stage_compute)",
    pipeline_stats.UPDATE:
        "measured: the optimizer's update of the stage's variables, traced "
        "and timed alone on random gradients (median of repeats; weights "
        "and optimizer state put back after)",
    pipeline_stats.TRANSFER:
        "measured: the copy of one micro-batch's crossing activation to the "
        "next stage's device and of its gradient back, timed alone, times M",
    pipeline_stats.BUBBLE:
        "derived: the step's compute span minus the stage's own compute "
        "(update included) and transfer (the stages run inside one "
        "tf.function, so the host cannot time a stage's waits)",
}
# For a runtime given no optimizer to time: its step's update is in no
# measured part, so the derived bubble holds it.
SOURCES_WITHOUT_UPDATE = {
    pipeline_stats.STAGE_COMPUTE:
        "measured: the stage's forward + backward of one micro-batch, "
        "traced and timed alone on its device (median of repeats), times M; "
        "the optimizer's update not timed",
    pipeline_stats.TRANSFER: MEASUREMENT_SOURCES[pipeline_stats.TRANSFER],
    pipeline_stats.BUBBLE:
        "derived: the step's compute span minus the stage's own compute "
        "and transfer, so it holds the optimizer's update too (the stages "
        "run inside one tf.function, so the host cannot time a stage's "
        "waits)",
}


def time_stages(runtime, example_inputs, example_targets, loss_fn: Callable,
                *, repeats: int = 3) -> Tuple[List[float], List[float]]:
  """Per stage, seconds of one micro-batch: (compute, transfer).

  A stage's transfer is its activation sent forward plus its input's
  gradient sent back. The model's non-trainable variables (BatchNorm
  statistics, seed states) are put back afterwards: timing does not change
  what training computes.

  Args:
    runtime: a `tfoverlap.pipeline.PipelineRuntime`.
    example_inputs, example_targets: one batch (values do not matter).
    loss_fn: the last stage's loss, as the step uses it.
    repeats: timed runs per part, after one untimed (the trace).
  """
  model, stages, devices = runtime.model, runtime.stages, runtime.devices
  saved = [v.numpy() for v in model.non_trainable_variables]
  try:
    micro_x = tf.split(example_inputs, runtime.num_microbatches)[0]
    micro_y = tf.split(example_targets, runtime.num_microbatches)[0]
    inputs = [micro_x]
    for k, stage in enumerate(stages[:-1]):
      with tf.device(devices[k]):
        inputs.append(tf.identity(stage(inputs[-1], training=False)))
    last = len(stages) - 1
    compute_s = [_median_s(_stage_probe(stages[k], devices[k], inputs[k],
                                        micro_y, loss_fn, k == last), repeats)
                 for k in range(len(stages))]
    transfer_s = [0.0] * len(stages)
    for k in range(last):
      transfer_s[k] += _median_s(
          _copy_probe(inputs[k + 1], devices[k], devices[k + 1]), repeats)
      transfer_s[k + 1] += _median_s(
          _copy_probe(inputs[k + 1], devices[k + 1], devices[k]), repeats)
  finally:
    for variable, value in zip(model.non_trainable_variables, saved):
      variable.assign(value)
  return compute_s, transfer_s


def time_updates(runtime, optimizer, *, repeats: int = 3) -> List[float]:
  """Per stage, seconds of the optimizer's update of its variables.

  The gradients are random, not zero: an update's time depends on their
  values (the PyTorch profiler saw one thread's Adam step take 1.8 times
  as long on all-zero gradients). The model's variables and the
  optimizer's (its step count, slots) are put back afterwards, so timing
  does not change what training computes.

  Args:
    runtime: a `tfoverlap.pipeline.PipelineRuntime`.
    optimizer: the step's optimizer; built on the model's trainable
      variables here if it is not yet (as the trainer builds it).
    repeats: timed runs per stage, after one untimed (the trace).
  """
  model = runtime.model
  if not optimizer.built:
    optimizer.build(model.trainable_variables)
  variables = list(model.variables) + list(optimizer.variables)
  saved = [v.numpy() for v in variables]
  try:
    return [_median_s(_update_probe(optimizer, stage.trainable_variables),
                      repeats) for stage in runtime.stages]
  finally:
    for variable, value in zip(variables, saved):
      variable.assign(value)


def _update_probe(optimizer, variables):
  gradients = [tf.random.stateless_normal(v.shape, seed=[0, i],
                                          dtype=v.dtype)
               for i, v in enumerate(variables)]

  @tf.function
  def probe():
    optimizer.apply_gradients(zip(gradients, variables))
    # One element of each updated variable: reading them waits for every
    # update and no more.
    return tf.add_n([tf.cast(tf.reshape(v, [-1])[0], tf.float32)
                     for v in variables])

  return probe


def _stage_probe(stage, device: str, stage_input, targets, loss_fn,
                 last: bool):
  with tf.device(device):
    stage_input = tf.identity(stage_input)

  @tf.function
  def probe():
    with tf.device(device):
      with tf.GradientTape() as tape:
        tape.watch(stage_input)
        out = stage(stage_input, training=True)
        if last:
          out = loss_fn(targets, out)
      upstream = None if last else tf.ones_like(out)
      grads = tape.gradient(out, stage.trainable_variables + [stage_input],
                            output_gradients=upstream)
      # A scalar of everything computed: reading it waits for the device.
      return tf.add_n([tf.reduce_sum(g) for g in grads if g is not None])

  return probe


def _copy_probe(value, source: str, destination: str):
  with tf.device(source):
    value = tf.identity(value)

  @tf.function
  def probe():
    with tf.device(destination):
      copied = tf.identity(value)
      # A one-element read makes the host wait for the copy and no more.
      return tf.reshape(copied, [-1])[0]

  return probe


def _median_s(fn, repeats: int) -> float:
  """Median seconds of fn() after one untimed call (the trace)."""
  fn().numpy()
  times = []
  for _ in range(repeats):
    begin = time.perf_counter()
    fn().numpy()
    times.append(time.perf_counter() - begin)
  return statistics.median(times)
