"""A plain PyTorch training loop: the baseline the PyTorch trainer is
measured against.

  python -m benchmarks.plain_torch_loop --model=small_cnn --dataset=digits \
      --strategy=default --train_steps=300 --result_json=plain.json

It takes the trainer's own model, data and run flags, parsed by the same
flag surface, so the configuration is identical by construction. From
torch_parity it uses only what makes the work the same: the model
(`torch_parity.models.build_model`, or `torch_parity.user_model.load_model`
for the user's own) and the input (`make_loader`, or with
--synthetic_on_device the batch `make_resident_iterator` keeps on the
device, reused every step). The rest is the loop of any PyTorch tutorial:
`torch.optim` with the trainer's hyperparameters, and per step `next`,
`zero_grad`, forward, the task's loss, `backward`, `step`; under
--precision=mixed_bfloat16 the forward runs in `torch.autocast`
(the trainer's own context, `torch_parity.steps.autocast`), which bfloat16
needs no loss scaling for. No ledger, progress
lines, TensorBoard, trace, checkpoints or run.json. It runs in one process:
--strategy default or one_device.

The user's own model and data are taken as the trainer takes them:

  python -m benchmarks.plain_torch_loop \
      --model=examples.torch_module.model:build \
      --dataset=examples.torch_module.data:load --image_size=16 \
      --batch_size=32 --strategy=default --train_steps=300 \
      --result_json=plain.json

`--model=package.module:callable` is built and checked by the trainer's
own `torch_parity.user_model.load_model`, and trained with the torch loss
of the Task it declares (`F.mse_loss` for a regression);
`--dataset=package.module:callable` goes through the same `make_loader`.
A model or data set the trainer refuses is refused here, with its one line
and exit 2.

How it is timed. `time.perf_counter()` after every step, and once before
the first; a step lasts from the previous step's end to its own, as the
trainer's ledger chains them. The first W steps (the ledger's own warm-up
count, `default_warmup_steps`) are left out; samples/s is the samples of
the remaining M steps over their summed time, p50 the median step. The
wait in `next` is timed too, as the trainer's `data_wait` is. Reading
the clock costs well under a microsecond a step. The loss is not read back
each step (a plain loop need not), so on a GPU the device is waited for at
the end of the timed steps instead; on the CPU every step is synchronous.
"""

import dataclasses
import statistics
import sys
import time

from absl import app
from absl import flags as absl_flags

import flags as tfo_flags
from benchmarks import common
from overlap_core.runtime.config import ConfigError

tfo_flags.define_flags()
_RESULT_JSON = absl_flags.DEFINE_string(
    "result_json", None, "Where to write the baseline's timings (JSON).")
# float16 would need a GradScaler, which a plain bfloat16 loop does without.
PRECISIONS = ("float32", "mixed_bfloat16")


def build_optimizer(name: str, learning_rate: float, parameters):
  # pylint: disable=g-import-not-at-top
  import torch
  from torch_parity import steps
  # pylint: enable=g-import-not-at-top
  # The trainer's hyperparameters (Keras' defaults); the classes are
  # torch's own.
  if name == "sgd":
    return torch.optim.SGD(parameters, lr=learning_rate)
  if name == "momentum":
    return torch.optim.SGD(parameters, lr=learning_rate,
                           momentum=steps.MOMENTUM)
  return torch.optim.Adam(parameters, lr=learning_rate,
                          eps=steps.ADAM_EPSILON)


def build_model(config, info):
  """(model, spec) on the CPU: the zoo's model as the trainer builds it, or
  the user's --model through the trainer's own loading and checks.

  Raises:
    ConfigError: what the trainer refuses of the user's model or data.
  """
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import user_code, zoo
  from torch_parity import models, user_model
  # pylint: enable=g-import-not-at-top
  name = config.model.name
  if user_code.model_kind(name) != user_code.ZOO:
    return user_model.load_model(
        config, info, first_batch=user_model.make_first_batch(config, info))
  return (models.build_model(name, image_size=config.data.image_size,
                             num_classes=info.num_classes,
                             channels=info.channels),
          zoo.MODELS[name])


def build_loss(task: str):
  """loss_fn(outputs, targets): the torch loss a plain loop writes for the
  trainer's task, the mean of `torch_parity.steps.per_example_loss`."""
  # pylint: disable=g-import-not-at-top
  from torch.nn import functional as F
  from overlap_core.runtime import user_code, zoo
  # pylint: enable=g-import-not-at-top
  if task == zoo.SUPER_RESOLUTION:
    return F.l1_loss
  if task == user_code.REGRESSION:
    # The trainer takes targets of any shape with the outputs' size ([B]
    # for outputs [B, 1]); F.mse_loss would broadcast them instead.
    def mse_loss(outputs, targets):
      return F.mse_loss(outputs,
                        targets.reshape(outputs.shape).to(outputs.dtype))

    return mse_loss
  return F.cross_entropy


def _describe_ms(durations_s) -> dict:
  return {"p50_ms": 1e3 * statistics.median(durations_s),
          "mean_ms": 1e3 * statistics.fmean(durations_s)}


def check_supported(config) -> None:
  """What the plain loop cannot do, beside what the trainer refuses.

  Raises:
    ConfigError: a multi-process strategy, or a precision that needs loss
      scaling.
  """
  if config.distribute.strategy not in ("default", "one_device"):
    raise ConfigError("strategy", config.distribute.strategy,
                      "the plain loop runs in one process; allowed: "
                      "default, one_device")
  if config.model.precision not in PRECISIONS:
    raise ConfigError("precision", config.model.precision,
                      "the plain loop has no loss scaling; allowed: "
                      f"{', '.join(PRECISIONS)}")


@dataclasses.dataclass
class Prepared:
  """A model, its optimizer and loss, and the batches to train it on, as
  a plain loop sets them up. `batches` holds the loader's workers: drop
  it (`del prepared.batches`) to end them."""
  model: object
  optimizer: object
  loss_fn: object
  batches: object
  device: object
  spec: object


def prepare(config) -> Prepared:
  """Builds the model, optimizer, loss and batches as the plain loop does,
  from the trainer's configuration. Callable again in the same process
  (the thread pools are set as the trainer sets them, `configure_host`).

  Raises:
    ConfigError: what `check_supported` or the trainer refuses of the
      configuration, the user's model or data.
  """
  # pylint: disable=g-import-not-at-top
  import torch
  from torch_parity import data, distribute
  # pylint: enable=g-import-not-at-top
  check_supported(config)
  distribute.configure_host(config.run)
  torch.manual_seed(config.run.seed)
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  info = data.describe(config.data)
  model, spec = build_model(config, info)
  model = model.to(device)
  optimizer = build_optimizer(config.model.optimizer,
                              config.model.learning_rate, model.parameters())
  if config.data.synthetic_on_device:
    resident = next(data.make_resident_iterator(
        config.data, task=spec.task, seed=config.run.seed,
        upscale=spec.upscale, device=device))
    batches = iter(lambda: resident, None)
  else:
    batches = iter(data.make_loader(
        config.data, split="train", task=spec.task, seed=config.run.seed,
        upscale=spec.upscale))
  return Prepared(model=model, optimizer=optimizer,
                  loss_fn=build_loss(spec.task), batches=batches,
                  device=device, spec=spec)


def train_step(prepared: Prepared, precision: str, inputs, targets):
  """One plain step on a batch; its loss, not read back."""
  # pylint: disable=g-import-not-at-top
  from torch_parity import steps
  # pylint: enable=g-import-not-at-top
  inputs = inputs.to(prepared.device, non_blocking=True)
  targets = targets.to(prepared.device, non_blocking=True)
  prepared.optimizer.zero_grad()
  with steps.autocast(precision, prepared.device):
    outputs = prepared.model(inputs)
  loss = prepared.loss_fn(outputs, targets)
  loss.backward()
  prepared.optimizer.step()
  return loss


def run(config) -> dict:
  """Trains as configured, the plain way; returns the timings that main
  writes as --result_json. Callable again in the same process, as
  `prepare` is.

  Raises:
    ConfigError: what `check_supported` or the trainer refuses of the
      configuration, the user's model or data.
  """
  # pylint: disable=g-import-not-at-top
  import torch
  from overlap_core.runtime.ledger import default_warmup_steps
  from torch_parity import models
  # pylint: enable=g-import-not-at-top
  total_steps = config.run.train_steps
  warmup_steps = default_warmup_steps(total_steps)
  if total_steps - warmup_steps < 1:
    raise ConfigError("train_steps", total_steps, "allowed: at least 2")
  prepared = prepare(config)
  model, spec, device = prepared.model, prepared.spec, prepared.device
  loss_fn, batches = prepared.loss_fn, prepared.batches
  ends_s = [time.perf_counter()]
  waits_s = []
  for _ in range(total_steps):
    wait_start_s = time.perf_counter()
    inputs, targets = next(batches)
    waits_s.append(time.perf_counter() - wait_start_s)
    loss = train_step(prepared, config.model.precision, inputs, targets)
    ends_s.append(time.perf_counter())
  if device.type == "cuda":
    torch.cuda.synchronize(device)
    ends_s[-1] = time.perf_counter()
  final_loss = float(loss.detach())
  # The loader's workers end here, not whenever the iterator is collected:
  # a caller that runs again in this process gets its cores back.
  del batches, prepared.batches

  steps_s = [b - a for a, b in zip(ends_s, ends_s[1:])][warmup_steps:]
  waits_s = waits_s[warmup_steps:]
  batch = config.data.batch_size
  return {
      "samples_per_second": batch * len(steps_s) / sum(steps_s),
      "step": _describe_ms(steps_s),
      # Named as the trainer's run.json names its phases, so that a driver
      # can set the two side by side (`torch_trainer_overhead.gap`).
      "data_wait": _describe_ms(waits_s),
      "warmup_steps": warmup_steps,
      "measured_steps": len(steps_s),
      "train_loss": final_loss,
      "num_params": models.num_params(model),
      "task": spec.task,
      "loss": loss_fn.__name__,
      "device": str(device),
      "precision": config.model.precision,
      "torch_threads": {"intra_op": torch.get_num_threads(),
                        "inter_op": torch.get_num_interop_threads()},
  }


def main(argv):
  del argv
  result = common.run_plain_baseline(_RESULT_JSON.value, run)
  print(f"plain torch loop: {result['samples_per_second']:.1f} samples/s "
        f"(step p50 {result['step']['p50_ms']:.3f} ms over "
        f"{result['measured_steps']} steps)")


if __name__ == "__main__":
  app.run(main, argv=sys.argv, flags_parser=tfo_flags.parse_or_exit)
