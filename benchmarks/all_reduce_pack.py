"""What the all-reduce pack size buys: DDP buckets, Horovod fusion, MWMS packs.

  python -m benchmarks.all_reduce_pack             # full run: DDP and Horovod
  python -m benchmarks.all_reduce_pack --sides=ddp,horovod,mwms
  python -m benchmarks.all_reduce_pack --quick     # smoke run

`--all_reduce_pack_mb=X` is one flag with one meaning in both frameworks:
gradients are all-reduced in messages of about X MB. Each side runs a
two-process job on this host, through the project's launchers, which give
every process an equal share of the cores (`--intra_op_threads` and
`--inter_op_threads` of 1 on 2 cores, OMP_NUM_THREADS for PyTorch):

  ddp      python -m torch_parity.launch --num_workers=2 --
           --strategy=multi_worker --all_reduce_pack_mb=X
           (DistributedDataParallel's bucket_cap_mb, over gloo)
  horovod  python -m torch_parity.launch --num_workers=2 --
           --strategy=horovod --all_reduce_pack_mb=X
           (HOROVOD_FUSION_THRESHOLD, horovodrun --gloo)
  mwms     python -m tfoverlap.launch --num_workers=2 --
           --all_reduce_pack_mb=X
           (MultiWorkerMirroredStrategy's CommunicationOptions.bytes_per_pack)

The model must have gradients spanning several packs: resnet18 has 11.2 M
parameters, 43 MB of float32 gradients. An explicit DDP bucket_cap_mb caps
every bucket, the first one included, so 1 MB makes dozens of buckets, 25
two and 100 one (DDP's own default, flag value 0, is a 25 MB cap with a
1 MB first bucket). Batches are resident on the device
(`--synthetic_on_device`), so the step is compute and communication only.

Each repeat runs every (side, X) once through `benchmarks.harness`, the
first (side, X) rotating from repeat to repeat. Reported per side and X:
median samples/s, compute p50 (forward, backward with the overlapped
all-reduce, update) and step p50; the throughput against the same side at
the reference X (`--reference_pack_mb`, default 25) and against DDP at the
same X, each as the median [min, max] of the per-repeat ratios with its
interval. Throughput and times are rank 0's (the chief's) run.json; the
samples are the global batch.
"""

import functools
import os

from benchmarks import common
from benchmarks import harness

NAME = "all_reduce_pack"
DEFAULT_REPEATS = 3
NUM_WORKERS = 2
SIDES = {
    "ddp": {"framework": "pytorch", "flags": ["--strategy=multi_worker"]},
    "horovod": {"framework": "pytorch", "flags": ["--strategy=horovod"]},
    # tfoverlap.launch sets --strategy=multi_worker itself.
    "mwms": {"framework": "tensorflow", "flags": []},
}
DEFAULT_SIDES = ("ddp", "horovod")
DEFAULT_PACK_MB = (1.0, 25.0, 100.0)
# A global batch of 16 (8 per process) keeps the computation short enough
# that the all-reduce is a sizeable part of the step, where its packing can
# show.
MODEL_FLAGS = ["--model=resnet18", "--dataset=synthetic", "--image_size=32",
               "--batch_size=16", "--synthetic_on_device"]
# Several seconds of steady state per run at a few hundred ms a step; 18
# runs of DDP and Horovod then fit about ten minutes on 2 quiet cores.
TRAIN_STEPS, QUICK_TRAIN_STEPS = 30, 8


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  common.add_list_arg(parser, "sides", default=DEFAULT_SIDES, allowed=SIDES,
                      what="sides")
  parser.add_argument("--pack_mb", default=",".join(
      f"{x:g}" for x in DEFAULT_PACK_MB),
                      help="Comma-separated --all_reduce_pack_mb values.")
  parser.add_argument("--reference_pack_mb", type=float, default=25.0,
                      help="The X every side's throughput is compared to.")
  parser.add_argument("--train_steps", type=int, default=None,
                      help=f"Steps per run (default {TRAIN_STEPS}, "
                      f"{QUICK_TRAIN_STEPS} with --quick).")
  return common.parse_with_trainer_flags(parser)


def parse_sides(text: str) -> list:
  sides = [s for s in text.split(",") if s]
  unknown = sorted(set(sides) - set(SIDES))
  if unknown or not sides:
    raise SystemExit(f"--sides={text}: allowed: a list of {list(SIDES)}")
  return sides


def parse_pack_mb(text: str) -> list:
  try:
    values = [float(v) for v in text.split(",") if v]
  except ValueError:
    values = []
  if not values or any(v <= 0 for v in values):
    raise SystemExit(f"--pack_mb={text}: allowed: a list of numbers > 0 "
                     "(0 would mean each framework's own default)")
  return values


def run_variant(side: str, pack_mb: float, flags: list, model_dir: str
                ) -> dict:
  framework = SIDES[side]["framework"]
  return common.run_trainer(
      [*flags, *SIDES[side]["flags"], f"--all_reduce_pack_mb={pack_mb:g}"],
      model_dir, module=common.LAUNCHER_MODULES[framework],
      launcher_flags=[f"--num_workers={NUM_WORKERS}"])


def _ratio_stats(values: list) -> dict:
  stats = {"per_repeat": values, "median": common.median(values),
           "min": min(values) if values else float("nan"),
           "max": max(values) if values else float("nan")}
  if values:
    stats["interval"] = harness.median_interval(values)
  return stats


def summarize(runs: list, sides: list, pack_mbs: list,
              reference_pack_mb: float) -> dict:
  """{side: {X: medians and ratios}}, X as the "%g" text of the pack size."""
  sps = {}  # (side, X, repeat) -> samples/s
  for r in runs:
    sps[(r["side"], r["pack_mb"], r["repeat"])] = (
        r["result"]["samples_per_second"])
  repeats = sorted({r["repeat"] for r in runs})
  summary = {}
  for side in sides:
    summary[side] = {}
    for pack_mb in pack_mbs:
      results = [r["result"] for r in runs
                 if r["side"] == side and r["pack_mb"] == pack_mb]
      if not results:
        continue
      entry = {
          "samples_per_second_median": common.median(
              [r["samples_per_second"] for r in results]),
          "samples_per_second_all": [r["samples_per_second"]
                                     for r in results],
          "compute_p50_ms_median": common.median(
              [r["compute"]["p50_ms"] for r in results]),
          "step_p50_ms_median": common.median(
              [r["step"]["p50_ms"] for r in results]),
          "data_wait_fraction_median": common.median(
              [r["data_wait"]["fraction"] for r in results]),
          "num_params": results[0].get("num_params"),
          "steal_s_all": [r.get("steal_s") for r in results],
          "foreign_cpu_s_all": [r.get("foreign_cpu_s") for r in results],
      }
      # Above 1: X trains faster than the reference X on the same side.
      entry["vs_reference_pack"] = _ratio_stats([
          sps[(side, pack_mb, k)] / sps[(side, reference_pack_mb, k)]
          for k in repeats
          if (side, pack_mb, k) in sps and (side, reference_pack_mb, k) in sps
      ])
      if side != "ddp":
        # Above 1: this side trains faster than DDP at the same X.
        entry["vs_ddp_same_pack"] = _ratio_stats([
            sps[(side, pack_mb, k)] / sps[("ddp", pack_mb, k)]
            for k in repeats
            if (side, pack_mb, k) in sps and ("ddp", pack_mb, k) in sps
        ])
      summary[side][f"{pack_mb:g}"] = entry
  return summary


def format_summary(summary: dict, reference_pack_mb: float) -> str:
  def ratio(stats):
    if not stats or not stats["per_repeat"]:
      return "-"
    return f"{stats['median']:.3f} [{stats['min']:.3f}, {stats['max']:.3f}]"

  rows = []
  for side, by_pack in summary.items():
    for pack, entry in by_pack.items():
      rows.append([side, pack, entry["samples_per_second_median"],
                   entry["compute_p50_ms_median"],
                   entry["step_p50_ms_median"],
                   ratio(entry["vs_reference_pack"]),
                   ratio(entry.get("vs_ddp_same_pack"))])
  return common.format_table(
      ["side", "pack MB", "samples/s", "compute p50 ms", "step p50 ms",
       f"vs {reference_pack_mb:g} MB same side", "vs ddp same MB"], rows)


def measure(args, passthrough, repeats: int, scratch_root: str
            ) -> harness.Measured:
  sides = parse_sides(args.sides)
  pack_mbs = parse_pack_mb(args.pack_mb)
  if args.reference_pack_mb not in pack_mbs:
    raise SystemExit(f"--reference_pack_mb={args.reference_pack_mb:g}: "
                     f"allowed: one of --pack_mb ({args.pack_mb})")
  train_steps = args.train_steps or (QUICK_TRAIN_STEPS if args.quick
                                     else TRAIN_STEPS)
  flags = [*MODEL_FLAGS, f"--train_steps={train_steps}", *passthrough]
  variants = [(side, pack_mb) for side in sides for pack_mb in pack_mbs]

  def run_one(variant, repeat):
    side, pack_mb = variant
    model_dir = os.path.join(scratch_root, f"{side}-{pack_mb:g}mb-{repeat}")
    result = run_variant(side, pack_mb, flags, model_dir)
    common.log(f"repeat {repeat + 1}/{repeats} {side} {pack_mb:g} MB: "
               f"{result['samples_per_second']:.1f} samples/s, compute "
               f"p50 {result['compute']['p50_ms']:.1f} ms")
    return {"side": side, "pack_mb": pack_mb, "repeat": repeat,
            "result": result}

  record = harness.run_interleaved(variants, repeats, run_one,
                                   redo_busy=args.redo_busy)
  return harness.Measured.of_group(
      record, num_workers=NUM_WORKERS, sides=sides,
      side_commands={
          side: (f"python -m {common.LAUNCHER_MODULES[spec['framework']]} "
                 f"--num_workers={NUM_WORKERS} -- "
                 + " ".join([*spec["flags"], "--all_reduce_pack_mb=X"]))
          for side, spec in SIDES.items() if side in sides},
      trainer_flags=flags, pack_mb=pack_mbs,
      reference_pack_mb=args.reference_pack_mb,
      quiet_trainer_flags=list(common.QUIET_TRAINER_FLAGS))


def main():
  args, passthrough = parse_args()
  harness.main(
      NAME, args, functools.partial(measure, args, passthrough),
      default_repeats=DEFAULT_REPEATS,
      summarize=lambda payload: summarize(
          payload["runs"], payload["sides"], payload["pack_mb"],
          payload["reference_pack_mb"]),
      table=lambda payload: format_summary(payload["summary"],
                                           payload["reference_pack_mb"]))


if __name__ == "__main__":
  main()
