"""The default job's data wait at one and at K steps per traced call.

  python -m benchmarks.steps_per_execution            # 5 repeats
  python -m benchmarks.steps_per_execution --quick    # a smoke run

The job is `python -m tfoverlap.train` as a new user first runs it (its
default flags: small_cnn on digits, MirroredStrategy over two CPU devices,
prefetch autotuned), with evaluation off, so that only training is timed. It
runs at --steps_per_execution=1 and =K, and again under --strategy=default,
which reads the input through a plain iterator instead of a distributed one:

  mirrored/1   the default job
  mirrored/K   the default job, K steps per traced call
  default/1, default/K   the same without the distributed input
  mirrored/K cache, default/K cache   at K, with --cache

The cached cells test whether the wait is the input's work. With --cache
the decoded samples are kept after the first epoch (digits has 1797 of
them), so a batch costs the input pipeline only shuffling and copying: a
wait that stays when that work is gone is not the input's work queuing for
a core.

At 1 the custom loop times `next(iterator)` in Python; at K the wait is
timed inside the graph (`tfoverlap.steps.make_multi_step_train_step`), so
the two are the same span: from the moment a step may begin to the moment
its batch is in hand. Per cell: the data-wait share of the step, judged
against the 2% goal; the step; the process's CPU work per step and the
bound it sets on 2 cores (`run.json` cpu: work / cores), which says whether
the input and compute together fill the machine; and, per strategy, the
step at K over the step at 1 within each repeat.
"""

import functools

from benchmarks import common
from benchmarks import harness

NAME = "steps_per_execution"
DEFAULT_REPEATS = 5
STEPS_PER_EXECUTION = 8
STRATEGIES = ("mirrored", "default")
# The input: the job's own pipeline, or it with --cache (named by the flag).
JOB_INPUT, CACHED_INPUT = "job", "cache"
TARGET_MAX_DATA_WAIT_FRAC = 0.02


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS)
  parser.add_argument("--steps_per_execution", type=int,
                      default=STEPS_PER_EXECUTION,
                      help="K, the steps per call compared against 1.")
  parser.add_argument("--train_steps", type=int, default=None,
                      help="Steps per run; default: the job's own.")
  args = parser.parse_args()
  if args.steps_per_execution < 2:
    parser.error(f"--steps_per_execution={args.steps_per_execution}: "
                 "allowed: >= 2 (it is compared against 1)")
  return args


def job_flags(strategy: str, k: int, data_input: str, train_steps) -> list:
  flags = [f"--steps_per_execution={k}", "--evaluate=false"]
  if strategy != "mirrored":  # mirrored is the job's default
    flags.append(f"--strategy={strategy}")
  if data_input == CACHED_INPUT:
    flags.append("--cache")
  if train_steps:
    flags.append(f"--train_steps={train_steps}")
  return flags


def benchmark_cells(k: int) -> list:
  """(strategy, steps per call, input) of every cell, in run order."""
  return ([(strategy, calls, JOB_INPUT)
           for strategy in STRATEGIES for calls in (1, k)]
          + [(strategy, k, CACHED_INPUT) for strategy in STRATEGIES])


def cell_name(strategy: str, calls: int, data_input: str) -> str:
  name = f"{strategy}/{calls}"
  return name if data_input == JOB_INPUT else f"{name} {data_input}"


def summarize(runs: list, k: int) -> dict:
  def per_repeat(cell, get):
    return harness.values_by_side(runs, get, side_field="cell")[cell]

  cells = {}
  steps_ms = {}
  for cell in benchmark_cells(k):
    strategy, calls, data_input = cell
    wait = per_repeat(cell, lambda r: r["result"]["data_wait"]["fraction"])
    steps_ms[cell] = per_repeat(cell, lambda r: r["result"]["step"]["mean_ms"])
    cells[cell_name(*cell)] = {
        "strategy": strategy, "steps_per_execution": calls,
        "input": data_input,
        "data_wait_fraction": harness.judge(
            harness.median_interval(wait), TARGET_MAX_DATA_WAIT_FRAC),
        "data_wait_fraction_all": wait,
        "data_wait_mean_ms_all": per_repeat(
            cell, lambda r: r["result"]["data_wait"]["mean_ms"]),
        "compute_mean_ms_all": per_repeat(
            cell, lambda r: r["result"]["compute"]["mean_ms"]),
        "step_mean_ms_all": steps_ms[cell],
        "samples_per_second_all": per_repeat(
            cell, lambda r: r["result"]["samples_per_second"]),
        "cpu_work_ms_all": per_repeat(
            cell, lambda r: 1e3 * r["result"]["cpu"]["work_s_per_step"]),
        "work_bound_ms_all": per_repeat(
            cell, lambda r: 1e3 * r["result"]["cpu"]["work_bound_s"]),
    }
  for strategy in STRATEGIES:
    cells[f"{strategy}/{k} over {strategy}/1"] = {
        "step_ratio": harness.summarize_ratios(
            steps_ms[(strategy, k, JOB_INPUT)],
            steps_ms[(strategy, 1, JOB_INPUT)])}
  return cells


def format_summary(summary: dict) -> str:
  rows = []
  for name, cell in summary.items():
    if "step_ratio" in cell:
      rows.append([name, "-", "-", "-", "-",
                   harness.format_interval(cell["step_ratio"])])
      continue
    wait = cell["data_wait_fraction"]
    rows.append([name, harness.format_interval(wait), wait["verdict"],
                 common.median(cell["step_mean_ms_all"]),
                 common.median(cell["work_bound_ms_all"]), "-"])
  return common.format_table(
      ["cell", "data wait share", "<= 2%", "step ms", "work / cores ms",
       "step ratio"], rows)


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  k = args.steps_per_execution
  train_steps = args.train_steps or (40 if args.quick else None)

  def describe(cell, result):
    return (f"{cell_name(*cell)}: data wait "
            f"{100 * result['data_wait']['fraction']:.1f}%, step "
            f"{result['step']['mean_ms']:.2f} ms")

  record = harness.run_trainer_cells(
      benchmark_cells(k), repeats, scratch,
      flags_of=lambda cell: job_flags(*cell, train_steps),
      describe=describe, redo_busy=args.redo_busy)
  return harness.Measured.of_group(
      record, summary=summarize(record["runs"], k), steps_per_execution=k,
      target_max_data_wait_fraction=TARGET_MAX_DATA_WAIT_FRAC)


def main():
  args = parse_args()
  harness.main(NAME, args, functools.partial(measure, args),
               default_repeats=DEFAULT_REPEATS,
               table=lambda payload: format_summary(payload["summary"]))


if __name__ == "__main__":
  main()
