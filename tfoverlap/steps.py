"""The replicated training and evaluation steps of the custom training loop.

The gradient all-reduce happens inside `optimizer.apply_gradients` (Keras 3
sums gradients across replicas there), so the compute span the ledger times
around `train_step` includes communication. The part of it the step waited
for is derived from the same step without the all-reduce
(`make_local_train_step`, `tfoverlap.exposed_comm`) and recorded apart from
compute as `exposed_comm`, as PyTorch times its own.
"""

import math

import keras
import tensorflow as tf

from overlap_core.runtime.config import ModelConfig
from overlap_core.runtime.evaluation import evaluation_result
from overlap_core.runtime.user_code import REGRESSION
from overlap_core.runtime.zoo import CLASSIFICATION, SUPER_RESOLUTION


def apply_precision_policy(precision: str) -> None:
  """Sets Keras' global dtype policy; call before building the model."""
  keras.mixed_precision.set_global_policy(precision)


def build_optimizer(cfg: ModelConfig) -> keras.optimizers.Optimizer:
  if cfg.optimizer == "sgd":
    optimizer = keras.optimizers.SGD(cfg.learning_rate)
  elif cfg.optimizer == "momentum":
    optimizer = keras.optimizers.SGD(cfg.learning_rate, momentum=0.9)
  else:
    optimizer = keras.optimizers.Adam(cfg.learning_rate)
  if cfg.precision == "mixed_float16":
    # float16 gradients underflow without scaling; bfloat16 has float32's
    # exponent range and needs none.
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


def per_example_loss(task: str, targets, outputs):
  """Cross-entropy on logits, EDSR's L1 loss, or a regression's squared
  error, one value per example."""
  outputs = tf.cast(outputs, tf.float32)
  if task == SUPER_RESOLUTION:
    return tf.reduce_mean(tf.abs(targets - outputs), axis=[1, 2, 3])
  if task == REGRESSION:
    return tf.reduce_mean(tf.square(_flat_errors(targets, outputs)), axis=1)
  return keras.losses.sparse_categorical_crossentropy(targets, outputs,
                                                      from_logits=True)


def _flat_errors(targets, outputs):
  """targets - outputs, one row per example ([B, -1])."""
  errors = tf.reshape(tf.cast(targets, tf.float32), tf.shape(outputs)) - outputs
  return tf.reshape(errors, [tf.shape(errors)[0], -1])


def make_pipeline_loss(task: str, global_batch_size: int):
  """A pipelined micro-batch's loss: its examples' sum over the global
  batch, so the micro-batches' losses (and gradients) add up to the
  batch mean the unpipelined step computes. (PyTorch's takes the mean and
  its runtime divides by the micro-batches, so it needs no batch size.)"""

  def loss_fn(targets, outputs):
    return tf.reduce_sum(per_example_loss(task, targets, outputs)) / float(
        global_batch_size)

  return loss_fn


def example_batch(model, task: str, batch_size: int):
  """Zeros shaped like one training batch of `model` (inputs, targets), for
  timing: what a step costs does not depend on the values."""
  inputs = tf.zeros((batch_size,) + tuple(model.inputs[0].shape[1:]))
  if task == SUPER_RESOLUTION:
    targets = tf.zeros((batch_size,) + tuple(model.outputs[0].shape[1:]))
  else:
    targets = tf.zeros((batch_size,), tf.int32)
  return inputs, targets


def _make_replica_step(model, optimizer, *, task: str,
                       global_batch_size: int):
  """One replica's optimizer step: (inputs, targets) -> its loss share."""
  scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

  def replica_step(inputs, targets):
    with tf.GradientTape() as tape:
      outputs = model(inputs, training=True)
      loss = tf.nn.compute_average_loss(
          per_example_loss(task, targets, outputs),
          global_batch_size=global_batch_size)
      scaled = optimizer.scale_loss(loss) if scales_loss else loss
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return replica_step


def make_train_step(model, optimizer, strategy, *, task: str,
                    global_batch_size: int):
  """A tf.function running one optimizer step on a distributed batch.

  Args:
    model: the Keras model, its variables created under `strategy`.
    optimizer: its optimizer, built under `strategy`.
    strategy: the run's tf.distribute strategy.
    task: CLASSIFICATION or SUPER_RESOLUTION.
    global_batch_size: the batch over every replica; each replica's loss
      sums its examples over it (where PyTorch takes --precision: Keras
      reads it from the global policy, `apply_precision_policy`).

  Returns:
    train_step(distributed_batch) -> the global mean loss (a scalar tensor).
  """
  replica_step = _make_replica_step(model, optimizer, task=task,
                                    global_batch_size=global_batch_size)

  @tf.function
  def train_step(batch):
    per_replica_loss = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss,
                           axis=None)

  return train_step


def _keep_local(grads_and_vars):
  return list(grads_and_vars)


def make_local_train_step(model, optimizer, strategy, *, task: str,
                          global_batch_size: int):
  """`make_train_step`'s step without the gradient all-reduce: each
  replica applies its own gradients, so the replicas' variables part.

  For measuring only: `tfoverlap.exposed_comm` times it before training,
  and the blocks without the all-reduce of --paired_removal=all_reduce
  train it, a diagnostic run whose replicas part. The step does the same
  forward, backward and update, so what it saves against `make_train_step`
  is the all-reduce the step waited for. PyTorch's equivalent is a DDP
  step under `no_sync` (`torch_parity.steps.make_local_train_step`, which
  wraps the run's own step).

  Keras all-reduces in the optimizer's `_all_reduce_sum_gradients`, just
  before its merge into the cross-replica update, which then applies each
  replica's gradient to that replica's copy. The step swaps that method
  for one that keeps the gradients local while the step is traced, around
  `strategy.run` rather than inside it: the replicas trace on threads of
  their own and meet at the merge.

  Returns:
    train_step(distributed_batch) -> the replicas' summed loss shares.
  """
  replica_step = _make_replica_step(model, optimizer, task=task,
                                    global_batch_size=global_batch_size)
  # A loss-scaling optimizer applies through the optimizer it wraps.
  applies = getattr(optimizer, "inner_optimizer", optimizer)

  @tf.function
  def train_step(batch):
    applies._all_reduce_sum_gradients = _keep_local
    try:
      per_replica_loss = strategy.run(replica_step, args=batch)
    finally:
      del applies._all_reduce_sum_gradients
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss,
                           axis=None)

  return train_step


def _next_timed(iterator, step):
  """The next batch, and the seconds from when loop iteration `step` may
  begin (its index is ready) to when the batch is in hand."""
  with tf.control_dependencies([step]):
    asked = tf.timestamp()
  batch = next(iterator)
  with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
    return batch, tf.timestamp() - asked


def make_multi_step_train_step(model, optimizer, strategy, *, task: str,
                               global_batch_size: int, time_waits: bool):
  """A tf.function running several optimizer steps per call, as Keras'
  `steps_per_execution` does: the iterator is read inside the traced loop,
  so the steps of one call cost one Python round trip.

  Each step's wait for its batch is timed inside the graph, as the custom
  loop times it outside: from the moment the step may begin to the moment
  its batch is in hand. A loop iteration begins only once every stateful op
  of the one before (the variable updates included) has run, because the
  loop's carried values wait on them (tf.function's automatic control
  dependencies); `tf.timestamp`s are ordered among themselves in program
  order. Op determinism (--deterministic) refuses to run `tf.timestamp`,
  so there `time_waits` must be False and nothing is timed.

  Returns:
    train_steps(iterator, num_steps) -> (the global mean loss of each step,
    each step's data wait in seconds or None), two vectors. `num_steps` is
    a scalar tensor, so a shorter last call reuses the same trace.
  """
  replica_step = _make_replica_step(model, optimizer, task=task,
                                    global_batch_size=global_batch_size)

  @tf.function
  def train_steps(iterator, num_steps):
    losses = tf.TensorArray(tf.float32, size=num_steps)
    waits = tf.TensorArray(tf.float64, size=num_steps)
    for i in tf.range(num_steps):
      if time_waits:
        batch, wait = _next_timed(iterator, i)
        waits = waits.write(i, wait)
      else:
        batch = next(iterator)
      per_replica_loss = strategy.run(replica_step, args=batch)
      losses = losses.write(i, strategy.reduce(
          tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None))
    return losses.stack(), waits.stack() if time_waits else None

  return train_steps


def _replica_eval_sums(model, task, inputs, targets):
  outputs = model(inputs, training=False)
  losses = per_example_loss(task, targets, outputs)
  count = tf.cast(tf.shape(losses)[0], tf.float32)
  if task == SUPER_RESOLUTION:
    squared = tf.reduce_mean(
        tf.square(targets - tf.cast(outputs, tf.float32)), axis=[1, 2, 3])
    # PSNR of images in [0, 1]; the epsilon keeps a perfect match finite.
    quality = tf.reduce_sum(-10.0 * tf.math.log(squared + 1e-10) /
                            math.log(10.0))
  elif task == REGRESSION:
    quality = tf.reduce_sum(tf.reduce_mean(
        tf.abs(_flat_errors(targets, tf.cast(outputs, tf.float32))), axis=1))
  else:
    predictions = tf.argmax(outputs, axis=-1, output_type=tf.int32)
    quality = tf.reduce_sum(
        tf.cast(tf.equal(predictions, tf.cast(targets, tf.int32)),
                tf.float32))
  return tf.reduce_sum(losses), quality, count


def evaluate(model, batches, strategy, *, task: str) -> dict:
  """One pass over the eval data.

  Args:
    model: the Keras model.
    batches: the eval data, distributed by `strategy`.
    strategy: the run's tf.distribute strategy.
    task: CLASSIFICATION or SUPER_RESOLUTION.

  Returns:
    {"eval_loss", "eval_accuracy"} for classification, {"eval_loss",
    "eval_psnr_db"} for super-resolution, and "eval_examples"; {} when no
    replica saw an example.
  """

  @tf.function
  def eval_step(batch):
    sums = strategy.run(lambda x, y: _replica_eval_sums(model, task, x, y),
                        args=batch)
    return [strategy.reduce(tf.distribute.ReduceOp.SUM, s, axis=None)
            for s in sums]

  loss_sum = quality_sum = count = 0.0
  for batch in batches:
    batch_loss, batch_quality, batch_count = eval_step(batch)
    loss_sum += float(batch_loss)
    quality_sum += float(batch_quality)
    count += float(batch_count)
  return evaluation_result(task, loss_sum=loss_sum, quality_sum=quality_sum,
                           count=count)


def make_burst_train_step(burst, model, optimizer, *, task: str,
                          global_batch_size: int):
  """A tf.function running one optimizer step of a burst plan.

  Args:
    burst: `tfoverlap.burst.make_burst_forward`'s function: every layer
      on its planned devices, in one replica.
    model: the Keras model whose variables `burst` reads (PyTorch's
      BurstModel holds its module, and takes the strategy here instead:
      a TensorFlow burst runs under the default strategy).
    optimizer: its optimizer.

  Returns:
    train_step((inputs, targets)) -> the global mean loss.
  """

  @tf.function
  def train_step(batch):
    inputs, targets = batch
    with tf.GradientTape() as tape:
      outputs = burst(inputs, training=True)
      loss = tf.nn.compute_average_loss(
          per_example_loss(task, targets, outputs),
          global_batch_size=global_batch_size)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return train_step
