"""A balanced pipeline's bubble against theory, and what stages buy.

  python -m benchmarks.pipeline_bubble            # vgg16, resnet50
  python -m benchmarks.pipeline_bubble --quick    # smoke: small_cnn
  python -m benchmarks.pipeline_bubble --framework=tensorflow_processes \
      --models=vgg16=32                           # TensorFlow's stages

Section 13 measured GPipe's bubble on the even split, whose second stage
took 3.2 times the first, so most of its idle time was imbalance. Here
each model is cut by the planner (`--pipeline_split=auto` on a profile the
planning command wrote, as a user runs it), and:

  1. the bubble: 2 stages as 2 processes of one intra-op thread each, at
     M = 4, 8 and 16 micro-batches of MICROBATCH_SIZE examples, the
     measured bubble (run.json's `pipeline.bubble_fraction`) against
     GPipe's (S - 1)/(M + S - 1). The goal: within 5 percentage points,
     judged on the per-repeat differences. Beside it, the idle time taken
     apart (`pipeline.bubble_parts`: fill and drain, imbalance, posting,
     the loss and update, and the residual, which holds gloo's wire time),
     so a miss says which cause holds it.
  2. what the stages buy: the same model unsplit, in one process with 2
     intra-op threads on the same 2 cores and the same global batch; the
     pipeline's samples/s over the unsplit model's, paired by repeat.

Every cell is one trainer process (`torch_parity.train`); the cells run
interleaved through `benchmarks.harness`, the first rotating.

--framework=tensorflow_processes runs the same grid in TensorFlow: the
profile from `tfoverlap.plan`, each pipeline a job of `tfoverlap.launch`
with `--pipeline_runtime=processes` (each stage a TensorFlow server
process of one intra-op and one inter-op thread, one micro-batch at a
time on one core as PyTorch's stages run, driven by one client), the
unsplit model `tfoverlap.train`. Its results go to
pipeline_bubble_tensorflow_processes.json. TensorFlow's runtime measures
each stage's busy time but cannot time its sends apart from waiting, so
its transfer part is zero and the wire is in the residual
(`tfoverlap.pipeline_processes.MEASURED_SOURCES`).
"""

import functools
import os

from benchmarks import common
from benchmarks import harness
from benchmarks import pipeline as pipeline_benchmark
from benchmarks import tf_pipeline
from overlap_core.runtime import bubble_parts
from overlap_core.runtime.pipeline_stats import bubble_fraction_theory

NAME = "pipeline_bubble"
DEFAULT_REPEATS = 5
STAGES = 2
FULL_MODELS = {"vgg16": 32, "resnet50": 32}
QUICK_MODELS = {"small_cnn": 8}
FULL_MICROBATCHES = (4, 8, 16)
QUICK_MICROBATCHES = (2, 4)
# Four examples a micro-batch: ResNet-50 at 32 px ends in 1x1 maps, whose
# BatchNorm needs more than one example, and gloo's fixed cost per message
# is then a small part of a stage's work per micro-batch.
MICROBATCH_SIZE = 4
QUICK_MICROBATCH_SIZE = 2
# One warm-up step and 11 measured: each stage's medians settle within a
# few steps (section 13), and VGG-16's 64-example step at M = 16 takes
# about 2.5 s on 2 cores, so 5 repeats of the 12 cells fit in half an
# hour.
TRAIN_STEPS = 12
QUICK_TRAIN_STEPS = 4
# The goal: the measured bubble within 5 percentage points of theory.
THEORY_GOAL_POINTS = 0.05
PIPELINE, UNSPLIT = "pipeline", "unsplit"
SIDES = (PIPELINE, UNSPLIT)
PYTORCH = "pytorch"
FRAMEWORKS = (PYTORCH, tf_pipeline.TF_PROCESSES)
# Each framework's planning command, and its trainer as the pipeline cells
# start it: a launcher where the stages are processes it starts.
PLANNERS = {PYTORCH: "torch_parity.plan",
            tf_pipeline.TF_PROCESSES: "tfoverlap.plan"}


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  parser.add_argument("--models", default=None,
                      help="model=image_size,... (default: vgg16=32, "
                      "resnet50=32; --quick: small_cnn=8)")
  parser.add_argument("--microbatches", default=None,
                      help="Comma-separated M values (default: 4,8,16; "
                      "--quick: 2,4).")
  parser.add_argument("--microbatch_size", type=int, default=None,
                      help=f"Examples per micro-batch (default: "
                      f"{MICROBATCH_SIZE}; --quick: "
                      f"{QUICK_MICROBATCH_SIZE}).")
  parser.add_argument("--framework", default=PYTORCH, choices=FRAMEWORKS,
                      help="Whose stages: PyTorch's processes, or "
                      "TensorFlow's (--pipeline_runtime=processes).")
  return parser.parse_args()


def results_name(framework: str) -> str:
  return NAME if framework == PYTORCH else f"{NAME}_{framework}"


def settings(args) -> dict:
  """The grid and sizes of this run (full or --quick)."""
  quick = args.quick
  models = (pipeline_benchmark.parse_models(args.models) if args.models
            else dict(QUICK_MODELS if quick else FULL_MODELS))
  microbatches = (QUICK_MICROBATCHES if quick else FULL_MICROBATCHES)
  if args.microbatches:
    microbatches = [int(m) for m in args.microbatches.split(",")]
  microbatch_size = (args.microbatch_size
                     or (QUICK_MICROBATCH_SIZE if quick else MICROBATCH_SIZE))
  return {"models": models, "microbatches": list(microbatches),
          "microbatch_size": microbatch_size,
          "train_steps": QUICK_TRAIN_STEPS if quick else TRAIN_STEPS,
          "stages": STAGES, "framework": args.framework}


def _runtime_flags(framework: str) -> list:
  """What the pipeline cells, and the profile they cut from, add for the
  framework's runtime of stages as processes."""
  if framework == PYTORCH:
    return []  # a process per stage is PyTorch's only pipeline runtime
  # One inter-op thread: a stage server runs as many ops at once as the
  # client's inter-op setting allows, and with the default (the cores)
  # each stage would run two micro-batches at once on both cores, where
  # PyTorch's stage runs one on one thread.
  return ["--pipeline_runtime=processes", "--inter_op_threads=1"]


def cell_flags(cell: tuple, setting: dict, profiles: dict) -> list:
  """A cell's trainer flags: (model, side, M)."""
  model, side, m = cell
  common_flags = [f"--model={model}", "--dataset=synthetic",
                  f"--image_size={setting['models'][model]}",
                  f"--batch_size={m * setting['microbatch_size']}",
                  f"--train_steps={setting['train_steps']}"]
  if side == UNSPLIT:
    # The whole model in one process, on both cores.
    return [*common_flags, "--strategy=default", "--intra_op_threads=2"]
  return [*common_flags, "--strategy=mirrored",
          f"--num_devices={setting['stages']}", "--intra_op_threads=1",
          f"--pipeline_stages={setting['stages']}",
          f"--pipeline_microbatches={m}", "--pipeline_schedule=gpipe",
          "--pipeline_split=auto", f"--plan_profile={profiles[model]}",
          *_runtime_flags(setting["framework"])]


def launched(cell: tuple, framework: str) -> bool:
  """Whether a cell is a launcher's job: TensorFlow's pipeline, whose
  launcher starts the stage servers and the client."""
  return framework == tf_pipeline.TF_PROCESSES and cell[1] == PIPELINE


def cell_module(cell: tuple, framework: str) -> str:
  """The module a cell starts: its trainer, or its launcher."""
  if launched(cell, framework):
    return common.LAUNCHER_MODULES["tensorflow"]
  return common.TRAINER_MODULES[
      "pytorch" if framework == PYTORCH else "tensorflow"]


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  setting = settings(args)
  profiles = {}
  for model, image_size in setting["models"].items():
    # One profile per model, by the planning command, at the micro-batch
    # and up; the trainer cuts each M's split from it.
    out_dir = os.path.join(scratch, f"plan-{model}")
    smallest = setting["microbatches"][0]
    profiles[model] = pipeline_benchmark.plan_model(
        model, image_size, stages=setting["stages"],
        batch=smallest * setting["microbatch_size"],
        microbatches=smallest, out_dir=out_dir, quick=args.quick,
        planner=PLANNERS[args.framework],
        extra_flags=[*_runtime_flags(args.framework),
                     "--intra_op_threads=1"])["profile_path"]
  cells = [(model, side, m) for model in setting["models"]
           for m in setting["microbatches"] for side in SIDES]
  framework = setting["framework"]
  record = harness.run_trainer_cells(
      cells, repeats, scratch,
      module_of=lambda cell: cell_module(cell, framework),
      launcher_of=lambda cell: [] if launched(cell, framework) else None,
      flags_of=lambda cell: cell_flags(cell, setting, profiles),
      describe=lambda cell, result: (
          f"{' '.join(map(str, cell))}: "
          f"{result['samples_per_second']:.1f} samples/s"),
      redo_busy=args.redo_busy)
  return harness.Measured.of_group(record, setting=setting)


def _bubble_row(runs: list) -> dict:
  """The pipeline cell's bubble against theory, and its parts."""
  sections = [r["result"]["pipeline"] for r in runs]
  first = sections[0]
  theory = bubble_fraction_theory("gpipe", first["stages"],
                                  first["micro_batches"])
  measured = [s["bubble_fraction"] for s in sections]
  parts = {}
  for name in (*bubble_parts.PARTS, bubble_parts.RESIDUAL):
    values = [s["bubble_parts"]["summary"][f"{name}_fraction"]
              for s in sections if s["bubble_parts"]["summary"]]
    parts[name] = common.median(values) if values else None
  return {"theory": theory, "measured_all": measured,
          "measured": harness.median_interval(measured),
          # Within 5 points either way: a bubble far below theory would
          # say the measurement, not the schedule, is off.
          "points_from_theory": harness.judge(
              harness.median_interval([abs(m - theory) for m in measured]),
              THEORY_GOAL_POINTS),
          "points_over_theory_all": [m - theory for m in measured],
          "parts": parts,
          "slowest_over_mean": common.median(
              [pipeline_benchmark.imbalance(s) for s in sections]),
          "cut_layers": first["cut_layers"]}


def summarize(payload: dict) -> list:
  setting = payload["setting"]
  by_cell = {}
  for run in payload["runs"]:
    by_cell.setdefault(tuple(run["cell"]), []).append(run)
  rows = []
  for model in setting["models"]:
    for m in setting["microbatches"]:
      piped = by_cell[(model, PIPELINE, m)]
      unsplit = by_cell[(model, UNSPLIT, m)]
      sps = harness.values_by_side(
          piped + unsplit, lambda r: r["result"]["samples_per_second"],
          side_field="cell")
      rows.append({
          "model": model, "micro_batches": m,
          "batch_size": m * setting["microbatch_size"],
          **_bubble_row(piped),
          "pipeline_samples_per_second":
              common.median(sps[(model, PIPELINE, m)]),
          "unsplit_samples_per_second":
              common.median(sps[(model, UNSPLIT, m)]),
          "pipeline_over_unsplit": harness.summarize_ratios(
              sps[(model, PIPELINE, m)], sps[(model, UNSPLIT, m)])})
  return rows


def format_summary(payload: dict) -> str:
  rows = [[r["model"], r["micro_batches"], r["theory"],
           r["measured"]["median"],
           harness.describe(r["points_from_theory"]),
           r["parts"][bubble_parts.IMBALANCE],
           r["parts"][bubble_parts.RESIDUAL],
           r["pipeline_samples_per_second"],
           r["unsplit_samples_per_second"],
           harness.format_interval(r["pipeline_over_unsplit"])]
          for r in payload["summary"]]
  return common.format_table(
      ["model", "M", "theory", "bubble", "|bubble - theory| (goal <= 0.05)",
       "imbalance share", "residual share", "pipeline samples/s",
       "unsplit samples/s", "pipeline / unsplit"], rows)


def main():
  args = parse_args()
  harness.main(NAME, args, functools.partial(measure, args),
               default_repeats=DEFAULT_REPEATS, summarize=summarize,
               table=format_summary,
               results_name=results_name(args.framework))


if __name__ == "__main__":
  main()
