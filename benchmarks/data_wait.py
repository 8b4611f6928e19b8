"""Data wait with prefetch off, on, and to the device, as input cost grows.

  python -m benchmarks.data_wait            # full run
  python -m benchmarks.data_wait --quick    # smoke run

1. Compute alone. The model trains on batches kept resident
   (--synthetic_on_device: no input pipeline runs at all); the median of the
   compute phase p50 over the calibration runs is C, the step's compute time.
   A shorter run of the same kind, differenced against the long ones, gives
   the CPU seconds a step burns (spin-waiting threads included, so it
   overstates the work; recorded, not used for conclusions).
2. What the cost flag delivers. `benchmarks.cost_probe`, in three fresh
   processes, measures the one-thread time per sample each requested cost
   really takes (every trainer calibrates the cost loop once at start).
3. The grid. For every cost multiple k in 0, 0.5, 1, 2 the preprocessing
   cost is requested as k * C / batch_size per sample (--preprocess_cost_ms),
   so that one batch's preprocessing is k * C of CPU time, and each prefetch
   mode trains:
     off        --prefetch=0
     autotune   --prefetch=autotune
     to_device  --prefetch=autotune --prefetch_to_device
   Every repeat runs all twelve cells once through `benchmarks.harness`
   (the first cell rotating from repeat to repeat), each in its own
   trainer process (custom loop: its ledger times the wait for
   the next batch separately from compute).

Reported per cell, medians over repeats: the data-wait share of the step,
the compute p50 (it grows when preprocessing threads take cores from the
step), the step time and samples/s, and two references with no overlap at
all, k' being the delivered multiple: C * (1 + k'), the batch preprocessed on
one thread and then trained, and C * (1 + k' / cores), preprocessed on every
core and then trained.
"""

import functools
import os

from benchmarks import common
from benchmarks import harness

NAME = "data_wait"
DEFAULT_REPEATS = 3
COST_MULTIPLES = (0.0, 0.5, 1.0, 2.0)
MODES = {
    "off": ["--prefetch=0"],
    "autotune": ["--prefetch=autotune"],
    "to_device": ["--prefetch=autotune", "--prefetch_to_device"],
}
PREFETCH_ON = ("autotune", "to_device")
TARGET_MAX_DATA_WAIT_FRAC = 0.02
TARGET_MAX_COST_MULTIPLE = 1.0  # the target holds while cost <= compute
CALIBRATION_RUNS = 3
# The short calibration run, differenced against the long ones, cancels the
# start-up's CPU time (imports, tracing) so what is left is per-step CPU.
SHORT_CALIBRATION_STEPS = 30


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  common.add_synthetic_job_args(parser)
  parser.add_argument("--strategy", default="default")
  parser.add_argument("--num_devices", type=int, default=1)
  parser.add_argument("--framework", choices=tuple(common.TRAINER_MODULES),
                      default="tensorflow",
                      help="Whose trainer runs every cell (default "
                      "tensorflow).")
  parser.add_argument("--cost_multiples",
                      default=",".join(str(k) for k in COST_MULTIPLES),
                      help="Comma-separated k values of the grid (default "
                      "%(default)s).")
  parser.add_argument("--modes", default=",".join(MODES),
                      help="Comma-separated prefetch modes of the grid: "
                      + ", ".join(MODES) + " (default all).")
  parser.add_argument("--calibration_runs", type=int,
                      default=CALIBRATION_RUNS,
                      help="Compute-alone runs whose median is C (default "
                      "%(default)s).")
  parser.add_argument("--train_steps", type=int, default=150,
                      help="Steps per run (the ledger leaves out the first "
                      "tenth, at most 10).")
  args = parser.parse_args()
  given = args.cost_multiples
  try:
    args.cost_multiples = tuple(float(k) for k in given.split(",") if k)
  except ValueError:
    args.cost_multiples = ()
  if not args.cost_multiples or min(args.cost_multiples) < 0:
    parser.error(f"--cost_multiples={given}: allowed: comma-separated "
                 "numbers >= 0")
  args.modes = tuple(m for m in args.modes.split(",") if m)
  if not args.modes or not set(args.modes) <= set(MODES):
    parser.error(f"--modes={','.join(args.modes)}: allowed: a "
                 f"comma-separated subset of {','.join(MODES)}")
  if args.calibration_runs < 1:
    parser.error(f"--calibration_runs={args.calibration_runs}: allowed: "
                 ">= 1")
  return args


def base_flags(args) -> list:
  # At k = 0 the synthetic pipeline costs next to nothing, so the added
  # cost is the input work being studied.
  return [*common.synthetic_job_flags(args), f"--strategy={args.strategy}",
          f"--num_devices={args.num_devices}"]


def _run(args, flags: list, model_dir: str) -> dict:
  return common.run_trainer(flags, model_dir,
                            module=common.TRAINER_MODULES[args.framework])


def calibrate(args, steps: int, scratch: str) -> dict:
  """C, its CPU time, and the runs they come from."""
  flags = base_flags(args) + ["--synthetic_on_device"]
  runs = []
  for index in range(args.calibration_runs):
    result = _run(args, flags + [f"--train_steps={steps}"],
                  os.path.join(scratch, f"calibrate-{index}"))
    common.log(f"calibration {index + 1}/{args.calibration_runs}: compute "
               f"p50 {result['compute']['p50_ms']:.2f} ms")
    runs.append(result)
  short_steps = min(SHORT_CALIBRATION_STEPS, steps // 2)
  short = _run(args, flags + [f"--train_steps={short_steps}"],
               os.path.join(scratch, "calibrate-short"))
  compute_ms = common.median([r["compute"]["p50_ms"] for r in runs])
  long_cpu_s = common.median([r["process_cpu_s"] for r in runs])
  step_cpu_ms = 1e3 * (long_cpu_s - short["process_cpu_s"]) / (
      steps - short_steps)
  step_mean_ms = common.median([r["step"]["mean_ms"] for r in runs])
  return {
      "compute_ms": compute_ms,
      "step_mean_ms": step_mean_ms,
      "step_cpu_ms": step_cpu_ms,
      # CPU time per step over wall time per step.
      "cores_busy_in_compute": step_cpu_ms / step_mean_ms,
      "samples_per_second": common.median(
          [r["samples_per_second"] for r in runs]),
      "short_steps": short_steps,
      "runs": runs,
      "short_run": short,
  }


def probe_delivered_cost(costs_ms: list, scratch: str, num_probes: int,
                         batches: int) -> dict:
  """benchmarks.cost_probe in fresh processes: what the requested costs
  deliver on one thread, per requested cost (each trainer calibrates
  separately, so the spread between probes is the spread between runs)."""
  probes = []
  if not any(costs_ms):
    # Nothing requested, nothing to deliver: k = 0 cells read a factor of 1.
    num_probes = 0
  for index in range(num_probes):
    path = os.path.join(scratch, f"cost_probe-{index}.json")
    probe, _ = common.run_process_json(
        ["-m", "benchmarks.cost_probe",
         "--costs=" + ",".join(f"{c:.6f}" for c in costs_ms),
         f"--batches={batches}", f"--result_json={path}"], path)
    probes.append(probe)
  by_cost = {}
  for row_index, row in enumerate(probes[0]["costs"] if probes else []):
    if not row["requested_ms"]:
      continue
    ratios = [p["costs"][row_index]["delivered_over_requested"]
              for p in probes]
    by_cost[f"{row['requested_ms']:.6f}"] = {
        "delivered_over_requested": common.median(ratios),
        "delivered_over_requested_all": ratios,
    }
  return {"by_requested_ms": by_cost,
          "calibration_over_single_thread_all": [
              p["calibration_over_single_thread"] for p in probes],
          "probes": probes}


def summarize(runs: list, calibration: dict, delivered: dict,
              cores: int) -> list:
  compute_ms = calibration["compute_ms"]
  cells = []
  for k in COST_MULTIPLES + tuple(sorted({r["k"] for r in runs}
                                         - set(COST_MULTIPLES))):
    for mode in MODES:
      results = [r["result"] for r in runs if r["k"] == k and r["mode"] == mode]
      if not results:
        continue  # a cell this run left out (--cost_multiples, --modes)
      data_wait = common.median([r["data_wait"]["fraction"] for r in results])
      step_ms = common.median([r["step"]["mean_ms"] for r in results])
      cost_ms = results[0]["preprocess_cost_ms"]
      factor = (delivered["by_requested_ms"][f"{cost_ms:.6f}"]
                ["delivered_over_requested"] if cost_ms else 1.0)
      cell = {
          "k": k,
          # The cost multiple one thread really ran (benchmarks.cost_probe).
          "k_delivered": k * factor,
          "mode": mode,
          "preprocess_cost_ms": cost_ms,
          "data_wait_fraction": data_wait,
          "data_wait_fraction_all": [r["data_wait"]["fraction"]
                                     for r in results],
          "data_wait_p50_ms": common.median(
              [r["data_wait"]["p50_ms"] for r in results]),
          "compute_p50_ms": common.median(
              [r["compute"]["p50_ms"] for r in results]),
          "step_mean_ms": step_ms,
          "samples_per_second": common.median(
              [r["samples_per_second"] for r in results]),
          "samples_per_second_all": [r["samples_per_second"]
                                     for r in results],
          # The step if preprocessing ran on one thread, then the compute.
          "serial_sum_ms": compute_ms * (1 + k * factor),
          # ... or on every core (the map's own parallelism), then the
          # compute: what no overlap at all would cost with these cores.
          "serial_all_cores_ms": compute_ms * (1 + k * factor / cores),
          "step_over_compute": step_ms / compute_ms,
      }
      if mode in PREFETCH_ON and k <= TARGET_MAX_COST_MULTIPLE:
        cell["target_max_data_wait_fraction"] = TARGET_MAX_DATA_WAIT_FRAC
        cell["target"] = harness.judge(
            harness.median_interval(cell["data_wait_fraction_all"]),
            TARGET_MAX_DATA_WAIT_FRAC, harness.AT_MOST)
        cell["target_verdict"] = cell["target"]["verdict"]
      cells.append(cell)
  return cells


def format_cells(cells: list) -> str:
  headers = ["k", "k delivered", "cost ms/sample", "prefetch", "data_wait %",
             "data_wait p50 ms", "compute p50 ms", "step ms", "samples/s",
             "serial 1 thread ms", "serial all cores ms", "target"]
  rows = []
  for c in cells:
    target = c.get("target_verdict", "-")
    rows.append([c["k"], c["k_delivered"], c["preprocess_cost_ms"], c["mode"],
                 100 * c["data_wait_fraction"], c["data_wait_p50_ms"],
                 c["compute_p50_ms"], c["step_mean_ms"],
                 c["samples_per_second"], c["serial_sum_ms"],
                 c["serial_all_cores_ms"], target])
  return common.format_table(headers, rows)


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  steps = 40 if args.quick else args.train_steps
  calibration = calibrate(args, steps, scratch)
  compute_ms = calibration["compute_ms"]
  common.log(f"C = {compute_ms:.2f} ms compute per step, "
             f"{calibration['cores_busy_in_compute']:.2f} cores busy")
  costs_ms = [round(k * compute_ms / args.batch_size, 6)
              for k in args.cost_multiples]
  delivered = probe_delivered_cost(costs_ms, scratch,
                                   num_probes=1 if args.quick else 3,
                                   batches=4 if args.quick else 12)
  common.log("delivered / requested cost: " + ", ".join(
      f"{c}: {v['delivered_over_requested']:.2f}"
      for c, v in delivered["by_requested_ms"].items()))
  cells = [(k, mode) for k in args.cost_multiples for mode in args.modes]

  def run_one(cell, repeat):
    k, mode = cell
    cost_ms = round(k * compute_ms / args.batch_size, 6)
    flags = base_flags(args) + MODES[mode] + [
        f"--preprocess_cost_ms={cost_ms:.6f}", f"--train_steps={steps}"]
    result = _run(args, flags, os.path.join(scratch, f"k{k}-{mode}-{repeat}"))
    result["preprocess_cost_ms"] = cost_ms
    common.log(f"repeat {repeat + 1}/{repeats} k={k} {mode}: data_wait "
               f"{100 * result['data_wait']['fraction']:.1f}%, "
               f"{result['samples_per_second']:.0f} samples/s")
    return {"k": k, "mode": mode, "repeat": repeat, "flags": flags,
            "result": result}

  record = harness.run_interleaved(cells, repeats, run_one,
                                   redo_busy=args.redo_busy)
  return harness.Measured(
      fields={"train_steps": steps, "framework": args.framework,
              "setting": base_flags(args),
              "calibration": calibration, "delivered_cost": delivered,
              "runs": record["runs"]},
      hosts={"grid": record["host"]},
      num_runs=len(record["runs"]) + args.calibration_runs + 1)


def format_payload(payload: dict) -> str:
  calibration, cores = payload["calibration"], payload["machine"]["cpu_count"]
  return (f"C = {calibration['compute_ms']:.2f} ms compute per step "
          f"(resident batches), {calibration['step_cpu_ms']:.1f} ms CPU per "
          f"step = {calibration['cores_busy_in_compute']:.2f} of {cores} "
          "cores busy\n" + format_cells(payload["summary"]))


def main():
  args = parse_args()
  harness.main(
      NAME, args, functools.partial(measure, args),
      default_repeats=DEFAULT_REPEATS,
      summarize=lambda payload: summarize(
          payload["runs"], payload["calibration"], payload["delivered_cost"],
          payload["machine"]["cpu_count"] or 1),
      table=format_payload)


if __name__ == "__main__":
  main()
