"""The two training loops, both feeding the same step ledger.

`run_custom_loop` times each phase separately: the wait for the next batch,
the replicated step (forward, backward, all-reduce, update), the checkpoint.
`run_multi_step_loop` is the custom loop at --steps_per_execution=K: one
traced call runs K steps, reading the iterator itself, and is timed as one
span, with its steps' data waits timed inside the graph. `run_fit_loop`
drives Keras `model.fit`, whose compiled step pulls its own input, so there
the data wait is inside the compute span; it is timed by
`tfoverlap.ledger.FitStepTimer`, the timing of the public `LedgerCallback`.
"""

import time
from typing import Optional

import keras
import tensorflow as tf

from tfoverlap import steps
from tfoverlap.ledger import FitStepTimer
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.config import (CHECKPOINT_AUTO, ConfigError,
                                         TrainConfig)
from overlap_core.runtime.loop_context import (LoopContext, ScalarWindows,
                                               after_execution, after_step,
                                               compute_phase, settle_split)


def run_custom_loop(ctx: LoopContext, *, train_step, iterator,
                    split_compute=None) -> float:
  """Runs steps first_step..last_step; returns the last step's loss.

  Args:
    ctx: the loop's bookkeeping.
    train_step: batch -> loss.
    iterator: the batches.
    split_compute: (start_s, end_s) -> [(phase, start_s, end_s)] that
      partition a step's compute span (a pipelined step's stage compute,
      transfer and bubble); None: the span is the `compute` phase.
  """
  loss = float("nan")
  for step in range(ctx.first_step, ctx.last_step + 1):
    with ctx.ledger.phase(ledger_lib.DATA_WAIT):
      batch = next(iterator)
    with compute_phase(ctx.ledger, split_compute):
      # Reading the loss waits for the step to finish, so the span covers
      # the device work and not only its dispatch.
      loss = float(train_step(batch))
    after_step(ctx, step, loss)
  settle_split(ctx.ledger, split_compute)
  return loss


def check_steps_per_execution(config: TrainConfig) -> None:
  """K steps per traced call: nothing may need to happen between them.

  The custom loop cuts its calls so that they end at multiples of K
  (`execution_sizes`), so a fixed checkpoint cadence must be one; Keras'
  fit runs whole executions only. (PyTorch has no multi-step call at all:
  the compatibility table refuses K > 1 there.)

  Raises:
    ConfigError: naming --checkpoint_every or --train_steps.
  """
  k = config.run.steps_per_execution
  if k == 1:
    return
  every = config.checkpoint.every_steps
  if (config.checkpoint.mode != "none" and every != CHECKPOINT_AUTO
      and every % k):
    raise ConfigError("checkpoint_every", every,
                      f"must be a multiple of --steps_per_execution={k}: "
                      "checkpoints are taken between traced calls")
  if config.run.loop == "fit" and config.run.train_steps % k:
    raise ConfigError("train_steps", config.run.train_steps,
                      "model.fit runs whole executions; must be a multiple "
                      f"of --steps_per_execution={k}")


def execution_sizes(first_step: int, last_step: int, steps_per_execution: int):
  """(first step, steps) of each call: calls end at multiples of K (or at
  the last step), also after a resume from any step, so that a fixed
  checkpoint cadence that is a multiple of K always lands on a call's end."""
  step = first_step
  while step <= last_step:
    size = min(steps_per_execution - (step - 1) % steps_per_execution,
               last_step - step + 1)
    yield step, size
    step += size


def run_multi_step_loop(ctx: LoopContext, *, train_steps, iterator,
                        steps_per_execution: int,
                        take_offload_copy_s=None,
                        exposed_comm_s: Optional[float] = None) -> float:
  """Runs steps first_step..last_step, K per traced call; the last loss.

  Args:
    ctx: the loop's bookkeeping.
    train_steps: `steps.make_multi_step_train_step`'s function.
    iterator: the batches; read inside `train_steps`.
    steps_per_execution: K.
    take_offload_copy_s: () -> seconds of offload copies since the last
      call (`Offloader.take_copy_s`), divided among the call's steps as
      its span is and carved out of each one's compute; None: no offload
      phase.
    exposed_comm_s: each step's exposed all-reduce, derived before
      training (`tfoverlap.exposed_comm`), carved out of each step's
      compute; None: not derived. Never given with `take_offload_copy_s`.
  """
  loss = float("nan")
  for first, size in execution_sizes(ctx.first_step, ctx.last_step,
                                     steps_per_execution):
    start_s = time.perf_counter()
    losses, waits = train_steps(iterator, tf.constant(size))
    # Reading the losses waits for the call's last step to finish.
    losses = losses.numpy()
    end_s = time.perf_counter()
    split_compute = None
    if take_offload_copy_s is not None:
      copy_s = take_offload_copy_s() / size
      split_compute = lambda begin, end, copy_s=copy_s: (
          ledger_lib.carve_compute(begin, end, ledger_lib.OFFLOAD,
                                   copy_s))
    elif exposed_comm_s is not None:
      split_compute = lambda begin, end: ledger_lib.carve_compute(
          begin, end, ledger_lib.EXPOSED_COMM, exposed_comm_s)
    after_execution(ctx, first, losses, start_s, end_s,
                    data_wait_s=(None if waits is None
                                 else float(waits.numpy().sum())),
                    split_compute=split_compute)
    loss = float(losses[-1])
  return loss


def run_fit_loop(ctx: LoopContext, *, model, optimizer, loss_fn,
                 distributed_data, steps_per_execution: int = 1) -> float:
  """Trains with `model.fit` for the same steps; returns the last loss."""
  model.compile(optimizer=optimizer, loss=loss_fn, jit_compile=False,
                steps_per_execution=steps_per_execution)
  callback = FitStepTimer(ctx)
  model.fit(distributed_data, epochs=1,
            steps_per_epoch=ctx.last_step - ctx.first_step + 1, verbose=0,
            callbacks=[callback])
  return callback.last_loss


def fit_loss(task: str):
  """The Keras loss `model.fit` compiles with, matching the custom loop's."""
  if task == steps.SUPER_RESOLUTION:
    return keras.losses.MeanAbsoluteError()
  if task == steps.REGRESSION:
    return keras.losses.MeanSquaredError()
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_scalar_writer(logdir: Optional[str], every_steps: int,
                       ledger: ledger_lib.StepLedger):
  """TensorBoard scalars every `every_steps` steps: loss, throughput, shares.

  Returns a `write(step, loss)` callable with a `close()` attribute; a
  no-op when `logdir` is None.
  """
  if logdir is None:
    write = lambda step, loss: None
    write.close = lambda: None
    return write
  writer = tf.summary.create_file_writer(logdir)
  windows = ScalarWindows(ledger, every_steps)

  def write(step: int, loss: float) -> None:
    scalars = windows.due(step)
    if scalars is None:
      return
    with writer.as_default(step=step):
      tf.summary.scalar("loss", loss)
      for name, value in scalars.items():
        tf.summary.scalar(f"steps/{name}", value)
    writer.flush()

  write.close = writer.close
  return write
