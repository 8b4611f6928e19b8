"""TensorFlow against PyTorch pipelines on the same plan; bubble against theory.

  python -m benchmarks.tf_pipeline --quick            # smoke: mechanics only
  python -m benchmarks.tf_pipeline                    # S = 2, M = S..8S
  python -m benchmarks.tf_pipeline --stages=4 --image_size=64

Both trainers run VGG-16 on resident synthetic images as S GPipe stages
(`--strategy=mirrored --num_devices=S --pipeline_stages=S`), cut after the
same layers: VGG-16's max-pooling layers keep torchvision's indices in both
zoos (Keras "features_16" is torch "features.16"), so the two frameworks
run the same plan. For M = S, 2S, 4S, 8S micro-batches (S and 2S with
--quick) each run reports throughput and its run.json `pipeline` section:
the measured bubble fraction beside GPipe's (S - 1) / (M + S - 1), and per
stage the compute, transfer and bubble ms. Three sides:

  tensorflow            the stages in one process on S devices (logical
                        CPUs on a host without GPUs, which share one
                        thread pool, so little overlap is possible there);
                        its bubble is derived from stages timed alone.
  tensorflow_processes  --pipeline_runtime=processes through
                        `tfoverlap.launch`: each stage a TensorFlow server
                        process of one intra-op thread, driven by one
                        client; its bubble is measured on each stage.
  pytorch               one process per stage.

Every framework and M runs once per repeat through `benchmarks.harness`
(interleaved, the first side rotating, the host's load recorded); medians
carry their intervals, and TensorFlow over PyTorch throughput is the median
of the per-repeat ratios.
"""

import os
import tempfile
import time

from benchmarks import common
from benchmarks import harness

NAME = "tf_pipeline"
# Five repeats: the fewest whose order-statistics interval of a median
# reaches the harness's 90% (see benchmarks.harness.median_interval).
DEFAULT_REPEATS = 5
# VGG-16's pooling layers, by torchvision index: a cut after one of them is
# the same place in both zoos.
_CUTS = {2: (16,), 3: (9, 23), 4: (9, 16, 23)}
_SEPARATOR = {"tensorflow": "_", "pytorch": "."}
TF_PROCESSES = "tensorflow_processes"
FRAMEWORKS = ("tensorflow", TF_PROCESSES, "pytorch")


def _parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS)
  parser.add_argument("--stages", type=int, default=2, choices=sorted(_CUTS))
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--microbatch_size", type=int, default=4,
                      help="Samples per micro-batch; the batch is M times it.")
  parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                      help="Sides, a comma-separated subset of "
                      f"{','.join(FRAMEWORKS)}.")
  args = parser.parse_args()
  unknown = set(args.frameworks.split(",")) - set(FRAMEWORKS)
  if unknown or not args.frameworks:
    parser.error(f"--frameworks={args.frameworks}: allowed: a "
                 f"comma-separated subset of {','.join(FRAMEWORKS)}")
  return args


def _flags(framework: str, stages: int, microbatches: int, args,
           train_steps: int):
  if framework == TF_PROCESSES:
    # A process per stage, each on one thread, as PyTorch's stages are.
    # Inter-op too: a stage server's ops run on a pool sized by the
    # client's inter-op setting (benchmarks.pipeline_bubble says why).
    return [*_flags("tensorflow", stages, microbatches, args, train_steps),
            "--pipeline_runtime=processes", "--intra_op_threads=1",
            "--inter_op_threads=1"]
  cuts = ",".join(f"features{_SEPARATOR[framework]}{i}"
                  for i in _CUTS[stages])
  return ["--model=vgg16", "--dataset=synthetic", "--synthetic_on_device",
          f"--image_size={args.image_size}",
          # One pipeline takes the whole batch: M micro-batches of the size
          # asked. (The run BENCHMARKS.md section 14 records used S times
          # this batch, so its micro-batches held S times the size asked.)
          f"--batch_size={microbatches * args.microbatch_size}",
          "--strategy=mirrored", f"--num_devices={stages}",
          f"--pipeline_stages={stages}",
          f"--pipeline_microbatches={microbatches}",
          f"--pipeline_split={cuts}", f"--train_steps={train_steps}"]


def _run(framework: str, flags, model_dir: str) -> dict:
  if framework == TF_PROCESSES:
    # The launcher starts the stage servers and the client.
    record, stats = common.run_trainer_record(
        flags, model_dir, module="tfoverlap.launch", launcher_flags=[])
  else:
    record, stats = common.run_trainer_record(
        flags, model_dir, module=common.TRAINER_MODULES[framework])
  section = record.get("pipeline") or {}
  return {"samples_per_second": record["samples_per_second"],
          "bubble_fraction": section.get("bubble_fraction"),
          "bubble_fraction_theory": section.get("bubble_fraction_theory"),
          "per_stage": section.get("per_stage"),
          "sources": section.get("sources"),
          **stats}


def _median_or_none(values):
  values = [v for v in values if v is not None]
  return harness.median_interval(values) if values else None


def summarize(runs: list, frameworks: list, micro_batches: list) -> dict:
  """Per M: each framework's throughput and bubble, and TensorFlow over
  PyTorch throughput paired within each repeat."""
  summary = {}
  for m in micro_batches:
    entry = {}
    throughput = {}
    for framework in frameworks:
      mine = [r for r in runs if r["side"] == [framework, m]]
      throughput[framework] = [r["samples_per_second"] for r in mine]
      entry[framework] = {
          "samples_per_second": harness.median_interval(
              throughput[framework]),
          "bubble_fraction": _median_or_none(
              [r["bubble_fraction"] for r in mine]),
          "bubble_fraction_theory": mine[0]["bubble_fraction_theory"]}
    for tf_side in ("tensorflow", TF_PROCESSES):
      if tf_side in frameworks and "pytorch" in frameworks:
        entry[f"{tf_side}_over_pytorch"] = harness.summarize_ratios(
            throughput[tf_side], throughput["pytorch"])
    summary[f"M={m}"] = entry
  return summary


def _format(summary: dict, frameworks: list) -> str:
  rows = []
  for key, entry in summary.items():
    for framework in frameworks:
      side = entry[framework]
      rows.append([f"{framework}/{key}",
                   harness.format_interval(side["samples_per_second"]),
                   "-" if side["bubble_fraction"] is None
                   else harness.format_interval(side["bubble_fraction"]),
                   "-" if side["bubble_fraction_theory"] is None
                   else side["bubble_fraction_theory"]])
    for tf_side in ("tensorflow", TF_PROCESSES):
      if f"{tf_side}_over_pytorch" in entry:
        rows.append([f"{tf_side}/pytorch {key}", harness.format_interval(
            entry[f"{tf_side}_over_pytorch"]), "", ""])
  return common.format_table(
      ["framework/M", "samples/s", "bubble measured", "bubble theory"], rows)


def main():
  args = _parse_args()
  repeats = common.resolve_repeats(args, DEFAULT_REPEATS)
  frameworks = args.frameworks.split(",")
  stages = args.stages
  micro_batches = [f * stages for f in ((1, 2) if args.quick
                                        else (1, 2, 4, 8))]
  train_steps = 6 if args.quick else 20
  machine = common.describe_machine()  # the load average before the runs
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as scratch:

    def run_side(side, repeat):
      framework, m = side
      result = _run(framework, _flags(framework, stages, m, args,
                                      train_steps),
                    os.path.join(scratch, f"{repeat}-{framework}-{m}"))
      common.log(f"repeat {repeat + 1}/{repeats} {framework} M={m}: "
                 f"{result['samples_per_second']:.1f} samples/s")
      return {"side": [framework, m], "repeat": repeat, **result}

    record = harness.run_interleaved(
        [(framework, m) for m in micro_batches for framework in frameworks],
        repeats, run_side,
        redo_busy=args.redo_busy)
  summary = summarize(record["runs"], frameworks, micro_batches)
  print(_format(summary, frameworks))
  payload = {"benchmark": NAME, "command": common.command_line(),
             "machine": machine, "quick": args.quick,
             "repeats": repeats, "stages": stages,
             "cut_pool_indices": list(_CUTS[stages]),
             "image_size": args.image_size,
             "microbatch_size": args.microbatch_size,
             "train_steps": train_steps, "results": summary,
             "runs": record["runs"],
             "total_wall_s": time.perf_counter() - start,
             **harness.payload_fields({"runs": record["host"]})}
  path = common.result_path(NAME, args)
  common.write_results(path, payload)
  print(f"results: {os.path.relpath(path, common.REPO_ROOT)}")


if __name__ == "__main__":
  main()
