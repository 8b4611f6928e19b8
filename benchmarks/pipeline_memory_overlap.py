"""1F1B's activation memory against GPipe's, and PP x DP's all-reduce
overlap, in PyTorch.

  python -m benchmarks.pipeline_memory_overlap            # full run
  python -m benchmarks.pipeline_memory_overlap --quick    # smoke run

Two questions, one results file:

  1. memory: 2 stages at M = 8 micro-batches under GPipe and under 1F1B;
     each stage's peak bytes of tensors saved for backward
     (run.json's `pipeline.per_stage[].saved_activation_peak_bytes`,
     counted exactly by saved-tensor hooks). GPipe holds all M
     micro-batches' activations before the first backward; 1F1B holds at
     most S - s on stage s. The goal, per stage: 1F1B over GPipe at most
     S / M, theory's bound for the first stage.
  2. overlap: 2 stages x 2 replicas (4 processes), each stage's
     gradients all-reduced over its replicas either bucket by bucket as
     the last micro-batch's backward makes them
     (--pipeline_overlap_all_reduce, the default) or after the schedule's
     step (=false). Per stage, the exposed all-reduce per step
     (`exposed_comm_ms`), and the step's samples/s, paired by repeat.

Every cell is one trainer run (`torch_parity.train`), interleaved through
`benchmarks.harness`.
"""

import functools

from benchmarks import common
from benchmarks import harness

NAME = "pipeline_memory_overlap"
DEFAULT_REPEATS = 5
STAGES = 2
MEMORY_MICROBATCHES = 8
# Memory: ResNet-18 at 32 px, whose saved activations dwarf the weights.
MEMORY_JOB = ["--model=resnet18", "--image_size=32",
              f"--batch_size={MEMORY_MICROBATCHES * 4}"]
# Overlap: the 6M-parameter MLP (25 MB of gradients), so that a stage's
# all-reduce over gloo takes milliseconds, not the noise's microseconds.
OVERLAP_JOB = ["--model=mlp", "--image_size=64", "--batch_size=32"]
OVERLAP_MICROBATCHES = 4
SCHEDULES = ("gpipe", "1f1b")
OVERLAP = ("true", "false")
MEMORY, OVERLAP_CELL = "memory", "overlap"


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  return parser.parse_args()


def cell_flags(cell: tuple, train_steps: int) -> list:
  """(question, variant)'s trainer flags."""
  question, variant = cell
  common_flags = ["--dataset=synthetic", "--synthetic_on_device",
                  "--strategy=mirrored", f"--pipeline_stages={STAGES}",
                  # Neither question depends on where the cut falls.
                  "--pipeline_split=even", "--intra_op_threads=1",
                  f"--train_steps={train_steps}"]
  if question == MEMORY:
    return [*common_flags, *MEMORY_JOB, f"--num_devices={STAGES}",
            f"--pipeline_microbatches={MEMORY_MICROBATCHES}",
            f"--pipeline_schedule={variant}"]
  return [*common_flags, *OVERLAP_JOB, f"--num_devices={2 * STAGES}",
          f"--pipeline_microbatches={OVERLAP_MICROBATCHES}",
          f"--pipeline_overlap_all_reduce={variant}"]


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  train_steps = 4 if args.quick else 12
  cells = ([(MEMORY, s) for s in SCHEDULES]
           + [(OVERLAP_CELL, o) for o in OVERLAP])
  record = harness.run_trainer_cells(
      cells, repeats, scratch, module_of=lambda cell: "torch_parity.train",
      flags_of=lambda cell: cell_flags(cell, train_steps),
      describe=lambda cell, result: (
          f"{' '.join(cell)}: {result['samples_per_second']:.1f} samples/s"),
      redo_busy=args.redo_busy)
  return harness.Measured.of_group(record, train_steps=train_steps)


def _stage_values(runs: list, key: str) -> list:
  """Per stage, its value in every run."""
  stages = len(runs[0]["result"]["pipeline"]["per_stage"])
  return [[r["result"]["pipeline"]["per_stage"][k][key] for r in runs]
          for k in range(stages)]


def summarize(payload: dict) -> dict:
  by_cell = {}
  for run in payload["runs"]:
    by_cell.setdefault(tuple(run["cell"]), []).append(run)
  gpipe = _stage_values(by_cell[(MEMORY, "gpipe")],
                        "saved_activation_peak_bytes")
  one_f = _stage_values(by_cell[(MEMORY, "1f1b")],
                        "saved_activation_peak_bytes")
  bound = STAGES / MEMORY_MICROBATCHES
  memory = []
  for stage, (g_bytes, f_bytes) in enumerate(zip(gpipe, one_f)):
    ratio = common.median(f_bytes) / common.median(g_bytes)
    memory.append({"stage": stage, "gpipe_bytes": common.median(g_bytes),
                   "one_f_one_b_bytes": common.median(f_bytes),
                   "ratio": ratio, "bound": bound,
                   "verdict": "met" if ratio <= bound else "missed"})
  overlap = {}
  for variant in OVERLAP:
    runs = by_cell[(OVERLAP_CELL, variant)]
    overlap[variant] = {
        "exposed_comm_ms": [harness.median_interval(values) for values in
                            _stage_values(runs, "exposed_comm_ms")],
        "samples_per_second": harness.median_interval(
            [r["result"]["samples_per_second"] for r in runs])}
  sps = harness.values_by_side(
      by_cell[(OVERLAP_CELL, "true")] + by_cell[(OVERLAP_CELL, "false")],
      lambda r: r["result"]["samples_per_second"], side_field="cell")
  return {"memory": memory, "overlap": overlap,
          "overlapped_over_after_step": harness.summarize_ratios(
              sps[(OVERLAP_CELL, "true")], sps[(OVERLAP_CELL, "false")])}


def format_summary(payload: dict) -> str:
  summary = payload["summary"]
  memory = common.format_table(
      ["stage", "GPipe saved bytes", "1F1B saved bytes", "1F1B / GPipe",
       f"goal <= S/M = {STAGES}/{MEMORY_MICROBATCHES}", "verdict"],
      [[m["stage"], m["gpipe_bytes"], m["one_f_one_b_bytes"], m["ratio"],
        m["bound"], m["verdict"]] for m in summary["memory"]])
  rows = []
  for variant, entry in summary["overlap"].items():
    for stage, exposed in enumerate(entry["exposed_comm_ms"]):
      rows.append([variant, stage, harness.format_interval(exposed),
                   harness.format_interval(entry["samples_per_second"])])
  overlap = common.format_table(
      ["overlap_all_reduce", "stage", "exposed all-reduce ms per step",
       "samples/s"], rows)
  return (memory + "\n\n" + overlap + "\n\noverlapped / after the step, "
          "samples/s: " + harness.format_interval(
              summary["overlapped_over_after_step"]))


def main():
  args = parse_args()
  harness.main(NAME, args, functools.partial(measure, args),
               default_repeats=DEFAULT_REPEATS, summarize=summarize,
               table=format_summary)


if __name__ == "__main__":
  main()
