"""The user's own model and data, named on the command line, framework-free.

`--model` and `--dataset` take, besides the zoo's names, an import path
`package.module:callable` (importable from the working directory or
PYTHONPATH); `--model` also takes a saved Keras `.keras` file (TensorFlow
only). This module parses those values, imports the callable, calls it with
the run's settings its signature names, and turns whatever goes wrong into
one `ConfigError` naming the flag, so both trainers refuse bad input with
the same line. Each framework side checks only what its framework knows:
the type of the model or dataset returned, and the first batch.

A model builder returns the model, or `(model, Task)` when its output is
not a classifier's logits:

  # mypkg/nets.py
  from overlap_core.runtime.user_code import Task

  def build(image_size, channels, num_classes):  # any of SETTINGS, or none
    model = ...                                  # keras.Model / nn.Module
    return model, Task.regression()              # or just `model`

  python -m tfoverlap.train --model=mypkg.nets:build \\
      --dataset=mypkg.data:load

A dataset callable takes the split ("train" or "eval") first, then any of
SETTINGS by keyword, and returns the framework's unbatched dataset of
`(inputs, target)` pairs (a `tf.data.Dataset`; a map-style or iterable torch
`Dataset`), or None for a split it does not have. The trainer batches,
shards, shuffles and prefetches it.

Nothing here imports TensorFlow or PyTorch.
"""

import dataclasses
import hashlib
import importlib
import inspect
import os
import re
import sys
from typing import Any, Callable, Mapping, Optional, Tuple

from overlap_core.runtime import zoo
from overlap_core.runtime.config import ConfigError

# The run's settings a builder or dataset callable may ask for by keyword.
SETTINGS = ("image_size", "num_classes", "channels", "batch_size", "seed",
            "precision")

ZOO, IMPORT, KERAS_FILE = "zoo", "import", "keras_file"
# A model handed to a user-loop ledger as an object: its class is its source.
USER_LOOP = "user_loop"
KERAS_SUFFIX = ".keras"
REGRESSION = "regression"
TASK_KINDS = (zoo.CLASSIFICATION, REGRESSION, zoo.SUPER_RESOLUTION)

_IMPORT_PATH = re.compile(
    r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclasses.dataclass(frozen=True)
class Task:
  """What a user model's output is, hence its loss and evaluation metric.

  classification: logits [B, classes], integer labels; cross-entropy,
    accuracy. The default when a builder returns the model alone.
  regression: outputs shaped like the targets; mean squared error, and the
    evaluation reports it as its metric too.
  super_resolution: images `upscale` times the inputs' side; L1 loss, PSNR
    (with the zoo's data, the trainer makes the low-resolution inputs).

  Usage:
    return model, Task.regression()
  """
  kind: str = zoo.CLASSIFICATION
  upscale: int = 1

  def __post_init__(self):
    if self.kind not in TASK_KINDS:
      raise ValueError(f"kind={self.kind!r}: allowed: "
                       f"{', '.join(TASK_KINDS)}")
    if not isinstance(self.upscale, int) or self.upscale < 1:
      raise ValueError(f"upscale={self.upscale!r}: allowed: an integer >= 1")

  @classmethod
  def classification(cls) -> "Task":
    return cls(zoo.CLASSIFICATION)

  @classmethod
  def regression(cls) -> "Task":
    return cls(REGRESSION)

  @classmethod
  def super_resolution(cls, upscale: int = 2) -> "Task":
    return cls(zoo.SUPER_RESOLUTION, upscale)

  def spec(self) -> zoo.ModelSpec:
    """The `zoo.ModelSpec` the trainers' steps and pipelines read."""
    return zoo.ModelSpec(self.kind, min_image_size=1, upscale=self.upscale)


@dataclasses.dataclass(frozen=True)
class Origin:
  """Where a model or data set came from, as run.json records it."""
  kind: str  # ZOO, IMPORT, KERAS_FILE or USER_LOOP
  value: str  # the zoo name, the import path or the file's path
  sha256: str = ""  # of a .keras file

  def describe(self) -> dict:
    described = {"source": self.kind, "value": self.value}
    if self.sha256:
      described["sha256"] = self.sha256
    return described


def object_origin(model) -> Origin:
  """Where a model handed over as an object came from: its class."""
  cls = type(model)
  return Origin(USER_LOOP, f"{cls.__module__}:{cls.__qualname__}")


def model_kind(value: str) -> str:
  """ZOO, IMPORT or KERAS_FILE for a --model value.

  Raises:
    ConfigError: naming --model, for a value of none of the three forms.
  """
  if value in zoo.MODELS:
    return ZOO
  if _IMPORT_PATH.match(value):
    return IMPORT
  if value.endswith(KERAS_SUFFIX):
    if not os.path.isfile(value):
      raise ConfigError("model", value, "no such .keras file")
    return KERAS_FILE
  raise ConfigError("model", value,
                    f"allowed: a zoo model ({', '.join(zoo.MODEL_NAMES)}), "
                    "package.module:callable, or a saved .keras file")


def is_import_path(value: str) -> bool:
  return bool(_IMPORT_PATH.match(value))


def model_spec(value: str) -> Optional[zoo.ModelSpec]:
  """The zoo's spec of a zoo model; None for the user's own (its builder's
  Task decides, once built)."""
  return zoo.MODELS.get(value)


def load_callable(flag: str, path: str) -> Callable:
  """Imports `package.module:callable` from the working directory or
  PYTHONPATH.

  Raises:
    ConfigError: naming `flag`, when the module does not import (its
      ImportError's first line), has no such attribute, or it is not
      callable.
  """
  module_name, _, attr_path = path.partition(":")
  if "" not in sys.path and os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())  # as `python -m` would
  try:
    target = importlib.import_module(module_name)
  except ImportError as e:
    raise ConfigError(flag, path, f"module {module_name!r} does not import: "
                      f"{type(e).__name__}: {first_line(e)}") from None
  except Exception as e:  # pylint: disable=broad-except
    # The user's module raised while importing: its error, on one line.
    raise ConfigError(flag, path, f"module {module_name!r} raised on import: "
                      f"{type(e).__name__}: {first_line(e)}") from None
  for name in attr_path.split("."):
    if not hasattr(target, name):
      raise ConfigError(flag, path, f"module {module_name!r} has no "
                        f"attribute {attr_path!r}")
    target = getattr(target, name)
  if not callable(target):
    raise ConfigError(flag, path, f"{attr_path!r} is a "
                      f"{type(target).__name__}, not a callable")
  return target


def call_with_settings(flag: str, path: str, fn: Callable,
                       settings: Mapping[str, Any], *args) -> Any:
  """Calls `fn(*args, **the settings its signature names)`.

  Only names of SETTINGS are passed, and only those `fn` declares (all of
  them if it takes **kwargs).

  Raises:
    ConfigError: naming `flag`, with the exception's type and first line,
      when `fn` raises.
  """
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    params = {}
  takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
  kwargs = {name: settings[name] for name in SETTINGS
            if name in settings and (takes_any or name in params)}
  try:
    return fn(*args, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(flag, path, f"{path} raised {type(e).__name__}: "
                      f"{first_line(e)}") from None


def split_model_result(path: str, result, model_type: type,
                       type_name: str) -> Tuple[Any, Task]:
  """A builder's return value as (model, task).

  Args:
    path: the --model value, for the message.
    result: the model, or (model, Task).
    model_type: the class the side's models derive from.
    type_name: how the message names it ("a keras.Model").

  Raises:
    ConfigError: naming --model, for anything else.
  """
  task = Task()
  if isinstance(result, tuple) and len(result) == 2 and isinstance(
      result[1], Task):
    result, task = result
  if not isinstance(result, model_type):
    raise ConfigError("model", path, f"returned {describe_type(result)}; "
                      f"allowed: {type_name}, or ({type_name}, Task)")
  return result, task


def describe_type(value) -> str:
  """`a torch.nn.Module subclass (mypkg.Net)`-like words for a value."""
  cls = type(value)
  return f"a {cls.__module__}.{cls.__qualname__}"


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def model_origin(value: str) -> Origin:
  """Where --model's model came from, with a .keras file's digest."""
  kind = model_kind(value)
  if kind == KERAS_FILE:
    return Origin(kind, os.path.abspath(value), file_sha256(value))
  return Origin(kind, value)


def data_origin(value: str) -> Origin:
  return Origin(IMPORT if is_import_path(value) else ZOO, value)


def check_user_data(*, dataset: str, cache: bool,
                    preprocess_cost_ms: float = 0.0) -> None:
  """Refuses the knobs that cannot act on a dataset the user's callable
  built (both sides).

  Raises:
    ConfigError: naming the knob.
  """
  if not is_import_path(dataset):
    return
  if cache:
    raise ConfigError("cache", True,
                      f"--dataset={dataset} returns its own decoded "
                      "samples; cache them in the callable (e.g. "
                      "Dataset.cache()), not with --cache")
  if preprocess_cost_ms:
    raise ConfigError("preprocess_cost_ms", preprocess_cost_ms,
                      f"adds work to the zoo's decoding, and --dataset="
                      f"{dataset} does its own; allowed: 0")


def check_task_and_data(path: str, task: Task, dataset: str) -> None:
  """Refuses a regression model on the zoo's data, whose targets are
  class labels."""
  if task.kind == REGRESSION and not is_import_path(dataset):
    raise ConfigError("dataset", dataset,
                      f"--model={path} declares a regression task and "
                      f"--dataset={dataset} yields class labels; allowed: "
                      "package.module:callable returning (x, y) pairs")


def check_importable(model: str, dataset: str) -> None:
  """Imports the user's callables named by --model and --dataset, so that a
  module that does not import or lacks the attribute is refused before the
  run writes anything.

  Raises:
    ConfigError: naming the flag (see `load_callable`).
  """
  if is_import_path(model):
    load_callable("model", model)
  if is_import_path(dataset):
    load_callable("dataset", dataset)


def first_line(error: BaseException) -> str:
  """An exception's first line: what a one-line refusal quotes of it."""
  return (str(error).strip().splitlines() or [""])[0]


def shape_text(value) -> str:
  """A tensor's shape as a list, or what the value is when it has none."""
  shape = getattr(value, "shape", None)
  return str(list(shape)) if shape is not None else type(value).__name__


def recording_input_shape(first_batch: Callable):
  """`first_batch`, wrapped to keep the shape of one example's inputs.

  Returns:
    (wrapped, shapes): after `wrapped` ran, shapes[0] is that shape.
  """
  shapes = []

  def wrapped(spec):
    inputs, targets = first_batch(spec)
    shapes.append(tuple(inputs.shape[1:]))
    return inputs, targets

  return wrapped, shapes


def probe_refusal(path: str, error: BaseException, *, inputs, outputs=None,
                  targets=None, task: Optional[Task] = None) -> ConfigError:
  """The one line for a user model that failed on the data's first
  examples: on its forward pass (`outputs` None), or on its task's loss."""
  cause = f"{type(error).__name__}: {first_line(error)}"
  if outputs is None:
    return ConfigError("model", path,
                       f"does not take the data's first batch (inputs "
                       f"{shape_text(inputs)}): {cause}")
  return ConfigError("model", path,
                     f"its outputs {shape_text(outputs)} do not fit the "
                     f"{task} loss on targets {shape_text(targets)}: {cause}")
