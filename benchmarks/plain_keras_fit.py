"""Plain Keras `model.fit`: the baseline the trainer is measured against.

  python -m benchmarks.plain_keras_fit --model=small_cnn --dataset=digits \
      --train_steps=300 --result_json=plain.json

It takes the trainer's own model, data and strategy flags, parsed by the same
flag surface, so the configuration is identical by construction; it then
uses tfoverlap only to build the same model (`tfoverlap.models.build_model`,
or `tfoverlap.user_model.load_model` for the user's own) and the same input
pipeline (`make_input_fn` + `distribute_input`). The
strategy, compile and training are plain TensorFlow/Keras: `model.compile`
with the trainer's optimizer and loss, and `model.fit(..., verbose=0)` with no
callbacks. Flags the baseline has no counterpart for (loop, checkpoints,
outputs) are ignored; a data service is refused.

The user's own model and data are taken as the trainer takes them:

  python -m benchmarks.plain_keras_fit \
      --model=examples.keras_regression.model:build \
      --dataset=examples.keras_regression.data:load --batch_size=64 \
      --train_steps=300 --result_json=plain.json

`--model=package.module:callable` (or a `.keras` file) is built and checked
by the trainer's own `tfoverlap.user_model.load_model`, under the same
strategy, and compiled with the Keras loss of the Task it declares (mean
squared error for a regression); `--dataset=package.module:callable` goes
through the same `make_input_fn`. A model or data set the trainer refuses
is refused here, with its one line and exit 2.

How the steady state is timed without callbacks. A `model.fit` call's wall
time includes fixed costs that the trainer's step ledger leaves out: creating
the iterator and filling the pipeline, and Keras' set-up and tear-down of the
epoch. So, after a warm-up fit of W steps that traces the step function,
fits are timed with `time.perf_counter`: three of W steps and one of W + M
steps, M = train_steps - W and W the ledger's own warm-up count
(`default_warmup_steps(train_steps)`). The long fit's time less the median
short fit's, divided by M, is the
marginal cost of one steady-state step: the fixed costs cancel, and every
per-step cost Keras pays (its Python loop, the History callback, the
iterator) stays in. That is what the trainer's run.json reports as
samples_per_second: samples over the summed duration of its steady-state
steps, each step chained to the previous one's end.

With --synthetic_on_device (which model.fit cannot read; the trainer keeps a
batch resident) the baseline does what Keras throughput benchmarks do: one
batch of the pipeline, cached and repeated, staged on the device by
`prefetch_to_device`, so no input work runs while training.
"""

import dataclasses
import functools
import statistics
import sys
import time

from absl import app
from absl import flags as absl_flags

import flags as tfo_flags
from benchmarks import common
from overlap_core.runtime.config import ConfigError
from overlap_core.runtime.ledger import default_warmup_steps

tfo_flags.define_flags()
_RESULT_JSON = absl_flags.DEFINE_string(
    "result_json", None, "Where to write the baseline's timings (JSON).")
_JIT_COMPILE = absl_flags.DEFINE_enum(
    "jit_compile", "auto", ["auto", "true", "false"],
    "model.compile's jit_compile. auto is plain Keras' default (XLA only with "
    "an accelerator and no tf.distribute strategy); tfoverlap's trainer never "
    "uses XLA.")
SHORT_FITS = 3


def configure_devices(strategy: str, num_devices: int, intra_op: int,
                      inter_op: int) -> None:
  """Before any TensorFlow op, as a plain Keras script would do it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if intra_op:
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
  if inter_op:
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
  if strategy == "mirrored" and not tf.config.list_physical_devices("GPU"):
    # A CPU-only host has one CPU device; MirroredStrategy needs one device
    # per replica, so the CPU is split into logical devices.
    cpu = tf.config.list_physical_devices("CPU")[0]
    # Once per process: TensorFlow refuses a second split once it runs.
    if tf.config.get_logical_device_configuration(cpu) is None:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


def build_strategy(name: str, num_devices: int):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_physical_devices("GPU")
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "one_device":
    return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
  if name == "mirrored":
    kind = "gpu" if gpus else "cpu"
    return tf.distribute.MirroredStrategy(
        [f"/{kind}:{i}" for i in range(num_devices)])
  raise ConfigError("strategy", name,
                    "the plain Keras baseline runs in one process; allowed: "
                    "default, one_device, mirrored")


def build_optimizer(name: str, learning_rate: float):
  import keras  # pylint: disable=g-import-not-at-top
  # No LossScaleOptimizer here: compile wraps the optimizer itself under
  # mixed_float16 (auto_scale_loss), as plain Keras users rely on.
  if name == "sgd":
    return keras.optimizers.SGD(learning_rate)
  if name == "momentum":
    return keras.optimizers.SGD(learning_rate, momentum=0.9)
  return keras.optimizers.Adam(learning_rate)


def build_model(config, info, strategy):
  """(model, spec): the zoo's model as the trainer builds it, or the user's
  --model through the trainer's own loading and checks, under `strategy`.

  Raises:
    ConfigError: what the trainer refuses of the user's model or data.
  """
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import user_code, zoo
  from tfoverlap import models, user_model
  # pylint: enable=g-import-not-at-top
  name = config.model.name
  if user_code.model_kind(name) != user_code.ZOO:
    return user_model.load_model(
        config, info, strategy=strategy,
        first_batch=user_model.make_first_batch(config, info))
  with strategy.scope():
    model = models.build_model(name, image_size=config.data.image_size,
                               num_classes=info.num_classes,
                               channels=info.channels)
  return model, zoo.MODELS[name]


def build_loss(task: str):
  """The Keras loss a plain user compiles for the trainer's task: the same
  per-example loss (`tfoverlap.steps.per_example_loss`), Keras' class."""
  # pylint: disable=g-import-not-at-top
  import keras
  from overlap_core.runtime import user_code, zoo
  # pylint: enable=g-import-not-at-top
  if task == zoo.SUPER_RESOLUTION:
    return keras.losses.MeanAbsoluteError()
  if task == user_code.REGRESSION:
    return keras.losses.MeanSquaredError()
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


JIT_COMPILE = {"auto": "auto", "true": True, "false": False}


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A compiled model and its distributed input, ready for `model.fit`."""
  model: object
  dataset: object
  strategy: object
  spec: object


def prepare(config, jit_compile: str = "auto") -> Prepared:
  """Builds and compiles the model and its input as plain Keras would,
  from the trainer's configuration. Callable again in the same process
  with the same thread and device settings (TensorFlow keeps them once
  set).

  Args:
    jit_compile: model.compile's, as --jit_compile takes it.

  Raises:
    ConfigError: what the baseline or the trainer refuses of the
      configuration, the user's model or data.
  """
  if config.data.data_service:
    raise ConfigError("data_service", config.data.data_service,
                      "the plain Keras baseline has no data service; "
                      "allowed: empty")
  configure_devices(config.distribute.strategy, config.distribute.num_devices,
                    config.run.intra_op_threads, config.run.inter_op_threads)

  # pylint: disable=g-import-not-at-top
  import keras
  from tfoverlap import data
  # pylint: enable=g-import-not-at-top

  keras.utils.set_random_seed(config.run.seed)
  strategy = build_strategy(config.distribute.strategy,
                            config.distribute.num_devices)
  info = data.describe(config.data)
  keras.mixed_precision.set_global_policy(config.model.precision)
  model, spec = build_model(config, info, strategy)
  with strategy.scope():
    model.compile(
        optimizer=build_optimizer(config.model.optimizer,
                                  config.model.learning_rate),
        loss=build_loss(spec.task), jit_compile=JIT_COMPILE[jit_compile])

  data_cfg = config.data
  if data_cfg.synthetic_on_device:
    bare = dataclasses.replace(data_cfg, synthetic_on_device=False,
                               preprocess_cost_ms=0.0, cache=False)
    one_batch_fn = data.make_input_fn(bare, split="train", task=spec.task,
                                      seed=config.run.seed,
                                      upscale=spec.upscale)

    def input_fn(ctx):
      return one_batch_fn(ctx).take(1).cache().repeat()

    data_cfg = dataclasses.replace(bare, prefetch_to_device=True)
  else:
    input_fn = data.make_input_fn(data_cfg, split="train", task=spec.task,
                                  seed=config.run.seed, upscale=spec.upscale)
  return Prepared(model=model,
                  dataset=data.distribute_input(strategy, input_fn, data_cfg),
                  strategy=strategy, spec=spec)


def run(config, jit_compile: str = "auto") -> dict:
  """Trains as configured with plain `model.fit`; returns the timings that
  main writes as --result_json. Callable again in the same process, as
  `prepare` is.

  Args:
    jit_compile: model.compile's, as --jit_compile takes it.

  Raises:
    ConfigError: what the baseline or the trainer refuses of the
      configuration, the user's model or data.
  """
  total_steps = config.run.train_steps
  warmup_steps = default_warmup_steps(total_steps)
  measured_steps = total_steps - warmup_steps
  if measured_steps < 1:
    raise ConfigError("train_steps", total_steps, "allowed: at least 2")
  prepared = prepare(config, jit_compile)
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tfoverlap import models
  # pylint: enable=g-import-not-at-top
  model, dataset = prepared.model, prepared.dataset
  strategy, spec = prepared.strategy, prepared.spec

  def timed_fit(num_steps: int):
    start = time.perf_counter()
    history = model.fit(dataset, epochs=1, steps_per_epoch=num_steps,
                        verbose=0)
    return time.perf_counter() - start, history.history["loss"][-1]

  warmup_fit_s, _ = timed_fit(warmup_steps)
  # The short fit is subtracted, so a hiccup in it would inflate the
  # baseline's throughput: its median over a few is used.
  short_fits_s = [timed_fit(warmup_steps)[0] for _ in range(SHORT_FITS)]
  short_fit_s = statistics.median(short_fits_s)
  long_fit_s, loss = timed_fit(warmup_steps + measured_steps)
  marginal_step_s = (long_fit_s - short_fit_s) / measured_steps
  batch = config.data.batch_size
  return {
      "samples_per_second": batch / marginal_step_s,
      "marginal_step_ms": 1e3 * marginal_step_s,
      # The same run timed the naive way, fixed costs included, for contrast.
      "whole_fit_samples_per_second":
          batch * (warmup_steps + measured_steps) / long_fit_s,
      "warmup_steps": warmup_steps,
      "measured_steps": measured_steps,
      "fit_s": {"warmup": warmup_fit_s, "short": short_fits_s,
                "long": long_fit_s},
      "jit_compile": bool(model.jit_compile),
      "train_loss": float(loss),
      "num_params": models.num_params(model),
      "task": spec.task,
      "loss": type(model.loss).__name__,
      "num_replicas": strategy.num_replicas_in_sync,
      "devices": [d.name for d in tf.config.list_logical_devices()],
  }


def main(argv):
  del argv
  result = common.run_plain_baseline(
      _RESULT_JSON.value,
      functools.partial(run, jit_compile=_JIT_COMPILE.value))
  print(f"plain keras fit: {result['samples_per_second']:.1f} samples/s "
        f"(marginal step {result['marginal_step_ms']:.3f} ms over "
        f"{result['measured_steps']} steps; whole fit "
        f"{result['whole_fit_samples_per_second']:.1f} samples/s)")


if __name__ == "__main__":
  app.run(main, argv=sys.argv, flags_parser=tfo_flags.parse_or_exit)
