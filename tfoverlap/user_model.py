"""The user's --model in TensorFlow: built, checked on the data, kept.

`--model=package.module:callable` calls the builder (with the settings its
signature names, `overlap_core.runtime.user_code`), which returns a
`keras.Model` or `(keras.Model, Task)`; `--model=path.keras` loads a saved
model with `keras.saving.load_model` (a classifier). Either is built under
the run's strategy scope, so its variables are replicated as the zoo's are,
and called once on the data's first two examples, so that a model that
does not take the data is refused in one line before training starts.

  model, spec = load_model(config, info, strategy=strategy,
                           first_batch=batch)
"""

from typing import Tuple

import keras
from keras.src.models import functional
import tensorflow as tf

from overlap_core.runtime import user_code, zoo
from overlap_core.runtime.config import ConfigError, TrainConfig
from overlap_core.runtime.datasets import DatasetInfo
from tfoverlap import steps

# Examples in the batch a user model is first called on.
PROBE_EXAMPLES = 2


def load_model(config: TrainConfig, info: DatasetInfo, *, strategy,
               first_batch) -> Tuple[keras.Model, zoo.ModelSpec]:
  """Builds or loads --model under `strategy`'s scope and checks it.

  Args:
    config: the run's configuration; `config.model.name` is the user's.
    info: the data set's description (its classes and channels are what the
      builder gets).
    strategy: the run's strategy (the default one for a pipelined or burst
      run).
    first_batch: () -> (inputs, targets), a small batch of the run's data.

  Returns:
    (model, spec): the model, variables created, and its Task's spec.

  Raises:
    ConfigError: naming --model (or --dataset), in one line, for a builder
      that raises or returns something else than a Keras model, a file
      that does not load, a model that does not take the data, or a model
      with no functional graph under --pipeline_stages or --burst_parallel.
  """
  path = config.model.name
  steps.apply_precision_policy(config.model.precision)
  with strategy.scope():
    model, task = _build(config, info)
  user_code.check_task_and_data(path, task, config.data.dataset)
  spec = task.spec()
  check_graph(model, config)
  inputs, targets = first_batch(spec)
  with strategy.scope():  # a subclassed model's variables are made here
    _probe(path, model, spec, inputs, targets)
  return model, spec


def _build(config: TrainConfig, info: DatasetInfo):
  path = config.model.name
  if user_code.model_kind(path) == user_code.KERAS_FILE:
    try:
      model = keras.saving.load_model(path)
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError("model", path,
                        f"does not load with keras.saving.load_model: "
                        f"{type(e).__name__}: {user_code.first_line(e)}") from None
    return user_code.split_model_result(path, model, keras.Model,
                                        "a keras.Model")
  builder = user_code.load_callable("model", path)
  result = user_code.call_with_settings(
      "model", path, builder, _settings(config, info))
  return user_code.split_model_result(path, result, keras.Model,
                                      "a keras.Model")


def _settings(config: TrainConfig, info: DatasetInfo) -> dict:
  return {"image_size": info.image_size, "num_classes": info.num_classes,
          "channels": info.channels, "batch_size": config.data.batch_size,
          "seed": config.run.seed, "precision": config.model.precision}


def check_graph(model: keras.Model, config: TrainConfig) -> None:
  """Refuses a pipeline split or burst plan on a model with no functional
  graph (a subclassed `keras.Model`): both read the layer graph.

  Raises:
    ConfigError: naming --pipeline_stages or --burst_parallel.
  """
  # Sequential derives from Model, not Functional, in Keras 3.
  if isinstance(model, (keras.Sequential, functional.Functional)):
    return
  construct = (f"{type(model).__module__}.{type(model).__qualname__}, a "
               "subclassed keras.Model whose call() has no functional graph")
  if config.pipeline.stages > 1:
    raise ConfigError("pipeline_stages", config.pipeline.stages,
                      f"--model={config.model.name} is {construct} to cut "
                      "into stages; allowed: 1, or a functional or "
                      "Sequential model")
  if config.burst.enabled:
    raise ConfigError("burst_parallel", config.burst.plan_path,
                      f"--model={config.model.name} is {construct} to "
                      "plan per layer; allowed: empty, or a functional or "
                      "Sequential model")


def _probe(path: str, model, spec, inputs, targets) -> None:
  """One forward pass and loss on the data's first examples."""
  try:
    outputs = model(inputs, training=False)
  except Exception as e:  # pylint: disable=broad-except
    raise user_code.probe_refusal(path, e, inputs=inputs) from None
  try:
    steps.per_example_loss(spec.task, targets, outputs)
  except Exception as e:  # pylint: disable=broad-except
    raise user_code.probe_refusal(path, e, inputs=inputs, outputs=outputs,
                                  targets=targets, task=spec.task) from None


def first_batch_of(path: str, dataset: tf.data.Dataset):
  """The first PROBE_EXAMPLES examples of the user's unbatched (x, y)
  dataset.

  Raises:
    ConfigError: naming --dataset, when they do not batch.
  """
  try:
    return next(iter(
        dataset.take(PROBE_EXAMPLES).batch(PROBE_EXAMPLES)))
  except (tf.errors.OpError, StopIteration) as e:
    raise ConfigError("dataset", path,
                      f"its first examples do not batch: {type(e).__name__}"
                      f": {user_code.first_line(e)}") from None


def make_first_batch(config: TrainConfig, info: DatasetInfo):
  """(spec) -> the first examples `load_model` checks the model on: the
  user's --dataset's, or zeros shaped like the zoo's data."""

  def first_batch(spec):
    if user_code.is_import_path(config.data.dataset):
      # pylint: disable=g-import-not-at-top
      from tfoverlap.data import sources
      return first_batch_of(config.data.dataset,
                            sources.load_source(config.data).read("train"))
    return zoo_batch(spec, info)

  return first_batch


def zoo_batch(spec: zoo.ModelSpec, info: DatasetInfo):
  """Zeros shaped like PROBE_EXAMPLES examples of the zoo's data for a
  model of `spec`: what the pipeline will feed it."""
  side = info.image_size
  inputs = tf.zeros((PROBE_EXAMPLES, side // spec.upscale,
                     side // spec.upscale, info.channels))
  if spec.task == zoo.SUPER_RESOLUTION:
    return inputs, tf.zeros((PROBE_EXAMPLES, side, side, info.channels))
  return inputs, tf.zeros((PROBE_EXAMPLES,), tf.int32)


def load_for_planning(config: TrainConfig) -> Tuple[keras.Model, tuple]:
  """The user's --model as the trainer builds it, for the planning
  commands, with the shape of one example's inputs (the user's data's, or
  the zoo's images) that it is checked at.

  Raises:
    ConfigError: what `load_model` refuses.
  """
  from tfoverlap import data  # pylint: disable=g-import-not-at-top
  info = data.describe(config.data)
  first_batch, shapes = user_code.recording_input_shape(
      make_first_batch(config, info))

  model, _ = load_model(config, info, strategy=tf.distribute.get_strategy(),
                        first_batch=first_batch)
  return model, shapes[0]
