"""A training step under glibc's default allocator and under `retain`.

  python -m benchmarks.host_allocator            # 5 repeats
  python -m benchmarks.host_allocator --quick    # a smoke run

`--host_allocator` (overlap_core/runtime/host_allocator.py) decides
whether large freed host blocks stay with the process (`retain`) or go
back to the OS under glibc's own rules (`system`), to come back as fresh,
faulting pages. Each cell is one trainer process, `--strategy=default`
on one intra-op thread (what one stage process of a 2-stage pipeline gets
on 2 cores), synthetic 32 px images, batch 4, for:

  framework  tensorflow, pytorch
  model      resnet50, vgg16
  policy     retain, system

Per framework and model: the median step under each policy, their
per-repeat ratio (system over retain) with its interval, and the page
faults the system runs took beyond the retain runs, per step. Both runs
import and build the same things, so that difference is the steps' own:
the memory the default policy handed back and had to fault in again.
"""

import functools

from benchmarks import common
from benchmarks import harness

NAME = "host_allocator"
DEFAULT_REPEATS = 5
FRAMEWORKS = ("tensorflow", "pytorch")
MODELS = ("resnet50", "vgg16")
QUICK_MODELS = ("small_cnn",)
POLICIES = ("retain", "system")
TRAIN_STEPS = 40
QUICK_TRAIN_STEPS = 6


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS)
  return parser.parse_args()


def job_flags(model: str, policy: str, train_steps: int) -> list:
  return [f"--model={model}", "--dataset=synthetic", "--image_size=32",
          "--batch_size=4", "--strategy=default", "--intra_op_threads=1",
          f"--train_steps={train_steps}", f"--host_allocator={policy}"]


def cells(models) -> list:
  """(framework, model, policy) of every cell."""
  return [(framework, model, policy) for framework in FRAMEWORKS
          for model in models for policy in POLICIES]


def summarize(runs: list, models, train_steps: int) -> dict:
  def per_repeat(cell, get):
    return harness.values_by_side(runs, get, side_field="cell")[cell]

  summary = {}
  for framework in FRAMEWORKS:
    for model in models:
      step_ms = {p: per_repeat((framework, model, p),
                               lambda r: r["result"]["step"]["p50_ms"])
                 for p in POLICIES}
      faults = {p: per_repeat((framework, model, p),
                              lambda r: r["result"]["process_minor_faults"])
                for p in POLICIES}
      extra_per_step = [(s - r) / train_steps
                        for s, r in zip(faults["system"], faults["retain"])]
      summary[f"{framework}/{model}"] = {
          "framework": framework, "model": model,
          "step_ms_all": step_ms,
          "minor_faults_all": faults,
          "system_over_retain": harness.summarize_ratios(
              step_ms["system"], step_ms["retain"]),
          "extra_faults_per_step_all": extra_per_step,
          "extra_faults_per_step": common.median(extra_per_step),
      }
  return summary


def format_summary(summary: dict) -> str:
  rows = [[name, common.median(cell["step_ms_all"]["retain"]),
           common.median(cell["step_ms_all"]["system"]),
           harness.format_interval(cell["system_over_retain"]),
           cell["extra_faults_per_step"]]
          for name, cell in summary.items()]
  return common.format_table(
      ["framework/model", "step ms, retain", "step ms, system",
       "system / retain", "extra faults per step"], rows)


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  models = QUICK_MODELS if args.quick else MODELS
  train_steps = QUICK_TRAIN_STEPS if args.quick else TRAIN_STEPS

  def describe(cell, result):
    return (f"{'/'.join(cell)}: step {result['step']['p50_ms']:.1f} ms, "
            f"{result['process_minor_faults']} faults")

  record = harness.run_trainer_cells(
      cells(models), repeats, scratch,
      flags_of=lambda cell: job_flags(cell[1], cell[2], train_steps),
      module_of=lambda cell: common.TRAINER_MODULES[cell[0]],
      describe=describe, redo_busy=args.redo_busy)
  return harness.Measured.of_group(
      record, summary=summarize(record["runs"], models, train_steps),
      train_steps=train_steps)


def main():
  args = parse_args()
  harness.main(NAME, args, functools.partial(measure, args),
               default_repeats=DEFAULT_REPEATS,
               table=lambda payload: format_summary(payload["summary"]))


if __name__ == "__main__":
  main()
