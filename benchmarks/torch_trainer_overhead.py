"""How much slower the PyTorch trainer is than a plain PyTorch loop.

  python -m benchmarks.torch_trainer_overhead            # full run, CPU presets
  python -m benchmarks.torch_trainer_overhead --quick    # smoke run

The PyTorch counterpart of `benchmarks.trainer_overhead`. Two sides train
the same model on the same input with the same optimizer for the same
steps:

  plain_loop    benchmarks.plain_torch_loop: next, zero_grad, forward,
                loss, backward, step; a clock read after every step
  torch_parity  python -m torch_parity.train with the quiet flags
                (`common.QUIET_TRAINER_FLAGS`): the ledger, the loop's
                bookkeeping and run.json stay, the optional outputs go

Both leave out the same warm-up steps and chain each step to the previous
one's end, so both measure the same steady-state step. The target is on the
ratio of medians of the steady-state step time: each run's median step
(p50), its median over repeats per side, trainer over plain. Above 1 the
trainer is slower; the target is at most 1.02. The same ratio from the mean
step (samples/s) is reported beside it, with the per-repeat ratios, their
range and the ratio of each side's fastest repeat. The verdict comes from
`benchmarks.harness`: the interval of the median per-repeat p50 ratio
against 1.02 (met, missed, or noisy when it crosses).

Where the difference goes (`gap`): both sides time their wait for the
batch (the trainer's `data_wait`, the plain loop's `next`), and the
trainer's ledger records the time between its phases, its own
bookkeeping, as `other`. Means add up where medians do not, so the
per-repeat difference of the mean step splits exactly into the wait's
difference, the trainer's `other`, and the rest: the step's own work
(forward, backward, update, and the span's clock reads).

Each repeat runs both sides of every preset, through `harness`: the
(preset, side) cell that goes first rotates from repeat to repeat. With
--sides_in=one_process (the default) every run of a preset's two sides
happens in one process that serves them (`benchmarks.in_process_sides`):
separate processes differ in speed by themselves, on a 2-core host by
more than the target. --sides_in=processes starts each run as a process
of its own, as a user does. Any further --flag=value goes to both sides.
"""

import functools
import os
from typing import Optional

from benchmarks import common
from benchmarks import harness
from benchmarks import in_process_sides

NAME = "torch_trainer_overhead"
TARGET_MAX_OVERHEAD_FRAC = 0.02
DEFAULT_REPEATS = 3
SIDES = ("plain_loop", "torch_parity")

# The data of the trainer's main job (digits through the DataLoader), and
# resident synthetic batches (no input work at all); one process each, the
# plain loop having no DDP. Steps give several seconds of steady state.
PRESETS = common.TRAINER_PRESETS


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  parser.add_argument("--configs", default=",".join(PRESETS),
                      help="Comma-separated presets: " + ", ".join(PRESETS)
                      + "; on a GPU also "
                      + ", ".join(common.GPU_TRAINER_PRESETS))
  parser.add_argument("--train_steps", type=int, default=None,
                      help="Steps per run for every preset (default: the "
                      "preset's own; its first tenth, at most 10, is "
                      "warm-up).")
  in_process_sides.add_sides_in_arg(parser)
  return common.parse_with_trainer_flags(parser)


def build_configs(args, passthrough) -> dict:
  configs = common.build_preset_configs(args.configs, passthrough,
                                        quick=args.quick)
  if args.train_steps:
    for config in configs.values():
      config["train_steps"] = args.train_steps
  return configs


def run_side(side: str, flags: list, scratch: str,
             processes: Optional[in_process_sides.SideProcesses] = None
             ) -> dict:
  """One run of one side: in `processes` where given, else in a process
  of its own."""
  if processes is not None:
    return processes.run(flags, side, os.path.join(scratch, "model_dir"))
  if side == "plain_loop":
    result_json = os.path.join(scratch, "plain.json")
    result, process = common.run_process_json(
        ["-m", "benchmarks.plain_torch_loop", *flags,
         f"--result_json={result_json}"], result_json)
    result.update(common.process_stats(process))
    return result
  return common.run_trainer(flags, os.path.join(scratch, "model_dir"),
                            module=common.TRAINER_MODULES["pytorch"])


def step_ms(result: dict) -> dict:
  """The steady-state step of one run: its median and its mean."""
  return {"p50": result["step"]["p50_ms"], "mean": result["step"]["mean_ms"]}


def gap(runs: list):
  """The trainer's extra mean step over the plain loop's, split into its
  parts, each the median over repeats of the paired difference (ms): the
  wait for the batch, the trainer's bookkeeping (`other`, which the plain
  loop has none of) and the step's own work (what is left). None for
  results whose plain loop did not time its wait."""
  plain = {r["repeat"]: r["result"] for r in runs if r["side"] == "plain_loop"}
  pairs = [(r["result"], plain[r["repeat"]]) for r in runs
           if r["side"] == "torch_parity" and r["repeat"] in plain]
  if not pairs or any("data_wait" not in p for _, p in pairs):
    return None
  parts = {"step": [], "data_wait": [], "bookkeeping": [], "step_work": []}
  for trainer, plain_run in pairs:
    step = trainer["step"]["mean_ms"] - plain_run["step"]["mean_ms"]
    wait = trainer["data_wait"]["mean_ms"] - plain_run["data_wait"]["mean_ms"]
    bookkeeping = trainer["other"]["mean_ms"]
    parts["step"].append(step)
    parts["data_wait"].append(wait)
    parts["bookkeeping"].append(bookkeeping)
    parts["step_work"].append(step - wait - bookkeeping)
  plain_step_ms = common.median([p["step"]["mean_ms"] for _, p in pairs])
  return {"plain_step_mean_ms": plain_step_ms,
          **{name: {"median_ms": common.median(values), "all_ms": values}
             for name, values in parts.items()}}


def summarize(runs: list) -> dict:
  by_side = {s: [r for r in runs if r["side"] == s] for s in SIDES}
  summary = {"sides": {}}
  for side, side_runs in by_side.items():
    steps = [step_ms(r["result"]) for r in side_runs]
    summary["sides"][side] = {
        "step_p50_ms_median": common.median([s["p50"] for s in steps]),
        "step_p50_ms_best": min(s["p50"] for s in steps),
        "step_p50_ms_all": [s["p50"] for s in steps],
        "step_mean_ms_median": common.median([s["mean"] for s in steps]),
        "samples_per_second_median": common.median(
            [r["result"]["samples_per_second"] for r in side_runs]),
        "samples_per_second_all": [r["result"]["samples_per_second"]
                                   for r in side_runs],
        "steal_s_all": [r["result"].get("steal_s") for r in side_runs],
        "foreign_cpu_s_all": [r["result"].get("foreign_cpu_s")
                              for r in side_runs],
    }
  plain_entry = summary["sides"]["plain_loop"]
  trainer_entry = summary["sides"]["torch_parity"]
  ratios = {}
  for stat in ("p50", "mean"):
    # > 1: the trainer takes longer per step than the plain loop.
    times = harness.values_by_side(
        runs, lambda r, s=stat: step_ms(r["result"])[s])
    interval = harness.summarize_ratios(times["torch_parity"],
                                        times["plain_loop"])
    per_repeat = interval["per_repeat"]
    of_medians = (trainer_entry[f"step_{stat}_ms_median"] /
                  plain_entry[f"step_{stat}_ms_median"])
    ratios[stat] = {
        "time_ratio_of_medians": of_medians,
        "per_repeat": per_repeat,
        "per_repeat_median": common.median(per_repeat),
        "per_repeat_min": min(per_repeat),
        "per_repeat_max": max(per_repeat),
        "per_repeat_interval": interval,
    }
  ratios["p50"]["time_ratio_of_best_repeats"] = (
      trainer_entry["step_p50_ms_best"] / plain_entry["step_p50_ms_best"])
  summary["time_ratio"] = ratios
  summary["gap"] = gap(runs)
  judged = harness.judge(ratios["p50"]["per_repeat_interval"],
                         1.0 + TARGET_MAX_OVERHEAD_FRAC, harness.AT_MOST)
  summary["target"] = {
      "max_overhead_frac": TARGET_MAX_OVERHEAD_FRAC,
      "on": "median of the per-repeat ratios of the steady-state step p50",
      "overhead_frac": judged["median"] - 1.0,
      "judged": judged,
      "verdict": judged["verdict"],
  }
  return summary


def format_summary(configs: dict, summaries: dict) -> str:
  rows = []
  for name in configs:
    summary = summaries[name]
    plain = summary["sides"]["plain_loop"]
    trainer = summary["sides"]["torch_parity"]
    p50, mean = summary["time_ratio"]["p50"], summary["time_ratio"]["mean"]
    rows.append([
        name, plain["step_p50_ms_median"], trainer["step_p50_ms_median"],
        p50["time_ratio_of_medians"],
        harness.format_interval(p50["per_repeat_interval"]),
        p50["time_ratio_of_best_repeats"], mean["time_ratio_of_medians"],
        summary["target"]["verdict"]])
  return common.format_table(
      ["config", "plain p50 ms", "trainer p50 ms", "p50 ratio of medians",
       "per-repeat median [interval]", "best-of-repeats", "mean ratio",
       "target <= 1.02"], rows)


def measure(args, passthrough, repeats: int, scratch_root: str
            ) -> harness.Measured:
  configs = build_configs(args, passthrough)

  def describe(result):
    return (f"step p50 {result['step']['p50_ms']:.2f} ms, "
            f"{result['samples_per_second']:.1f} samples/s")

  with in_process_sides.open_side_processes(scratch_root,
                                           args.sides_in) as processes:
    def run_config_side(name, side, scratch):
      config = configs[name]
      return run_side(
          side, [*config["flags"], f"--train_steps={config['train_steps']}"],
          scratch, processes)

    return harness.measure_config_sides(
        configs, repeats, scratch_root, sides_of=lambda name: SIDES,
        run_side=run_config_side, describe=describe,
        redo_busy=args.redo_busy, sides_in=args.sides_in)


def main():
  args, passthrough = parse_args()
  harness.main_per_config(
      NAME, args, functools.partial(measure, args, passthrough),
      default_repeats=DEFAULT_REPEATS, summarize_runs=summarize,
      format_summary=format_summary)


if __name__ == "__main__":
  main()
