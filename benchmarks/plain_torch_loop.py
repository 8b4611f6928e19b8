"""A plain PyTorch training loop: the baseline the PyTorch trainer is
measured against.

  python -m benchmarks.plain_torch_loop --model=small_cnn --dataset=digits \
      --strategy=default --train_steps=300 --result_json=plain.json

It takes the trainer's own model, data and run flags, parsed by the same
flag surface, so the configuration is identical by construction. From
torch_parity it uses only what makes the work the same: the model
(`torch_parity.models.build_model`) and the input (`make_loader`, or with
--synthetic_on_device the batch `make_resident_iterator` keeps on the
device, reused every step). The rest is the loop of any PyTorch tutorial:
`torch.optim` with the trainer's hyperparameters, and per step `next`,
`zero_grad`, forward, cross-entropy, `backward`, `step`; under
--precision=mixed_bfloat16 the forward runs in `torch.autocast`
(the trainer's own context, `torch_parity.steps.autocast`), which bfloat16
needs no loss scaling for. No ledger, progress
lines, TensorBoard, trace, checkpoints or run.json. It runs in one process:
--strategy default or one_device.

How it is timed. `time.perf_counter()` after every step, and once before
the first; a step lasts from the previous step's end to its own, as the
trainer's ledger chains them. The first W steps (the ledger's own warm-up
count, `default_warmup_steps`) are left out; samples/s is the samples of
the remaining M steps over their summed time, p50 the median step. Reading
the clock costs well under a microsecond a step. The loss is not read back
each step (a plain loop need not), so on a GPU the device is waited for at
the end of the timed steps instead; on the CPU every step is synchronous.
"""

import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags as absl_flags
from absl import logging

import flags as tfo_flags

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


def main(argv):
  del argv
  if not _RESULT_JSON.value:
    tfo_flags.exit_with_usage_error("--result_json is required")
  config = tfo_flags.to_config(tfo_flags.FLAGS)
  if config.distribute.strategy not in ("default", "one_device"):
    tfo_flags.exit_with_usage_error(
        f"--strategy={config.distribute.strategy}: the plain loop runs in "
        "one process; allowed: default, one_device")
  if config.model.precision not in PRECISIONS:
    tfo_flags.exit_with_usage_error(
        f"--precision={config.model.precision}: the plain loop has no loss "
        f"scaling; allowed: {', '.join(PRECISIONS)}")
  logging.set_verbosity(logging.WARNING)

  # pylint: disable=g-import-not-at-top
  import torch
  from torch.nn import functional as F
  from overlap_core.runtime import zoo
  from overlap_core.runtime.ledger import default_warmup_steps
  from torch_parity import data, models, steps
  # pylint: enable=g-import-not-at-top

  if config.run.intra_op_threads:
    torch.set_num_threads(config.run.intra_op_threads)
  if config.run.inter_op_threads:
    torch.set_num_interop_threads(config.run.inter_op_threads)
  torch.manual_seed(config.run.seed)
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  spec = zoo.MODELS[config.model.name]
  info = data.describe(config.data)
  model = models.build_model(config.model.name,
                             image_size=config.data.image_size,
                             num_classes=info.num_classes,
                             channels=info.channels).to(device)
  optimizer = build_optimizer(config.model.optimizer,
                              config.model.learning_rate, model.parameters())
  if spec.task == "super_resolution":
    loss_fn = F.l1_loss
  else:
    loss_fn = F.cross_entropy

  if config.data.synthetic_on_device:
    resident = next(data.make_resident_iterator(
        config.data, task=spec.task, seed=config.run.seed,
        upscale=spec.upscale, device=device))
    batches = iter(lambda: resident, None)
  else:
    batches = iter(data.make_loader(
        config.data, split="train", task=spec.task, seed=config.run.seed,
        upscale=spec.upscale))

  total_steps = config.run.train_steps
  warmup_steps = default_warmup_steps(total_steps)
  if total_steps - warmup_steps < 1:
    tfo_flags.exit_with_usage_error(
        f"--train_steps={total_steps}: allowed: at least 2")

  ends_s = [time.perf_counter()]
  for _ in range(total_steps):
    inputs, targets = next(batches)
    inputs = inputs.to(device, non_blocking=True)
    targets = targets.to(device, non_blocking=True)
    optimizer.zero_grad()
    with steps.autocast(config.model.precision, device):
      outputs = model(inputs)
    loss = loss_fn(outputs, targets)
    loss.backward()
    optimizer.step()
    ends_s.append(time.perf_counter())
  if device.type == "cuda":
    torch.cuda.synchronize(device)
    ends_s[-1] = time.perf_counter()
  final_loss = float(loss.detach())

  steps_s = [b - a for a, b in zip(ends_s, ends_s[1:])][warmup_steps:]
  batch = config.data.batch_size
  result = {
      "samples_per_second": batch * len(steps_s) / sum(steps_s),
      "step": {"p50_ms": 1e3 * statistics.median(steps_s),
               "mean_ms": 1e3 * statistics.fmean(steps_s)},
      "warmup_steps": warmup_steps,
      "measured_steps": len(steps_s),
      "train_loss": final_loss,
      "num_params": models.num_params(model),
      "device": str(device),
      "precision": config.model.precision,
      "torch_threads": {"intra_op": torch.get_num_threads(),
                        "inter_op": torch.get_num_interop_threads()},
  }
  os.makedirs(os.path.dirname(os.path.abspath(_RESULT_JSON.value)),
              exist_ok=True)
  with open(_RESULT_JSON.value, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  print(f"plain torch loop: {result['samples_per_second']:.1f} samples/s "
        f"(step p50 {result['step']['p50_ms']:.3f} ms over "
        f"{len(steps_s)} steps)")


if __name__ == "__main__":
  app.run(main, argv=sys.argv, flags_parser=tfo_flags.parse_or_exit)
