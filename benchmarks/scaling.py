"""Scaling efficiency: throughput at 1 and 2 workers, both frameworks, Horovod.

  python -m benchmarks.scaling                  # EDSR and ResNet-18
  python -m benchmarks.scaling --quick          # a smoke run, 1 repeat
  python -m benchmarks.scaling --models=edsr --stacks=pytorch_ddp,horovod

For every model and stack, the same training runs with 1 worker and with
2 workers on this host. 2 workers are a job of the project's launcher,
which sizes each process's thread pools to its share of the cores; 1
worker is the single-process trainer (the launchers start 2 or more, and
one process has nothing to all-reduce), with the pools a job of one
process gets, so that the number of workers is the only change:

  tensorflow    2: python -m tfoverlap.launch --num_workers=2 --
                (MultiWorkerMirroredStrategy; RING over gRPC on CPU)
  pytorch_ddp   2: python -m torch_parity.launch --num_workers=2 --
                --strategy=multi_worker (DDP on gloo)
  horovod       2: python -m torch_parity.launch --num_workers=2 --
                --strategy=horovod (horovodrun --gloo)
  1 worker      python -m tfoverlap.train / torch_parity.train
                --strategy=default (the same run for pytorch_ddp and
                horovod: Horovod with one rank has nothing to do)

Weak scaling, as the Horovod study measured it: each worker keeps the same
batch (`per_worker_batch` in MODELS), so the global batch doubles with
the workers.
Throughput is run.json's samples/s of the steady-state steps (rank 0's, in
global samples). Efficiency = throughput(2) / (2 * throughput(1)), taken
within each repeat (both jobs ran minutes apart under the same load) and
reported as the median with its interval (`benchmarks.harness`); 1 would
be perfect scaling. On one 2-core host the two workers share the cores
that one worker had to itself, so this measures the cost of the
all-reduce and the sharing, not a cluster's scaling.
"""

import functools
import os

from benchmarks import common
from benchmarks import harness
from overlap_core.runtime import processes

NAME = "scaling"
DEFAULT_REPEATS = 5
WORKER_COUNTS = (1, 2)
MODELS = {
    # EDSR, the Horovod study's model, at a small input: super-resolution
    # of 32x32 synthetic images, 2x upscale.
    "edsr": {"flags": ["--model=edsr", "--dataset=synthetic",
                       "--image_size=32", "--synthetic_on_device"],
             "per_worker_batch": 8, "train_steps": 40, "quick_steps": 8},
    "resnet18": {"flags": ["--model=resnet18", "--dataset=synthetic",
                           "--image_size=32", "--synthetic_on_device"],
                 "per_worker_batch": 16, "train_steps": 40, "quick_steps": 8},
}
STACKS = {
    "tensorflow": {"framework": "tensorflow", "strategy": "multi_worker"},
    "pytorch_ddp": {"framework": "pytorch", "strategy": "multi_worker"},
    "horovod": {"framework": "pytorch", "strategy": "horovod"},
}


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS)
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--stacks", default=",".join(STACKS))
  parser.add_argument("--train_steps", type=int, default=None)
  args, passthrough = common.parse_with_trainer_flags(parser)
  for option, known in (("models", MODELS), ("stacks", STACKS)):
    names = [n for n in getattr(args, option).split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
      parser.error(f"--{option}={getattr(args, option)}: allowed: "
                   f"{', '.join(known)}")
    setattr(args, option, names)
  return args, passthrough


def job(model: str, stack: str, num_workers: int, steps: int,
        passthrough: list) -> dict:
  """How to start one cell: module, trainer flags, launcher flags or None."""
  spec, config = MODELS[model], STACKS[stack]
  batch_size = spec["per_worker_batch"] * num_workers
  flags = [*spec["flags"], f"--batch_size={batch_size}",
           f"--train_steps={steps}", "--checkpoint=none", *passthrough]
  if num_workers == 1:
    # The launchers start 2 or more workers, and one process has nothing
    # to all-reduce: the single-process trainer, with the thread pools the
    # launchers size for a job of that many processes.
    return {"module": common.TRAINER_MODULES[config["framework"]],
            "flags": processes.add_job_defaults(
                flags + ["--strategy=default"],
                framework=config["framework"], num_processes=1),
            "launcher_flags": None}
  return {"module": common.LAUNCHER_MODULES[config["framework"]],
          "flags": flags + [f"--strategy={config['strategy']}"],
          "launcher_flags": [f"--num_workers={num_workers}"]}


def summarize(runs: list, models: list, stacks: list) -> dict:
  summary = {}
  for model in models:
    for stack in stacks:
      mine = [r for r in runs if r["model"] == model and r["stack"] == stack]
      by_workers = harness.values_by_side(
          mine, lambda r: r["result"]["samples_per_second"],
          side_field="num_workers")
      one, two = by_workers.get(1, []), by_workers.get(2, [])
      entry = {"samples_per_second": {
          str(n): {"per_repeat": v, "median": common.median(
              [x for x in v if x is not None])}
          for n, v in by_workers.items()}}
      if one and two:
        # throughput(2) / (2 * throughput(1)), within each repeat.
        entry["efficiency"] = harness.summarize_ratios(
            two, [x and 2 * x for x in one])
      summary[f"{model}/{stack}"] = entry
  return summary


def format_summary(summary: dict) -> str:
  rows = []
  for name, entry in summary.items():
    sps = entry["samples_per_second"]
    rows.append([name, sps.get("1", {}).get("median", "-"),
                 sps.get("2", {}).get("median", "-"),
                 harness.format_interval(entry["efficiency"])
                 if "efficiency" in entry else "-"])
  return common.format_table(
      ["model/stack", "samples/s, 1 worker", "samples/s, 2 workers",
       "efficiency: median [interval]"], rows)


def measure(args, passthrough, repeats: int, scratch: str
            ) -> harness.Measured:
  cells = [(model, stack, n) for model in args.models
           for stack in args.stacks for n in WORKER_COUNTS]

  def run_one(cell, repeat):
    model, stack, num_workers = cell
    spec = MODELS[model]
    steps = args.train_steps or (spec["quick_steps"] if args.quick
                                 else spec["train_steps"])
    started = job(model, stack, num_workers, steps, passthrough)
    result = common.run_trainer(
        started["flags"],
        os.path.join(scratch, f"{model}-{stack}-{num_workers}-{repeat}"),
        module=started["module"], launcher_flags=started["launcher_flags"])
    common.log(f"repeat {repeat + 1}/{repeats} {model} {stack} "
               f"{num_workers} worker(s): "
               f"{result['samples_per_second']:.1f} samples/s")
    return {"model": model, "stack": stack, "num_workers": num_workers,
            "repeat": repeat, "job": started, "result": result}

  record = harness.run_interleaved(cells, repeats, run_one,
                                   redo_busy=args.redo_busy)
  return harness.Measured.of_group(
      record, summary=summarize(record["runs"], args.models, args.stacks),
      models={m: MODELS[m] for m in args.models},
      stacks={s: STACKS[s] for s in args.stacks})


def main():
  args, passthrough = parse_args()
  harness.main(NAME, args, functools.partial(measure, args, passthrough),
               default_repeats=DEFAULT_REPEATS,
               table=lambda payload: format_summary(payload["summary"]))


if __name__ == "__main__":
  main()
