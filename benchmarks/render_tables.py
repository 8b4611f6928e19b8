"""The tables of BENCHMARKS.md, each computed from one or more results files.

Every function here reads benchmarks/results/*.json and returns Markdown;
none holds a number of its own. Intervals and verdicts come from
`benchmarks.harness`, the same functions the benchmarks write into their
JSON, so the document and the files cannot judge a result differently.
`TABLES` maps each block name of `benchmarks.render` to its function.
"""

import json
import os
import statistics
from typing import Callable, Dict, List, Optional, Sequence

from benchmarks import checkpoint_overhead as checkpoint_overhead_benchmark
from benchmarks import harness

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "results")
DASH = "–"
TABLES: Dict[str, Callable[[], str]] = {}


class MissingResults(FileNotFoundError):
  """A block needs a results file that is not there."""


def table(name: str):
  """Registers a table function under its block name."""
  def register(function):
    TABLES[name] = function
    return function
  return register


def load(name: str) -> dict:
  path = os.path.join(RESULTS_DIR, name + ".json")
  if not os.path.exists(path):
    raise MissingResults(f"{path} is missing: run the benchmark that writes "
                         "it, or remove its block")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def g(value: Optional[float]) -> str:
  """About three significant figures, as a reader compares them."""
  if value is None:
    return DASH
  magnitude = abs(value)
  if magnitude >= 100 or value == int(value):
    return f"{value:.0f}"
  if magnitude >= 10:
    return f"{value:.1f}"
  if magnitude >= 1:
    return f"{value:.2f}"
  return f"{value:.3f}"


def f3(value: Optional[float]) -> str:
  return DASH if value is None else f"{value:.3f}"


def pct(fraction: Optional[float], digits: int = 1) -> str:
  return DASH if fraction is None else f"{100 * fraction:.{digits}f}"


def markdown(headers: Sequence[str], rows: List[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(headers) + " |",
           "|" + "---|" * len(headers)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def interval(values: Sequence[float]) -> str:
  return harness.format_interval(harness.median_interval(values))


def spread(values: Sequence[float], show: Callable[[float], str] = g) -> str:
  """median [low, high]: the 90% interval, or with too few repeats for
  one, the range, marked as such."""
  values = [v for v in values if v is not None]
  if not values:
    return DASH
  summary = harness.median_interval(values)
  if summary["low"] is not None:
    return (f"{show(summary['median'])} [{show(summary['low'])}, "
            f"{show(summary['high'])}]")
  return (f"{show(summary['median'])} (range {show(min(values))}–"
          f"{show(max(values))}, {len(values)} runs)")


def judged(values: Sequence[float], target: float,
           direction: str = harness.AT_MOST) -> str:
  return harness.verdict(harness.median_interval(values), target, direction)


# ---- 1. trainer_overhead ---------------------------------------------------


@table("trainer_overhead")
def trainer_overhead() -> str:
  return _trainer_overhead_table(load("trainer_overhead"))


@table("trainer_overhead_r5_steal")
def trainer_overhead_r5_steal() -> str:
  return _trainer_overhead_table(load("trainer_overhead_r5_steal"))


def _trainer_overhead_table(data: dict) -> str:
  repeats = data["repeats"]
  rows = []
  for config, summary in data["summary"].items():
    for side, e in summary["sides"].items():
      per_repeat = ", ".join(g(v) for v in e["samples_per_second_all"])
      if "per_repeat_time_ratios" not in e:
        rows.append([config, side, g(e["samples_per_second_median"]),
                     per_repeat, "1", DASH, "1", DASH])
        continue
      ratios = e["per_repeat_time_ratios"]
      rows.append([
          config, side, g(e["samples_per_second_median"]), per_repeat,
          f3(e["time_ratio_vs_plain"]), interval(ratios),
          f3(e["time_ratio_vs_plain_best_of_repeats"]),
          judged(ratios, 1.0 + e["target_max_overhead_frac"])])
  return markdown(
      ["config", "side", "samples/s, median", "samples/s per repeat",
       "time ratio vs plain (of medians)",
       "per-repeat time ratio: median [interval] (coverage)",
       f"best-of-{repeats} ratio", "2% target"], rows)


# ---- 2. data_wait ------------------------------------------------------------


@table("data_wait_compute")
def data_wait_compute() -> str:
  c = load("data_wait")["calibration"]
  return (f"Resident batches gave C = {g(c['compute_ms'])} ms of compute per "
          f"step ({g(c['samples_per_second'])} samples/s), using "
          f"{g(c['step_cpu_ms'])} ms of CPU per step: "
          f"{g(c['cores_busy_in_compute'])} cores busy with compute alone.")


@table("data_wait")
def data_wait() -> str:
  data = load("data_wait")
  rows = []
  for c in data["summary"]:
    fractions = c["data_wait_fraction_all"]
    verdict = DASH
    if "target_max_data_wait_fraction" in c:
      verdict = judged(fractions, c["target_max_data_wait_fraction"])
    rows.append([
        f"{c['k']:g}", g(c["k_delivered"]), g(c["preprocess_cost_ms"]),
        c["mode"], pct(c["data_wait_fraction"]),
        ", ".join(pct(v) for v in fractions), g(c["data_wait_p50_ms"]),
        g(c["compute_p50_ms"]), g(c["step_mean_ms"]),
        g(c["samples_per_second"]), g(c["serial_sum_ms"]),
        g(c["serial_all_cores_ms"]), verdict])
  return markdown(
      ["k", "k' delivered", "cost ms/sample", "prefetch",
       "data_wait % of step", "per repeat %", "data_wait p50 ms",
       "compute p50 ms", "step ms", "samples/s",
       "serial, 1 thread: C(1+k') ms", "serial, all cores: C(1+k'/cores) ms",
       "target: prefetch on, k ≤ 1, ≤ 2%"], rows)


# ---- 2b. steps_per_execution ---------------------------------------------


@table("steps_per_execution")
def steps_per_execution() -> str:
  data = load("steps_per_execution")
  target = data["target_max_data_wait_fraction"]
  rows = []
  for cell in data["summary"].values():
    if "step_ratio" in cell:
      continue
    job_input = cell["input"] == "job"
    ratio = data["summary"].get(
        f"{cell['strategy']}/{data['steps_per_execution']} over "
        f"{cell['strategy']}/1") if (
            cell["steps_per_execution"] > 1 and job_input) else None
    rows.append([
        f"`{cell['strategy']}`", str(cell["steps_per_execution"]),
        "the job's" if job_input else f"`--{cell['input']}`",
        spread(cell["data_wait_fraction_all"], pct),
        judged(cell["data_wait_fraction_all"], target),
        spread(cell["data_wait_mean_ms_all"]),
        spread(cell["compute_mean_ms_all"]),
        spread(cell["step_mean_ms_all"]),
        spread(cell["work_bound_ms_all"]),
        spread(ratio["step_ratio"]["per_repeat"], f3) if ratio else DASH])
  return markdown(
      ["strategy", "steps per call", "input", "data wait % of step",
       f"≤ {100 * target:g}%", "data wait ms", "compute ms", "step ms",
       "CPU work / cores ms", "step at K / step at 1, per repeat"], rows)


# ---- 3. data_knobs -------------------------------------------------------


def _trainer_rows(section: str) -> List[list]:
  rows = load("data_knobs")["trainer"]["sections"][section]
  return [[f"`{r['variant']}`", pct(r["data_wait_fraction"], 2),
           g(r["data_wait_p50_ms"]), g(r["compute_p50_ms"]),
           g(r["step_mean_ms"]), g(r["samples_per_second"])] for r in rows]


_TRAINER_HEADERS = ["variant", "data_wait %", "data_wait p50 ms",
                    "compute p50 ms", "step ms", "samples/s"]


@table("data_knobs_resident")
def data_knobs_resident() -> str:
  compute_ms = load("data_knobs")["trainer"]["compute_ms"]
  return (f"C = {g(compute_ms)} ms (compute p50 of the first resident "
          "run).\n\n" + markdown(_TRAINER_HEADERS,
                                 _trainer_rows("device_resident")))


@table("data_knobs_depth")
def data_knobs_depth() -> str:
  rows = load("data_knobs")["trainer"]["sections"]["prefetch_depth"]
  cost = rows[0]["preprocess_cost_ms"]
  return (f"Requested cost: {f3(cost)} ms/sample (C per batch).\n\n"
          + markdown(_TRAINER_HEADERS, _trainer_rows("prefetch_depth")))


def _pipeline(section: str):
  return load("data_knobs")["pipeline"][section]


@table("data_knobs_idle")
def data_knobs_idle() -> str:
  return markdown(["`--prefetch`", "wait p50 ms"],
                  [[r["prefetch"], g(r["wait_p50_ms"])]
                   for r in _pipeline("prefetch_idle_consumer")])


@table("data_knobs_map")
def data_knobs_map() -> str:
  return markdown(
      ["`--map_parallelism`", "ms/batch", "samples/s",
       "speed-up vs one thread"],
      [[r["map_parallelism"], g(r["ms_per_batch"]),
        g(r["samples_per_second"]), f"{r['speedup_vs_one_thread']:.2f}"]
       for r in _pipeline("map_parallelism")])


@table("data_knobs_cost")
def data_knobs_cost() -> str:
  cost = _pipeline("preprocess_cost")
  rows = [[g(r["requested_ms_per_sample"]), f3(r["one_thread_ms_per_sample"]),
           f3(r["delivered_ms_per_sample"]) if r["requested_ms_per_sample"]
           else "0",
           DASH if r["delivered_over_requested"] is None
           else f"{r['delivered_over_requested']:.2f}"]
          for r in cost["rows"]]
  return (f"Calibrated rate over the single-thread rate measured afterwards: "
          f"{cost['calibration_over_single_thread']:.2f} (median).\n\n"
          + markdown(["requested ms", "one-thread ms/sample", "delivered ms",
                      "delivered / requested"], rows))


@table("data_knobs_cache")
def data_knobs_cache() -> str:
  return markdown(
      ["`--cache`", "first epoch ms/batch", "later epochs ms/batch",
       "speed-up"],
      [[r["cache"], g(r["first_epoch_ms_per_batch"]),
        g(r["later_epochs_ms_per_batch"]), f"{g(r['speedup_vs_off'])}×"]
       for r in _pipeline("cache")])


@table("data_knobs_shuffle")
def data_knobs_shuffle() -> str:
  return markdown(
      ["`--shuffle_buffer`", "first batch ms", "ms/batch after",
       "share of first batch from the source's first 64"],
      [[str(r["shuffle_buffer"]), g(r["first_batch_ms"]),
        g(r["ms_per_batch"]), f"{r['first_batch_from_first_64']:.2f}"]
       for r in _pipeline("shuffle_buffer")])


@table("data_knobs_service")
def data_knobs_service() -> str:
  by_cost = {}
  for r in _pipeline("data_service"):
    by_cost.setdefault(r["preprocess_cost_ms"], {})[r["data_service"]] = r
  rows = [[g(cost), g(v["off"]["ms_per_batch"]),
           g(v["local"]["ms_per_batch"]),
           f"+{v['local']['overhead_ms_per_batch']:.2f}"]
          for cost, v in by_cost.items()]
  return markdown(["cost ms/sample", "off ms/batch", "local ms/batch",
                   "service overhead ms/batch"], rows)


# ---- 4. checkpoint_overhead ------------------------------------------------


@table("checkpoint_overhead")
def checkpoint_overhead() -> str:
  return _checkpoint_overhead_table(load("checkpoint_overhead"))


@table("checkpoint_overhead_quiet")
def checkpoint_overhead_quiet() -> str:
  return _checkpoint_overhead_table(load("checkpoint_overhead_quiet"))


@table("checkpoint_overhead_auto_long")
def checkpoint_overhead_auto_long() -> str:
  return _checkpoint_overhead_table(load("checkpoint_overhead_auto_long"))


def _persist_cpu_ms(data: dict, mode: str, every) -> Optional[float]:
  """The median over repeats of a cell's median persist CPU time, if the
  file has it (files before the persist thread read its clock do not)."""
  per_run = [((r["result"]["checkpoint"].get("persist_cpu_s") or {})
              .get("p50")) for r in data["runs"]
             if r["mode"] == mode and r["every"] == every]
  per_run = [v for v in per_run if v is not None]
  return 1e3 * statistics.median(per_run) if per_run else None


def _checkpoint_overhead_table(data: dict) -> str:
  # Files written before the bound was recorded used the same constant.
  bound = data.get("max_overhead_frac",
                   checkpoint_overhead_benchmark.MAX_OVERHEAD_FRAC)
  rows = []
  for c in data["cells"]:
    every = c["every"]
    if every == "auto":
      every = f"auto (ended at {c['final_every_steps']})"
    per_repeat = c["overhead_frac_by_repeat"]
    baseline = c["mode"] == "none"
    verdict = DASH
    if c["every"] == "auto":
      verdict = judged([1 + x for x in per_repeat], 1 + bound)
    is_async = c["mode"] == "async"
    rows.append([
        c["mode"], every, g(c["step_mean_ms"]),
        DASH if baseline else f"{100 * c['overhead_frac']:+.1f}%",
        DASH if baseline else interval([1 + x for x in per_repeat]),
        DASH if baseline else ", ".join(f"{100 * x:+.1f}%"
                                        for x in per_repeat),
        DASH if baseline else g(c["stall_p50_ms"]),
        f3(c.get("stall_over_sync")) if not baseline else DASH,
        g(c["checkpoints"]),
        g(c["skipped_or_waited"]) if is_async else DASH,
        g(c["persist_p50_ms"]) if is_async else DASH,
        g(_persist_cpu_ms(data, c["mode"], c["every"])) if is_async
        else DASH, verdict])
  return (f"{data['repeats']} repeat(s) of {data['steps_per_run']} steps; "
          f"{data['model']} at {data['image_size']}×{data['image_size']}, "
          f"batch {data['batch_size']}.\n\n" + markdown(
              ["mode", "every", "step ms", "overhead",
               "step ratio [interval]", "overhead per repeat",
               "stall/ckpt ms", "stall / sync's", "checkpoints",
               "busy waits", "persist ms", "persist CPU ms",
               "bound (auto): met, missed, noisy"], rows))


# ---- the runs recorded -----------------------------------------------------


def results_names() -> List[str]:
  return sorted(name[:-len(".json")] for name in os.listdir(RESULTS_DIR)
                if name.endswith(".json") and not name.endswith(".quick.json"))


def max_foreign_cpu_frac(data: dict, num_cores: int) -> Optional[float]:
  """Other processes' largest share of the host's CPU during one run.

  Files from before the harness record `foreign_cpu_s` and
  `process_wall_s` per trainer run, which is what the harness's CPU rule
  needs; the harness records the share per repeat of each measured
  section. Files that record neither give None.
  """
  runs = data.get("runs")
  fractions = []
  for run in runs if isinstance(runs, list) else []:
    result = run.get("result", {})
    foreign_s, wall_s = result.get("foreign_cpu_s"), result.get(
        "process_wall_s")
    if foreign_s is not None and wall_s:
      fractions.append(foreign_s / (wall_s * num_cores))
  for section in data.get("harness", {}).get("host", {}).values():
    for host in section.get("host_by_repeat", [section]):
      if host.get("foreign_cpu_frac") is not None:
        fractions.append(host["foreign_cpu_frac"])
  return max(fractions) if fractions else None


def _busy(data: dict, machine: dict) -> tuple:
  """(max foreign share, busy): the harness's own record where the file has
  one, else its two rules applied to what the file recorded."""
  cores = machine.get("cpu_count") or 1
  foreign = max_foreign_cpu_frac(data, cores)
  if "harness" in data:
    return foreign, data["harness"]["host_busy"]
  load = machine.get("load_average_at_start")
  if not load and foreign is None:
    return foreign, None
  busy = bool(load) and harness.load_is_busy(load[0], cores)
  return foreign, busy or (foreign is not None
                           and harness.foreign_is_busy(foreign))


@table("recorded_runs")
def recorded_runs() -> str:
  rows = []
  for name in results_names():
    data = load(name)
    machine = data.get("machine", {})
    load_at_start = machine.get("load_average_at_start")
    foreign, busy = _busy(data, machine)
    rows.append([
        f"`{name}.json`", machine.get("date", DASH),
        machine.get("cpu_model") or DASH,
        g(machine.get("cpu_count")), g(machine.get("ram_gib")),
        machine.get("tensorflow") or DASH, machine.get("torch") or DASH,
        machine.get("python") or DASH, g(data.get("repeats")),
        g(data.get("total_wall_s")),
        f"{load_at_start[0]:.2f}" if load_at_start else DASH,
        DASH if foreign is None else f"{100 * foreign:.1f}%",
        DASH if busy is None else ("yes" if busy else "no"),
        _num_redone(data)])
  return markdown(
      ["results file", "date", "CPU", "cores", "RAM GiB", "TensorFlow",
       "PyTorch", "Python", "repeats", "wall s", "load average at start",
       "other processes' largest CPU share in a run",
       "busy (harness rules)", "busy repeats run again"], rows)


def _num_redone(data: dict) -> str:
  """How many busy repeats the harness ran again; a dash for files from
  before it could."""
  hosts = ((data.get("harness") or {}).get("host") or {}).values()
  counts = [len(h["discarded_repeats"]) for h in hosts
            if isinstance(h, dict) and "discarded_repeats" in h]
  return str(sum(counts)) if counts else DASH


# ---- 16. host_allocator ----------------------------------------------------


@table("host_allocator")
def host_allocator() -> str:
  rows = []
  for cell in load("host_allocator")["summary"].values():
    steps = cell["step_ms_all"]
    rows.append([
        cell["framework"], f"`{cell['model']}`", spread(steps["retain"]),
        spread(steps["system"]),
        harness.format_interval(cell["system_over_retain"]),
        spread(cell["extra_faults_per_step_all"])])
  return markdown(
      ["framework", "model", "step ms, `retain`", "step ms, `system`",
       "`system` / `retain`, per repeat",
       "page faults per step beyond `retain`"], rows)
