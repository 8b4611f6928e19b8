"""The trainers against the user's plain loop, on the user's own model.

  python -m benchmarks.user_model_overhead            # full run
  python -m benchmarks.user_model_overhead --quick    # smoke run

Sections 1 and 7 measure the trainers on the zoo's models. Here the model
and the data are the examples' (`examples/`), named on the command line as
a user names theirs (`--model=package.module:callable`,
`--dataset=package.module:callable`), and every side loads them through
the trainers' own loading code:

  keras_regression  a functional Keras model, a regression (mean squared
                    error), on its own tf.data function:
                    plain_fit (`benchmarks.plain_keras_fit`: model.compile
                    + model.fit) against tfoverlap_ctl and tfoverlap_fit
                    (`tfoverlap.train --loop=ctl|fit`), compared as in
                    `benchmarks.trainer_overhead`: steady-state samples/s
  torch_module      an nn.Module classifier on its own map-style Dataset:
                    plain_loop (`benchmarks.plain_torch_loop`) against
                    torch_parity (`torch_parity.train`), compared as in
                    `benchmarks.torch_trainer_overhead`: the steady-state
                    step p50

Every side trains with the quiet trainer flags
(`common.QUIET_TRAINER_FLAGS`) and the default strategy (the plain
baselines have no multi-process path). Each example's sides run every
repeat in one process that serves them (`benchmarks.in_process_sides`;
`--sides_in=processes` starts each run as a process of its own), so that
a process's own speed, which differs from process to process by more
than the target, is the same on every side. Every cell (example,
side) runs once per repeat, the first cell rotating from repeat to repeat
(`benchmarks.harness`), so each example's sides run within a minute of each
other. The target is at most 2% more time per step than the plain side:
the median of the per-repeat time ratios, with its interval, judged by
`harness.verdict` (met, missed, or noisy when the interval crosses 1.02).

Any further --flag=value goes to every side of both examples, e.g.
`--intra_op_threads=1 --inter_op_threads=1`.
"""

import functools
from typing import Optional

from benchmarks import common
from benchmarks import harness
from benchmarks import in_process_sides
from benchmarks import torch_trainer_overhead
from benchmarks import trainer_overhead

NAME = "user_model_overhead"
TARGET_MAX_OVERHEAD_FRAC = 0.02
DEFAULT_REPEATS = 5

# The examples' own README flags, on one process. Steps give each run a
# few seconds of steady state on 2 CPU cores (a step of either takes a few
# ms on a quiet host, 15-20 on a loaded one) while 5 repeats of the 5
# cells, each paying its process's start-up (5-12 s), stay within about 8
# minutes on a quiet host.
EXAMPLES = {
    "keras_regression": {
        "framework": "tensorflow",
        "flags": ["--model=examples.keras_regression.model:build",
                  "--dataset=examples.keras_regression.data:load",
                  "--batch_size=64", "--strategy=default"],
        "sides": list(trainer_overhead.SIDES),
        "train_steps": 3000, "quick_train_steps": 12,
    },
    "torch_module": {
        "framework": "pytorch",
        "flags": ["--model=examples.torch_module.model:build",
                  "--dataset=examples.torch_module.data:load",
                  "--image_size=16", "--batch_size=32",
                  "--strategy=default"],
        "sides": list(torch_trainer_overhead.SIDES),
        "train_steps": 2000, "quick_train_steps": 12,
    },
}
# What each framework's comparison is judged on, as its own driver does.
MEASURES = {"tensorflow": "samples/s", "pytorch": "step p50 ms"}


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  common.add_list_arg(parser, "examples", default=EXAMPLES, allowed=EXAMPLES,
                      what="examples")
  parser.add_argument("--train_steps", type=int, default=None,
                      help="Steps per run for every example (default: the "
                      "example's own; its first tenth, at most 10, is "
                      "warm-up).")
  in_process_sides.add_sides_in_arg(parser)
  args, passthrough = common.parse_with_trainer_flags(parser)
  names = [e for e in args.examples.split(",") if e]
  unknown = [e for e in names if e not in EXAMPLES]
  if unknown or not names:
    parser.error(f"--examples={args.examples}: allowed: a comma-separated "
                 f"list of {', '.join(EXAMPLES)}")
  if args.train_steps is not None and args.train_steps < 2:
    # The ledger leaves out a warm-up step; one more must be measured.
    parser.error(f"--train_steps={args.train_steps}: allowed: at least 2")
  return args, passthrough


def build_configs(args, passthrough) -> dict:
  """{example: {"framework", "flags", "sides", "train_steps"}}."""
  configs = {}
  for name in [e for e in args.examples.split(",") if e]:
    example = EXAMPLES[name]
    steps = args.train_steps or (example["quick_train_steps"] if args.quick
                                 else example["train_steps"])
    configs[name] = {"framework": example["framework"],
                     "flags": example["flags"] + list(passthrough),
                     "sides": list(example["sides"]), "train_steps": steps}
  return configs


def run_side(config: dict, side: str, scratch: str,
             processes: Optional[in_process_sides.SideProcesses] = None
             ) -> dict:
  """One side of one example, by its framework's own driver, in
  `processes` where given."""
  if config["framework"] == "tensorflow":
    # jit_compile=auto: what plain Keras does by default (no XLA on a CPU).
    return trainer_overhead.run_side(side, config["flags"],
                                     config["train_steps"], scratch, "auto",
                                     processes)
  return torch_trainer_overhead.run_side(
      side, [*config["flags"], f"--train_steps={config['train_steps']}"],
      scratch, processes)


def comparisons(framework: str, summary: dict) -> list:
  """One row per trainer side: its plain side's and its own figure, the
  time ratio of medians, and the judged per-repeat ratio."""
  sides = summary["sides"]
  if framework == "tensorflow":
    plain = sides["plain_fit"]
    return [{"plain_side": "plain_fit", "side": side,
             "measure": MEASURES[framework],
             "plain_value": plain["samples_per_second_median"],
             "side_value": entry["samples_per_second_median"],
             "time_ratio_of_medians": entry["time_ratio_vs_plain"],
             "judged": entry["per_repeat_time_ratio_interval"]}
            for side, entry in sides.items() if side != "plain_fit"]
  return [{"plain_side": "plain_loop", "side": "torch_parity",
           "measure": MEASURES[framework],
           "plain_value": sides["plain_loop"]["step_p50_ms_median"],
           "side_value": sides["torch_parity"]["step_p50_ms_median"],
           "time_ratio_of_medians":
               summary["time_ratio"]["p50"]["time_ratio_of_medians"],
           "judged": summary["target"]["judged"]}]


def summarize_example(framework: str, runs: list, sides: list) -> dict:
  """The framework driver's own summary, with its comparisons added."""
  if framework == "tensorflow":
    summary = trainer_overhead.summarize(runs, sides)
  else:
    summary = torch_trainer_overhead.summarize(runs)
  summary["comparisons"] = comparisons(framework, summary)
  return summary


def summarize_payload(payload: dict) -> dict:
  return {name: summarize_example(
      config["framework"],
      [r for r in payload["runs"] if r["config"] == name], config["sides"])
          for name, config in payload["configs"].items()}


def format_summary(payload: dict) -> str:
  rows = []
  for name, summary in payload["summary"].items():
    for c in summary["comparisons"]:
      rows.append([name, f"{c['side']} vs {c['plain_side']}", c["measure"],
                   c["plain_value"], c["side_value"],
                   c["time_ratio_of_medians"],
                   harness.format_interval(c["judged"]),
                   c["judged"]["verdict"]])
  return common.format_table(
      ["example", "sides", "measured", "plain", "trainer",
       "time ratio of medians", "per-repeat ratio: median [interval]",
       "target <= 1.02"], rows)


def measure(args, passthrough, repeats: int, scratch_root: str
            ) -> harness.Measured:
  configs = build_configs(args, passthrough)
  with in_process_sides.open_side_processes(scratch_root,
                                           args.sides_in) as processes:
    return harness.measure_config_sides(
        configs, repeats, scratch_root,
        sides_of=lambda name: configs[name]["sides"],
        run_side=lambda name, side, scratch: run_side(
            configs[name], side, scratch, processes),
        describe=lambda result: (
            f"{result['samples_per_second']:.1f} samples/s"),
        redo_busy=args.redo_busy, sides_in=args.sides_in,
        target_max_overhead_frac=TARGET_MAX_OVERHEAD_FRAC)


def main():
  args, passthrough = parse_args()
  harness.main(NAME, args, functools.partial(measure, args, passthrough),
               default_repeats=DEFAULT_REPEATS, summarize=summarize_payload,
               table=format_summary)


if __name__ == "__main__":
  main()
