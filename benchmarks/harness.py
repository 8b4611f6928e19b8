"""One way to compare: interleaved repeats, host load, intervals, verdicts.

Every benchmark that compares sides (a trainer against a baseline, one knob
setting against another) runs them through `run_interleaved`, which

- runs the sides of each repeat back to back, the first side rotating from
  repeat to repeat (ABC, BCA, CAB, ...), so that a slow minute of a shared
  host hits every side alike and no side always runs first (cold caches) or
  last;
- records the load average, the CPU time other processes took and the CPU
  time the hypervisor took (steal), before and after, and warns when the
  host was busy; asked to, it runs a busy repeat again, keeping the
  discarded one in the record.

`summarize_ratios` turns the per-repeat measurements into the median of the
paired ratios with a distribution-free interval, and `verdict` is the only
place where "met", "missed" or "noisy" is decided: the results JSON, the
printed tables and the rendered BENCHMARKS.md all call it.

`main` is every driver's main(): it runs the driver's measurement in a
scratch directory, writes the results file with the fields every one
records, prints the tables, and re-summarizes an existing results file
(`--resummarize`) without running anything.

Usage:

  record = harness.run_interleaved(
      ["plain", "trainer"], repeats=5,
      run_side=lambda side, repeat: {"step_ms": measure(side)})
  times = harness.values_by_side(record["runs"], "step_ms")
  ratio = harness.summarize_ratios(times["trainer"], times["plain"])
  harness.verdict(ratio, target=1.02, direction=harness.AT_MOST)  # "met"...
"""

import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Union

from benchmarks import common
from overlap_core.runtime import intervals

# The interval arithmetic lives with the comparison tool's; the benchmarks
# reach it through here.
DEFAULT_CONFIDENCE = intervals.DEFAULT_CONFIDENCE
median_interval = intervals.median_interval
paired_ratios = intervals.paired_ratios
summarize_ratios = intervals.summarize_ratios
format_interval = intervals.format_interval

MET = "met"
MISSED = "missed"
NOISY = "noisy"
VERDICTS = (MET, MISSED, NOISY)
AT_MOST = "at_most"    # the target is an upper bound: time ratio <= 1.02
AT_LEAST = "at_least"  # the target is a lower bound: efficiency >= 0.9

# A host counts as busy when its 1-minute load average exceeds its core
# count before the run: every core already has a runnable process waiting
# for it. Not lower: the load average decays over minutes, so a benchmark
# started right after another one inherits its load. The recorded quiet
# reruns (other processes took under 0.5 s of CPU per run) started at load
# 0.6-1.4 on 2 cores, the shared runs at 2.7-12.5, where repeats of one
# cell differed by up to 3 times. Lighter foreign work is caught while the
# benchmark runs, by the CPU rule below, which the load cannot fool.
BUSY_LOAD_PER_CORE = 1.0
# A run also counts as disturbed when other processes used more than this
# share of the host's CPU capacity while it ran: 10% of 2 cores is 0.2 of a
# core, several times the 2-3% targets judged with this harness.
BUSY_FOREIGN_CPU_FRAC = 0.10
# A run also counts as disturbed when the hypervisor gave this machine's
# cores to other guests for more than this share of their capacity (the
# "steal" column of /proc/stat): work no process here can see. In the quiet
# checkpoint rerun (checkpoint_overhead_quiet.json, 35 runs on 2 cores) the
# 6 runs above 10% include the 3 slowest, 214-275 ms per step, against
# 140-208 ms for the 29 below it.
BUSY_STEAL_FRAC = 0.10
# /proc/stat counts in clock ticks (10 ms): over a shorter span than this
# one tick of anyone's work is a large share, so the share is not judged.
MIN_SPAN_TO_JUDGE_FOREIGN_S = 1.0


def load_is_busy(load_average_1min: float, num_cores: int) -> bool:
  """The busy-host rule on the load average (see BUSY_LOAD_PER_CORE)."""
  return load_average_1min > BUSY_LOAD_PER_CORE * num_cores


def foreign_is_busy(foreign_cpu_frac: float) -> bool:
  """The busy-host rule on other processes' share of the CPU capacity."""
  return foreign_cpu_frac > BUSY_FOREIGN_CPU_FRAC


def interleaved_order(sides: Sequence[Hashable], repeat: int) -> list:
  """The order of the sides in repeat `repeat` (0-based): a rotation.

  Repeat 0 runs A B C, repeat 1 B C A, repeat 2 C A B, and so on, so that
  over len(sides) repeats every side runs once in every position.

  Raises:
    ValueError: no sides, a repeated side, or a negative repeat.
  """
  sides = list(sides)
  if not sides:
    raise ValueError("sides: got none; at least one is needed")
  if len(set(sides)) != len(sides):
    raise ValueError(f"sides: {sides!r} names a side twice")
  if repeat < 0:
    raise ValueError(f"repeat: got {repeat}; allowed: >= 0")
  shift = repeat % len(sides)
  return sides[shift:] + sides[:shift]


def _self_tree_cpu_s() -> float:
  """CPU time of this process and of its children, those waited for and
  those still running.

  Benchmarks run their trainers one at a time and wait for each; a side
  process that serves every repeat (`in_process_sides`) is still running
  at both points where this is read, and is counted live, so that its
  work is not taken for another user's.
  """
  return common.own_cpu_s() + common.live_children_cpu_s()


def host_snapshot() -> dict:
  """The counters that `host_load` compares: load, host and own CPU, time."""
  try:
    load = list(os.getloadavg())
  except OSError:
    load = None
  busy_s, steal_s = common.read_host_cpu_s()
  return {"load_average": load, "host_busy_cpu_s": busy_s,
          "host_steal_cpu_s": steal_s, "self_tree_cpu_s": _self_tree_cpu_s(),
          "monotonic_s": time.monotonic()}


def host_load(before: dict, after: dict, *,
              num_cores: Optional[int] = None,
              check_load: bool = True) -> dict:
  """What the rest of the host did between two snapshots, and whether busy.

  Args:
    before, after: from `host_snapshot`.
    num_cores: the host's (default: os.cpu_count()).
    check_load: apply the load-average rule to `before`. Only before the
      first run does the load average say what others do: once the
      benchmark runs, its own processes raise it.

  Returns:
    load averages before and after, `foreign_cpu_s` (host busy CPU minus
    this process tree's, never below 0; None where /proc/stat is missing),
    its share of the host's capacity, `steal_s` and its share likewise,
    `busy` and the `warnings` that made it busy, one readable line each.
  """
  num_cores = num_cores or os.cpu_count() or 1
  wall_s = max(0.0, after["monotonic_s"] - before["monotonic_s"])
  foreign_cpu_s = None
  foreign_frac = None
  if (before["host_busy_cpu_s"] is not None
      and after["host_busy_cpu_s"] is not None):
    foreign_cpu_s = max(0.0, (after["host_busy_cpu_s"]
                              - before["host_busy_cpu_s"])
                        - (after["self_tree_cpu_s"]
                           - before["self_tree_cpu_s"]))
    if wall_s >= MIN_SPAN_TO_JUDGE_FOREIGN_S:
      foreign_frac = foreign_cpu_s / (wall_s * num_cores)
  steal_s = steal_frac = None
  if (before.get("host_steal_cpu_s") is not None
      and after.get("host_steal_cpu_s") is not None):
    steal_s = max(0.0, after["host_steal_cpu_s"] - before["host_steal_cpu_s"])
    if wall_s >= MIN_SPAN_TO_JUDGE_FOREIGN_S:
      steal_frac = steal_s / (wall_s * num_cores)
  warnings = []
  load_before = before["load_average"]
  threshold = BUSY_LOAD_PER_CORE * num_cores
  if (check_load and load_before is not None
      and load_is_busy(load_before[0], num_cores)):
    warnings.append(f"host busy: load average {load_before[0]:.2f} before "
                    f"the run, above {threshold:.2f} ({BUSY_LOAD_PER_CORE} "
                    f"per core, {num_cores} cores)")
  if foreign_frac is not None and foreign_is_busy(foreign_frac):
    warnings.append(f"host busy: other processes used {foreign_cpu_s:.1f} s "
                    f"of CPU in {wall_s:.1f} s ({100 * foreign_frac:.0f}% of "
                    f"{num_cores} cores, above "
                    f"{100 * BUSY_FOREIGN_CPU_FRAC:.0f}%)")
  if steal_frac is not None and steal_frac > BUSY_STEAL_FRAC:
    warnings.append(f"host busy: the hypervisor took {steal_s:.1f} s of CPU "
                    f"(steal) in {wall_s:.1f} s ({100 * steal_frac:.0f}% of "
                    f"{num_cores} cores, above "
                    f"{100 * BUSY_STEAL_FRAC:.0f}%)")
  return {"num_cores": num_cores, "wall_s": wall_s,
          "load_average_before": load_before,
          "load_average_after": after["load_average"],
          "foreign_cpu_s": foreign_cpu_s, "foreign_cpu_frac": foreign_frac,
          "busy_load_threshold": threshold,
          "busy_foreign_cpu_frac": BUSY_FOREIGN_CPU_FRAC,
          "steal_s": steal_s, "steal_frac": steal_frac,
          "busy_steal_frac": BUSY_STEAL_FRAC,
          "busy": bool(warnings), "warnings": warnings}


def run_interleaved(sides: Sequence[Hashable], repeats: int,
                    run_side: Callable[[Hashable, int], dict], *,
                    redo_busy: int = 0, judge_start_load: bool = True,
                    warn: Callable[[str], None] = None,
                    snapshot: Callable[[], dict] = None) -> dict:
  """Runs every side once per repeat, the first side rotating; records load.

  Args:
    sides: what is compared: names, or tuples for grid cells.
    repeats: how many times every side runs; >= 1.
    run_side: run_side(side, repeat) measures one side once and returns
      its record (a dict), stored as it is.
    redo_busy: how many repeats of this group may be run again because
      the host was busy during them (0: none; every busy repeat is kept and
      marked). All sides of a repeat are redone together, so the pairs stay
      paired; what was discarded stays in the record.
    judge_start_load: apply the load-average rule before the first repeat.
      Only before a benchmark's first group does the load average say what
      others do: a later group (a second preset) starts under the load of
      the one before, which decays over minutes; pass False there.
    warn: where busy-host warnings go (default: stderr).
    snapshot: reads the host's counters (default `host_snapshot`).

  Returns:
    {"runs": the records kept, in the order run, "order": [[side, ...] per
    repeat], "repeats", "host": `host_load` over the whole run, with a
    per-repeat list (of the kept repeats) in "host_by_repeat" and
    "discarded_repeats": [{"repeat", "runs", "host"} per repeat run
    again]}.

  Raises:
    ValueError: repeats below 1, redo_busy below 0, or bad sides (see
      `interleaved_order`).
  """
  if repeats < 1:
    raise ValueError(f"repeats: got {repeats}; allowed: >= 1")
  if redo_busy < 0:
    raise ValueError(f"redo_busy: got {redo_busy}; allowed: >= 0")
  warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
  snapshot = snapshot or host_snapshot
  first = snapshot()
  start_load = host_load(first, first, check_load=judge_start_load)
  for line in start_load["warnings"]:
    warn(f"WARNING: {line}; results will be marked busy")
  runs, orders, by_repeat, discarded = [], [], [], []
  for repeat in range(repeats):
    order = interleaved_order(sides, repeat)
    orders.append(list(order))
    while True:
      before = snapshot()
      repeat_runs = [run_side(side, repeat) for side in order]
      load = host_load(before, snapshot(), check_load=False)
      for line in load["warnings"]:
        warn(f"WARNING: repeat {repeat + 1}/{repeats}: {line}")
      if not load["busy"] or len(discarded) >= redo_busy:
        break
      discarded.append({"repeat": repeat, "runs": repeat_runs,
                        "host": load})
      warn(f"repeat {repeat + 1}/{repeats} runs again ({len(discarded)} of "
           f"{redo_busy} redo(s) of busy repeats used)")
    runs += repeat_runs
    by_repeat.append(load)
  host = host_load(first, snapshot(), check_load=judge_start_load)
  host["busy"] = host["busy"] or any(r["busy"] for r in by_repeat)
  host["busy_repeats"] = [i for i, r in enumerate(by_repeat) if r["busy"]]
  host["host_by_repeat"] = by_repeat
  # Kept with the host record, which every results file stores.
  host["discarded_repeats"] = discarded
  return {"runs": runs, "order": orders, "repeats": repeats, "host": host}


def run_trainer_cells(cells: Sequence[tuple], repeats: int, scratch: str, *,
                      flags_of: Callable[[tuple], List[str]],
                      describe: Callable[[tuple, dict], str],
                      module_of: Optional[Callable[[tuple], str]] = None,
                      launcher_of: Optional[
                          Callable[[tuple], Optional[List[str]]]] = None,
                      redo_busy: int = 0) -> dict:
  """`run_interleaved` over a grid whose every cell is one trainer run.

  Args:
    cells: the grid's cells, tuples of names and numbers.
    repeats, redo_busy: as `run_interleaved`'s.
    scratch: the runs' model directories go below it, one per cell and
      repeat.
    flags_of: a cell's trainer flags.
    describe: the progress line's text for a cell and its result.
    module_of: a cell's trainer module (default: the TensorFlow trainer),
      or its launcher's.
    launcher_of: a cell's launcher flags where `module_of` names a
      launcher (see `common.run_trainer`), else None.

  Returns:
    The `run_interleaved` record, whose runs are {"cell": list(cell),
    "repeat", "flags", "result": `common.run_trainer`'s}.
  """
  def run_one(cell, repeat):
    flags = flags_of(cell)
    module = (module_of(cell) if module_of
              else common.TRAINER_MODULES["tensorflow"])
    result = common.run_trainer(
        flags, os.path.join(scratch, "-".join(map(str, cell)) + f"-{repeat}"),
        module=module,
        launcher_flags=launcher_of(cell) if launcher_of else None)
    common.log(f"repeat {repeat + 1}/{repeats} {describe(cell, result)}")
    return {"cell": list(cell), "repeat": repeat, "flags": flags,
            "result": result}

  return run_interleaved(cells, repeats, run_one, redo_busy=redo_busy)


def values_by_side(runs: Sequence[dict],
                   key: Union[str, Callable[[dict], float]],
                   *, side_field: str = "side",
                   repeat_field: str = "repeat") -> Dict[Hashable, List]:
  """{side: [value per repeat, in repeat order]} from run records.

  `key` is a field name or a function of the record. Sides are paired by
  repeat: a side missing from a repeat gets None there.
  """
  get = key if callable(key) else (lambda r: r[key])
  repeats = sorted({r[repeat_field] for r in runs})
  table = {}
  for r in runs:
    side = r[side_field]
    side = tuple(side) if isinstance(side, list) else side
    table.setdefault(side, {})[r[repeat_field]] = get(r)
  return {side: [values.get(k) for k in repeats]
          for side, values in table.items()}


def verdict(summary: dict, target: float, direction: str = AT_MOST) -> str:
  """"met", "missed" or "noisy" for a summary against a target.

  Met when the whole interval is on the target's good side, missed when the
  whole interval is on its bad side, noisy otherwise, including when the
  repeats are too few for any interval: a verdict is never declared from a
  median alone.

  Args:
    summary: from `median_interval` or `summarize_ratios` (uses low, high).
    target: the bound, e.g. 1.02 for "at most 2% slower".
    direction: AT_MOST (values at or below the target are good) or
      AT_LEAST (at or above are good).

  Raises:
    ValueError: an unknown direction.
  """
  if direction not in (AT_MOST, AT_LEAST):
    raise ValueError(f"direction: got {direction!r}; allowed: {AT_MOST}, "
                     f"{AT_LEAST}")
  low, high = summary.get("low"), summary.get("high")
  if low is None or high is None:
    return NOISY
  if direction == AT_MOST:
    if high <= target:
      return MET
    return MISSED if low > target else NOISY
  if low >= target:
    return MET
  return MISSED if high < target else NOISY


def verdict_within(summary: dict, bound: float) -> str:
  """"met", "missed" or "noisy" for a signed summary against +-bound: met
  when the whole interval lies within [-bound, bound], missed when it lies
  wholly beyond one end, noisy otherwise (no interval included)."""
  low, high = summary.get("low"), summary.get("high")
  if low is None or high is None:
    return NOISY
  if -bound <= low and high <= bound:
    return MET
  return MISSED if low > bound or high < -bound else NOISY


def judge(summary: dict, target: float, direction: str = AT_MOST) -> dict:
  """The summary with its target, direction and verdict added (a copy)."""
  judged = dict(summary)
  judged.update(target=target, direction=direction,
                verdict=verdict(summary, target, direction))
  return judged


def describe(judged: dict, digits: int = 3) -> str:
  """One line of prose for a judged summary.

  The verdict is recomputed by `verdict`, not read from `judged`, so a line
  can never say something the interval does not.
  """
  direction = judged["direction"]
  bound = "at most" if direction == AT_MOST else "at least"
  said = verdict(judged, judged["target"], direction)
  return (f"{said}: {format_interval(judged, digits)}, "
          f"target {bound} {judged['target']:g}")


def payload_fields(host_by_group: Dict[str, dict]) -> dict:
  """What every results file records about how it was measured.

  Args:
    host_by_group: {group name: the "host" of one `run_interleaved`}, one
      per interleaved group (a preset, a section).
  """
  return {"harness": {
      "interleaving": "rotation: repeat r starts at side r mod (sides)",
      "interval": "order statistics of the median of per-repeat ratios",
      "requested_confidence": DEFAULT_CONFIDENCE,
      "busy_load_per_core": BUSY_LOAD_PER_CORE,
      "busy_foreign_cpu_frac": BUSY_FOREIGN_CPU_FRAC,
      "busy_steal_frac": BUSY_STEAL_FRAC,
      "host_busy": any(h["busy"] for h in host_by_group.values()),
      "host": host_by_group,
  }}


def per_config(payload: dict, summarize: Callable[..., object]) -> dict:
  """{config name: summarize(its runs)} for a payload whose "configs" name
  the presets and whose runs say their "config"."""
  return {name: summarize([r for r in payload["runs"]
                           if r["config"] == name])
          for name in payload["configs"]}


@dataclasses.dataclass(frozen=True)
class Measured:
  """What one benchmark run measured, for `main` to write and print.

  Attributes:
    fields: the results-file fields this benchmark records besides those
      every one records (its "summary" too, unless `main` computes it).
    hosts: {group name: the "host" of one `run_interleaved`}.
    num_runs: trainer and probe runs, for the closing line; None where the
      benchmark does not count them.
  """
  fields: dict
  hosts: Dict[str, dict]
  num_runs: Optional[int]

  @classmethod
  def of_group(cls, record: dict, group: str = "all",
               **fields) -> "Measured":
    """A benchmark measured as one interleaved group: its `run_interleaved`
    record's runs and host load, and the benchmark's own `fields`."""
    return cls(fields={"runs": record["runs"], **fields},
               hosts={group: record["host"]}, num_runs=len(record["runs"]))


def measure_config_sides(configs: Dict[str, dict], repeats: int,
                         scratch_root: str, *,
                         sides_of: Callable[[str], Sequence[str]],
                         run_side: Callable[[str, str, str], dict],
                         describe: Callable[[dict], str],
                         redo_busy: int = 0, side_field: str = "side",
                         **fields) -> Measured:
  """Measures every side of every preset ("config"), all in one rotation.

  One rotation over all presets' sides, not one per preset, so that one
  repeat covers every cell within minutes of each other and a slow stretch
  of the machine hits every preset and side of one repeat, not all repeats
  of one of them.

  Args:
    configs: {preset name: its config}, recorded as "configs".
    repeats, redo_busy: as `run_interleaved`'s.
    scratch_root: every run gets a new directory below it
      (`common.make_run_dir`).
    sides_of: a preset's sides, by its name.
    run_side: run_side(preset name, side, run directory) runs one side once
      and returns its result.
    describe: the progress line's text for a result.
    side_field: the run records' name for the side ("framework" where the
      sides are the frameworks).
    **fields: the benchmark's own results-file fields.

  Returns:
    The `Measured` whose runs are {"config", side_field, "repeat",
    "result"}, and which records the trainers' quiet flags too.
  """
  def run_one(cell, repeat):
    name, side = cell
    scratch = common.make_run_dir(scratch_root, f"{name}-{side}-{repeat}")
    result = run_side(name, side, scratch)
    common.log(f"repeat {repeat + 1}/{repeats} {name} {side}: "
               f"{describe(result)}")
    return {"config": name, side_field: side, "repeat": repeat,
            "result": result}

  cells = [(name, side) for name in configs for side in sides_of(name)]
  record = run_interleaved(cells, repeats, run_one, redo_busy=redo_busy)
  return Measured.of_group(
      record, configs=configs,
      quiet_trainer_flags=list(common.QUIET_TRAINER_FLAGS), **fields)


def main_per_config(name: str, args, measure: Callable[[int, str], Measured],
                    *, default_repeats: int,
                    summarize_runs: Callable[..., object],
                    format_summary: Callable[[list, dict], str]) -> None:
  """`main` for a driver whose results are per preset ("configs").

  Args:
    name, args, measure, default_repeats: as `main`'s.
    summarize_runs: summarizes one preset's runs (see `per_config`).
    format_summary: the table, from the configs and their summaries.
  """
  main(name, args, measure, default_repeats=default_repeats,
       summarize=lambda payload: per_config(payload, summarize_runs),
       table=lambda payload: format_summary(payload["configs"],
                                            payload["summary"]))


def main(name: str, args, measure: Callable[[int, str], Measured], *,
         default_repeats: int, table: Callable[[dict], str],
         summarize: Optional[Callable[[dict], object]] = None,
         results_name: Optional[str] = None) -> None:
  """Every benchmark driver's main(), once its flags are parsed.

  Runs `measure(repeats, scratch_dir)`, writes the results file (its own
  fields, the summary, and what every one records: the command, machine,
  repeats, wall time and `payload_fields`) and prints `table` of it. With
  `args.resummarize` set, it only recomputes the summary of that results
  file, rewrites it and prints the table: a change to a summary reaches old
  runs without running them again.

  Args:
    name: the benchmark, as its results file records it.
    args: the parsed flags of `common.add_common_args`.
    measure: measure(repeats, scratch_dir) runs the benchmark; scratch_dir
      is removed afterwards.
    default_repeats: repeats without --repeats or --quick.
    table: the printed tables, from the results file's payload.
    summarize: the summary, from a payload without it; None where
      `measure` puts the summary in its fields (no --resummarize then).
    results_name: the results file's name (default `name`).
  """
  if summarize is not None and args.resummarize:
    with open(args.resummarize, encoding="utf-8") as f:
      payload = json.load(f)
    payload["summary"] = summarize(payload)
    common.write_results(args.resummarize, payload)
    print(table(payload))
    return
  repeats = common.resolve_repeats(args, default_repeats)
  machine = common.describe_machine()
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="tfo-bench-") as scratch:
    try:
      measured = measure(repeats, scratch)
    except common.BenchmarkError as e:
      # A run that failed ends the benchmark with its command and cause,
      # not with the driver's traceback above them.
      raise SystemExit(f"{name}: {e}") from None
  payload = {"benchmark": name, "command": common.command_line(),
             "quick": args.quick, "repeats": repeats, "machine": machine,
             **measured.fields,
             "total_wall_s": time.perf_counter() - start}
  if summarize is not None:
    payload["summary"] = summarize(payload)
  payload.update(payload_fields(measured.hosts))
  path = common.result_path(results_name or name, args)
  common.write_results(path, payload)
  print(table(payload))
  done = (f"{measured.num_runs} runs" if measured.num_runs is not None
          else "done")
  print(f"\n{done} in {payload['total_wall_s']:.0f} s; results: "
        f"{os.path.relpath(path, common.REPO_ROOT)}")
