"""The user's --model in PyTorch: built, checked on the data, kept.

The twin of `tfoverlap.user_model`. `--model=package.module:callable` calls
the builder (with the settings its signature names,
`overlap_core.runtime.user_code`), which returns an `nn.Module` or
`(nn.Module, Task)`; a `.keras` file is TensorFlow's alone and refused
here. The module is built on the CPU, as the zoo's are, and called once on
the data's first two examples, so that a model that does not take the data
is refused in one line before training starts.

  model, spec = load_model(config, info, first_batch=batch)
"""

from typing import Tuple

import torch
from torch import nn

from overlap_core.runtime import user_code, zoo
from overlap_core.runtime.config import ConfigError, TrainConfig
from overlap_core.runtime.datasets import DatasetInfo
from torch_parity import steps

# Examples in the batch a user model is first called on.
PROBE_EXAMPLES = 2


def load_model(config: TrainConfig, info: DatasetInfo, *,
               first_batch) -> Tuple[nn.Module, zoo.ModelSpec]:
  """Builds --model on the CPU and checks it.

  Args:
    config: the run's configuration; `config.model.name` is the user's.
    info: the data set's description (its classes and channels are what the
      builder gets).
    first_batch: (spec) -> (inputs, targets), a small batch of the data.

  Returns:
    (model, spec): the module, in training mode, and its Task's spec.

  Raises:
    ConfigError: naming --model (or --dataset), in one line, for a builder
      that raises or returns something else than an nn.Module, a .keras
      file, a model that does not take the data, or a model torch.fx cannot
      trace under --pipeline_stages or --burst_parallel.
  """
  path = config.model.name
  if user_code.model_kind(path) == user_code.KERAS_FILE:
    raise ConfigError("model", path, "a .keras file is a Keras model; "
                      "allowed here: a zoo model or package.module:callable "
                      "returning an nn.Module (or use tfoverlap.train)")
  builder = user_code.load_callable("model", path)
  result = user_code.call_with_settings(
      "model", path, builder, _settings(config, info))
  model, task = user_code.split_model_result(path, result, nn.Module,
                                             "a torch.nn.Module")
  user_code.check_task_and_data(path, task, config.data.dataset)
  spec = task.spec()
  check_graph(model, config)
  inputs, targets = first_batch(spec)
  _probe(path, model, spec, inputs, targets)
  return model.train(), spec


def _settings(config: TrainConfig, info: DatasetInfo) -> dict:
  return {"image_size": info.image_size, "num_classes": info.num_classes,
          "channels": info.channels, "batch_size": config.data.batch_size,
          "seed": config.run.seed, "precision": config.model.precision}


def check_graph(model: nn.Module, config: TrainConfig) -> None:
  """Refuses a pipeline split or burst plan on a module torch.fx cannot
  trace: both read the traced graph.

  Raises:
    ConfigError: naming --pipeline_stages or --burst_parallel and the
      construct torch.fx stopped at.
  """
  if config.pipeline.stages == 1 and not config.burst.enabled:
    return
  try:
    torch.fx.symbolic_trace(model)
    return
  except Exception as e:  # pylint: disable=broad-except
    construct = (f"{type(model).__qualname__}: torch.fx cannot trace it "
                 f"({type(e).__name__}: {user_code.first_line(e)})")
  if config.pipeline.stages > 1:
    raise ConfigError("pipeline_stages", config.pipeline.stages,
                      f"--model={config.model.name} is {construct}; "
                      "allowed: 1, or a module torch.fx traces")
  raise ConfigError("burst_parallel", config.burst.plan_path,
                    f"--model={config.model.name} is {construct}; allowed: "
                    "empty, or a module torch.fx traces")


def _probe(path: str, model: nn.Module, spec, inputs, targets) -> None:
  """One forward pass and loss on the data's first examples, in eval mode
  (BatchNorm's running statistics stay as built)."""
  was_training = model.training
  model.eval()
  try:
    with torch.no_grad():
      try:
        outputs = model(inputs)
      except Exception as e:  # pylint: disable=broad-except
        raise user_code.probe_refusal(path, e, inputs=inputs) from None
      try:
        steps.per_example_loss(spec.task, targets, outputs)
      except Exception as e:  # pylint: disable=broad-except
        raise user_code.probe_refusal(
            path, e, inputs=inputs, outputs=outputs, targets=targets,
            task=spec.task) from None
  finally:
    model.train(was_training)




def first_batch_of(path: str, dataset):
  """The first PROBE_EXAMPLES examples of the user's (x, y) dataset.

  Raises:
    ConfigError: naming --dataset, when they do not batch.
  """
  examples = []
  for example in (dataset if isinstance(dataset, torch.utils.data.
                                        IterableDataset)
                  else (dataset[i] for i in range(min(len(dataset),
                                                      PROBE_EXAMPLES)))):
    examples.append(example)
    if len(examples) == PROBE_EXAMPLES:
      break
  try:
    inputs, targets = torch.utils.data.default_collate(examples)
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("dataset", path,
                      f"its first examples do not batch: {type(e).__name__}"
                      f": {user_code.first_line(e)}") from None
  return inputs, targets


def make_first_batch(config: TrainConfig, info: DatasetInfo):
  """(spec) -> the first examples `load_model` checks the model on: the
  user's --dataset's, or zeros shaped like the zoo's data."""

  def first_batch(spec):
    if user_code.is_import_path(config.data.dataset):
      from torch_parity.data import sources  # pylint: disable=g-import-not-at-top
      return first_batch_of(config.data.dataset,
                            sources.load_source(config.data).read("train")[0])
    return zoo_batch(spec, info)

  return first_batch


def zoo_batch(spec: zoo.ModelSpec, info: DatasetInfo):
  """Zeros shaped like PROBE_EXAMPLES examples of the zoo's data for a
  model of `spec`: what the loader will feed it."""
  side = info.image_size
  inputs = torch.zeros(PROBE_EXAMPLES, info.channels, side // spec.upscale,
                       side // spec.upscale)
  if spec.task == zoo.SUPER_RESOLUTION:
    return inputs, torch.zeros(PROBE_EXAMPLES, info.channels, side, side)
  return inputs, torch.zeros(PROBE_EXAMPLES, dtype=torch.long)


def load_for_planning(config: TrainConfig) -> Tuple[nn.Module, tuple]:
  """The user's --model as the trainer builds it, for the planning
  commands, with the shape of one example's inputs (the user's data's, or
  the zoo's images) that its graph is traced and timed at.

  Raises:
    ConfigError: what `load_model` refuses.
  """
  from torch_parity import data  # pylint: disable=g-import-not-at-top
  info = data.describe(config.data)
  first_batch, shapes = user_code.recording_input_shape(
      make_first_batch(config, info))

  torch.manual_seed(config.run.seed)
  model, _ = load_model(config, info, first_batch=first_batch)
  return model, shapes[0]
