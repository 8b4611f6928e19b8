"""TensorFlow against PyTorch: the two trainers on identical flags.

  python -m benchmarks.framework_parity            # full run, CPU presets
  python -m benchmarks.framework_parity --quick    # smoke run
  python -m benchmarks.framework_parity --intra_op_threads=1 \
      --inter_op_threads=1                          # one thread each

Each run is `python -m tfoverlap.train` or `python -m torch_parity.train`
with the same flags (plus the quiet ones of `common.QUIET_TRAINER_FLAGS`),
each in its own process. Both write the same run.json schema, so both sides
are read the same way: samples_per_second over the steady-state steps, and
each phase's p50, mean and fraction of the step.

Each repeat runs every preset in both frameworks, through
`benchmarks.harness`: the (preset, framework) cell that goes first rotates
from repeat to repeat. Reported per preset: the median samples/s of each
framework, the PyTorch/TensorFlow throughput ratio as the median of the
per-repeat ratios (above 1: PyTorch is faster) with its range and its
interval, and the per-phase medians side by side.

Any further --flag=value is passed to both trainers in every preset. On a
host whose cores other processes are using too, PyTorch with its default
intra-op pool (one thread per core) ran several times slower than with one
thread, while TensorFlow did not (BENCHMARKS.md, section 6); one thread
each keeps that out of the comparison.
"""

import functools

from benchmarks import common
from benchmarks import harness

NAME = "framework_parity"
DEFAULT_REPEATS = 3
FRAMEWORKS = ("tensorflow", "pytorch")
PHASES = ("data_wait", "compute", "checkpoint_stall", "other", "step")

# Steps give each run a steady state of several seconds on 2 shared cores
# (small_cnn takes 20-160 ms a step there, resnet18 at 32x32 0.2-0.9 s,
# depending on the load), so three interleaved repeats of both presets fit
# about ten minutes.
PRESETS = common.TRAINER_PRESETS


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  common.add_list_arg(parser, "configs", default=PRESETS, allowed=PRESETS,
                      what="presets")
  return common.parse_with_trainer_flags(parser)


def build_configs(args, passthrough) -> dict:
  return common.build_preset_configs(args.configs, passthrough,
                                     quick=args.quick)


def summarize(runs: list) -> dict:
  """Per-framework medians, the per-phase table and the throughput ratio."""
  by_framework = {f: [r for r in runs if r["framework"] == f]
                  for f in FRAMEWORKS}
  summary = {"frameworks": {}}
  for framework, framework_runs in by_framework.items():
    results = [r["result"] for r in framework_runs]
    if not results:
      continue
    sps = [r["samples_per_second"] for r in results]
    summary["frameworks"][framework] = {
        "samples_per_second_median": common.median(sps),
        "samples_per_second_best": max(sps),
        "samples_per_second_all": sps,
        "phases": {
            phase: {stat: common.median([r[phase][stat] for r in results])
                    for stat in ("p50_ms", "mean_ms", "fraction")}
            for phase in PHASES
        },
        "train_loss_median": common.median(
            [r["final"].get("train_loss", float("nan")) for r in results]),
        "num_params": results[0].get("num_params"),
        "process_wall_s_median": common.median(
            [r["process_wall_s"] for r in results]),
        "steal_s_all": [r.get("steal_s") for r in results],
        "foreign_cpu_s_all": [r.get("foreign_cpu_s") for r in results],
    }
  if len(summary["frameworks"]) == len(FRAMEWORKS):
    sps = harness.values_by_side(
        runs, lambda r: r["result"]["samples_per_second"],
        side_field="framework")
    interval = harness.summarize_ratios(sps["pytorch"], sps["tensorflow"])
    per_repeat = interval["per_repeat"]
    tf_entry = summary["frameworks"]["tensorflow"]
    torch_entry = summary["frameworks"]["pytorch"]
    summary["torch_over_tf_samples_per_second"] = {
        # Above 1: PyTorch trains more samples per second.
        "per_repeat": per_repeat,
        "median": common.median(per_repeat),
        "min": min(per_repeat),
        "max": max(per_repeat),
        "interval": interval,
        "of_medians": (torch_entry["samples_per_second_median"] /
                       tf_entry["samples_per_second_median"]),
        "of_best_repeats": (torch_entry["samples_per_second_best"] /
                            tf_entry["samples_per_second_best"]),
    }
  return summary


def format_summary(configs: dict, summaries: dict) -> str:
  throughput_rows, phase_rows = [], []
  for name in configs:
    summary = summaries[name]
    frameworks = summary["frameworks"]
    ratio = summary.get("torch_over_tf_samples_per_second")
    throughput_rows.append([
        name,
        frameworks.get("tensorflow", {}).get("samples_per_second_median", "-"),
        frameworks.get("pytorch", {}).get("samples_per_second_median", "-"),
        (f"{ratio['median']:.3f} [{ratio['min']:.3f}, {ratio['max']:.3f}]; "
         + harness.format_interval(ratio["interval"])
         if ratio and "interval" in ratio else "-"),
    ])
    for phase in PHASES:
      row = [name, phase]
      for framework in FRAMEWORKS:
        stats = frameworks.get(framework, {}).get("phases", {}).get(phase)
        row += ([stats["p50_ms"], stats["mean_ms"],
                 f"{100 * stats['fraction']:.1f}%"] if stats
                else ["-", "-", "-"])
      phase_rows.append(row)
  throughput = common.format_table(
      ["config", "TF samples/s", "torch samples/s",
       "torch/TF per-repeat median [min, max]; [interval]"], throughput_rows)
  phases = common.format_table(
      ["config", "phase", "TF p50 ms", "TF mean ms", "TF share",
       "torch p50 ms", "torch mean ms", "torch share"], phase_rows)
  return throughput + "\n\n" + phases


def measure(args, passthrough, repeats: int, scratch_root: str
            ) -> harness.Measured:
  configs = build_configs(args, passthrough)

  def run_side(name, framework, model_dir):
    config = configs[name]
    return common.run_trainer(
        [*config["flags"], f"--train_steps={config['train_steps']}"],
        model_dir, module=common.TRAINER_MODULES[framework])

  return harness.measure_config_sides(
      configs, repeats, scratch_root, sides_of=lambda name: FRAMEWORKS,
      run_side=run_side,
      describe=lambda result: f"{result['samples_per_second']:.1f} samples/s",
      redo_busy=args.redo_busy, side_field="framework",
      trainer_modules=common.TRAINER_MODULES)


def main():
  args, passthrough = parse_args()
  harness.main_per_config(
      NAME, args, functools.partial(measure, args, passthrough),
      default_repeats=DEFAULT_REPEATS, summarize_runs=summarize,
      format_summary=format_summary)


if __name__ == "__main__":
  main()
