"""The comparison's report directory: report.md, results.csv and runs.csv.

report.md is what a reader opens: what ran, the findings in plain words,
the definitions, then per group (framework x workload) the cell table, the
serial components, what each optimization did in every context, the
slow-downs and interference, and the cells that failed or were refused.
results.csv has one row per cell (the medians the tables show) and runs.csv
one per run (the numbers copied from its run.json), for plotting elsewhere.
"""

import csv
import io
import os
import statistics
from typing import Dict, List, Optional, Sequence

from overlap_compare import findings as compare_findings
from overlap_compare import comparison as comparison_lib
from overlap_compare import metrics as overlap_metrics
from overlap_compare.comparison import Comparison, GroupKey
from overlap_compare.matrix import Cell
from overlap_core.runtime import intervals

REPORT_NAME = "report.md"
RESULTS_NAME = "results.csv"
RUNS_NAME = "runs.csv"
# Written by compare_plots; the report links the ones that exist.
PLOT_NAMES = ("throughput.png", "breakdown.png", "efficiency.png")
PHASE_COLUMNS = overlap_metrics.STEP_PHASES
# results.csv's pipeline columns, blank for a cell not pipelined.
PIPELINE_COLUMNS = (
    "pipeline_schedule", "pipeline_stages", "pipeline_micro_batches",
    "pipeline_virtual_stages", "pipeline_replicas", "bubble_fraction",
    "bubble_fraction_theory", "bubble_source", "stage_compute_ms",
    "stage_update_ms", "stage_transfer_ms", "stage_bubble_ms",
    *(f"stage_idle_{part}_ms" for part in overlap_metrics.IDLE_PARTS),
    "idle_explained", "stage_saved_activation_peak_bytes",
    "all_reduce_overlapped")
# How the report names each part of a stage's idle time.
IDLE_PART_LABELS = {
    "fill_drain": "fill & drain", "imbalance": "imbalance",
    "transfer": "transfer", "loss_and_update": "loss & update",
    "residual": "residual"}

DEFINITIONS = """\
- **Cell numbers** are those of the cell's median repeat: the successful
  run whose mean step time is the median (of an even number, the faster of
  the two middle ones). Throughput is its run.json `samples_per_second`
  (steady-state steps only), and the step and each phase its
  `phases.<name>.mean`, in ms per step, so they add up. A checkpoint's
  stall is spread over all steps. The range is the repeats' min-max.
- **×base** = throughput / the baseline cell's throughput (the cell with
  every axis on its first setting). **×best single** = throughput / the
  highest throughput of the cells that move exactly one axis.
- **Overlap efficiency.** The baseline cell provides the serial components:
  D = its data wait, C = its compute, K = its checkpoint stall, O = its
  other time. serial = D + C + K + O (the baseline's step);
  ideal = max(D, C, K) + O (every component hidden behind the longest, none
  slowed by sharing). For a cell whose step is S,
  efficiency = (serial - S) / (serial - ideal). 0 is no better than serial,
  100% is the ideal. Shown clipped to [0, 100%]; the raw value is in
  results.csv. Raw below 0 means slower than serial ("<0"); above 1 means an
  optimization made a component itself cheaper, e.g. data parallelism
  shrinking compute (">1"). It is undefined ("n/a") when serial - ideal is
  under 2% of serial.
- **Resource bound.** The ideal assumes every component has resources of
  its own; on a CPU host they share the cores. A cell's work W is the CPU
  time its processes spent per step (all threads, DataLoader workers and
  every worker of a multi-worker job), and W / cores the shortest step
  that work allows. bound = max(ideal, W / cores); the resource efficiency
  is bound / S. A cell within the noise of its bound **hit the machine's
  limit** when W / cores set it (it reached the **critical-path ideal**
  otherwise); a cell above it **lost to interference**. "Within" allows
  10%: no step keeps every core busy throughout, its threads wait on one
  another at hand-offs. With 5 repeats or more, each repeat's step is
  held against its own bound (its own W): the interval of S / bound
  wholly within 1.10 is at the bound, wholly beyond it interference, and
  across it the cell **could not be placed**. With fewer, S within the
  larger of 10% and the cell's spread of the bound is at it. Threads that
  spin while waiting count as work, so W errs high. Blank where the runs
  recorded no CPU times.
- **Where combining stops paying.** The best combination's step over the
  best single optimization's, taken within each repeat (every repeat runs
  every cell once, so a pair shares the host's load), gives per-repeat
  ratios; their median's order-statistics interval (90% asked; 5 repeats
  reach 94%) decides: wholly below 1, combining **paid off**; wholly above
  1, it **lost**; across 1, **even**. With too few repeats for an interval
  (fewer than 5), the throughput ratio is held against the slow-down
  tolerance below instead, and the evidence column says "noise".
- **Slow-down.** Adding setting x to cell P made it slower when, with an
  interval, the interval of step(P + x) / step(P) paired by repeat lies
  wholly above 1 and its median above 1 + the noise floor; with fewer
  repeats, when step(P + x) > step(P) x (1 + tolerance). The tolerance is
  the larger of the noise floor and both cells' spread across repeats
  ((max - min) of their step times, over the median repeat's). When P already had an optimization, it is
  **interference**: the combination lost to one of its parts. "All parts"
  marks a combination slower than every cell that drops one of its
  settings. Phases named grew by at least a fifth of the step's growth.
- **Pipelines.** A pipelined run splits its compute into stage compute,
  transfer and bubble per stage (run.json `pipeline`); the cell tables
  count all three as compute, and "Pipelines side by side" shows them
  apart, ms per step of each stage in stage order. The bubble is the
  stages' summed bubble over their summed step time, beside the
  schedule's own (S-1)/(M+S-1); "derived" marks a bubble that is the
  step's remainder after parts timed alone, not waits timed in the step.
  "Where each stage's idle time goes" splits a stage's idle time (bubble
  and transfer) into fill & drain (the schedule's own), imbalance
  (waiting on a slower neighbour beyond it), transfer (posting sends and
  receives), loss & update (waiting on the last stage's loss or a
  neighbour's longer optimizer step) and the residual the four leave;
  "explained" when every stage's residual is within the stated share of
  its step (run.json `pipeline.bubble_parts`). Saved activations are the
  most bytes of tensors saved for backward a stage held at once (1F1B's
  point: fewer than GPipe's).
- **Exposed comm** is the all-reduce the step waited for after backward's
  last gradient (PyTorch's DDP and Horovod; "n/a" where a run did not
  measure it: no all-reduce, or TensorFlow's, inside its compiled step).
  It is part of the compute column, as the ideal counts it.
- **Verdict** names the phase that bounds the median repeat's steps: a
  phase other than compute at 5% of the step or more (the largest wins;
  "highly" from 20%, the TensorFlow profiler's input-bound cuts), else
  compute-bound (`overlap_core.runtime.verdict`).
"""


def write_report_dir(comparison: Comparison, output_dir: str) -> Dict[str, str]:
  """Writes report.md, results.csv and runs.csv; returns {name: path}."""
  os.makedirs(output_dir, exist_ok=True)
  paths = {}
  for name, text in ((REPORT_NAME, format_report(comparison, output_dir)),
                     (RESULTS_NAME, format_results_csv(comparison)),
                     (RUNS_NAME, format_runs_csv(comparison, output_dir))):
    path = os.path.join(output_dir, name)
    with open(path, "w", encoding="utf-8", newline="") as f:
      f.write(text)
    paths[name] = path
  return paths


def _ms(seconds: Optional[float]) -> str:
  return "" if seconds is None else f"{1e3 * seconds:.1f}"


def _ratio(value: Optional[float]) -> str:
  return "" if value is None else f"{value:.2f}"


def _pct(value: float) -> str:
  return f"{100 * value:+.0f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _efficiency_text(eff: Optional[overlap_metrics.Efficiency]) -> str:
  if eff is None:
    return "n/a"
  if eff.raw < 0:
    return "<0"
  if eff.raw > 1:
    return ">1"
  return f"{100 * eff.value:.0f}%"


def _bound_cells(stats, bound: Optional[overlap_metrics.ResourceBound]
                 ) -> List[str]:
  """Work, bound and verdict columns; blank without CPU times."""
  if bound is None:
    return ["", "", ""]
  return [_ms(stats.work_s), _ms(bound.bound_s),
          f"{100 * bound.efficiency:.0f}%: {bound.verdict}"]


# ------------------------------------------------------------------ report


def format_report(comparison: Comparison, output_dir: str) -> str:
  """The whole report.md text."""
  out = io.StringIO()
  meta = comparison.meta
  out.write(f"# {meta.get('title', 'Overlap comparison')}\n\n")
  if meta.get("summary"):
    out.write(meta["summary"].strip() + "\n\n")
  out.write(_plan_section(comparison))
  out.write("\n## Findings\n\n")
  for line in compare_findings.overall_findings(comparison):
    out.write(f"- {line}\n")
  rows = compare_findings.combining_rows(comparison)
  if rows:
    out.write("\nWhere combining stops paying: the best single optimization "
              "against the best combination (×base: speed-up over the "
              "baseline).\n\n" +
              _table(["group", "best single", "best combination",
                      "combination / single", "evidence", "verdict"],
                     rows) +
              "\n")
  for key in comparison.groups():
    out.write(f"\n**{comparison.group_label(key)}**\n\n")
    for line in compare_findings.group_findings(comparison, key):
      out.write(f"- {line}\n")
  out.write("\n## Definitions\n\n" + DEFINITIONS)
  if len(comparison.frameworks) > 1:
    out.write(_frameworks_section(comparison))
  out.write(_pipelines_section(comparison))
  for key in comparison.groups():
    out.write(_group_section(comparison, key))
  out.write(_problems_section(comparison))
  out.write(_plots_section(output_dir))
  return out.getvalue()


def _plan_section(comparison: Comparison) -> str:
  meta = comparison.meta
  out = io.StringIO()
  out.write("## What ran\n\n")
  rows = [(k, f"`{v}`" if k == "command" else v)
          for k, v in meta.items() if k not in ("title", "summary")]
  rows += list(comparison.sources().items())
  versions = comparison.framework_versions()
  if versions:
    rows.append(("frameworks", ", ".join(f"{f} {v}"
                                         for f, v in versions.items())))
  num_runs = len(comparison.outcomes)
  rows.append(("runs", f"{num_runs} trainer processes"))
  out.write(_table(["", ""], rows) + "\n\n")
  out.write("Matrix axes (the first setting is the baseline):\n\n")
  for axis in comparison.matrix.axes:
    settings = ", ".join("+".join(s) for s in axis.settings)
    out.write(f"- `{axis.name}`: {settings}\n")
  if comparison.workloads.axes:
    out.write("\nWorkloads (each is its own group, with its own "
              "baseline):\n\n")
    for axis in comparison.workloads.axes:
      out.write(f"- `{axis.name}`: "
                f"{', '.join('+'.join(s) for s in axis.settings)}\n")
  return out.getvalue()


def _frameworks_section(comparison: Comparison) -> str:
  out = io.StringIO()
  out.write("\n## Frameworks side by side (samples/s, median repeat)\n\n")
  for workload in comparison.workloads.cells():
    if comparison.workloads.axes:
      out.write(f"**{comparison.workloads.full_label(workload)}**\n\n")
    headers = ["cell"] + list(comparison.frameworks)
    rows = []
    for cell in comparison.matrix.cells():
      row = [comparison.matrix.label(cell)]
      for framework in comparison.frameworks:
        result = comparison.results.get((framework, workload), {}).get(cell)
        row.append(_throughput_text(result, with_range=False))
      rows.append(row)
    out.write(_table(headers, rows) + "\n\n")
  return out.getvalue()


def _pipelines_section(comparison: Comparison) -> str:
  """Each framework's pipeline beside the other's, per pipelined cell;
  "" when no run was pipelined."""
  out = io.StringIO()
  for workload in comparison.workloads.cells():
    results = {f: comparison.results.get((f, workload), {})
               for f in comparison.frameworks}
    cells = [c for c in comparison.matrix.cells() if any(
        r.get(c) is not None and r[c].stats is not None and
        r[c].stats.pipeline is not None for r in results.values())]
    if not cells:
      continue
    if comparison.workloads.axes:
      out.write(f"**{comparison.workloads.full_label(workload)}**\n\n")
    headers = ["cell"]
    for framework in comparison.frameworks:
      headers += [f"{framework} S×M schedule",
                  f"{framework} bubble (theory)",
                  f"{framework} stage compute ms",
                  f"{framework} of which update ms",
                  f"{framework} transfer ms"]
    rows = []
    for cell in cells:
      row = [comparison.matrix.label(cell)]
      for framework in comparison.frameworks:
        row += _pipeline_cells(results[framework].get(cell))
      rows.append(row)
    out.write(_table(headers, rows) + "\n\n")
  if not out.getvalue():
    return ""
  return ("\n## Pipelines side by side (median repeat)\n\n"
          "Per stage, ms per step, in stage order; the bubble is measured "
          "(theory: (S-1)/(M+S-1)).\n\n" + out.getvalue() +
          _idle_parts_section(comparison))


def _idle_parts_section(comparison: Comparison) -> str:
  """One row per pipelined cell, framework and stage: its idle time in
  parts and its saved activations; "" when no run took its idle apart."""
  rows = []
  for workload in comparison.workloads.cells():
    for cell in comparison.matrix.cells():
      for framework in comparison.frameworks:
        result = comparison.results.get((framework, workload), {}).get(cell)
        pipe = result.stats.pipeline if result and result.stats else None
        if pipe is None or (pipe.idle_parts_ms is None and not any(
            b is not None for b in pipe.saved_activation_peak_bytes)):
          continue
        label = comparison.matrix.label(cell)
        if comparison.workloads.axes:
          label = f"{comparison.workloads.full_label(workload)}: {label}"
        explained = ("" if pipe.idle_explained is None else
                     " (explained)" if pipe.idle_explained
                     else " (not explained)")
        parts = pipe.idle_parts_ms or ({},) * pipe.stages
        peaks = pipe.saved_activation_peak_bytes or (None,) * pipe.stages
        for stage, (part, peak) in enumerate(zip(parts, peaks)):
          rows.append([label, framework + explained, str(stage)] + [
              _part_ms(part.get(key)) for key in
              ["step_ms", "idle_ms"] +
              [f"{p}_ms" for p in overlap_metrics.IDLE_PARTS]] +
                      [_mib(peak)])
  if not rows:
    return ""
  headers = (["cell", "framework", "stage", "step ms", "idle ms"] +
             [f"{IDLE_PART_LABELS[p]} ms" for p in overlap_metrics.IDLE_PARTS]
             + ["saved activations MiB"])
  return ("### Where each stage's idle time goes\n\n" +
          _table(headers, rows) + "\n\n")


def _part_ms(value: Optional[float]) -> str:
  return "n/a" if value is None else f"{value:.1f}"


def _mib(value: Optional[int]) -> str:
  return "n/a" if value is None else f"{value / 2**20:.2f}"


def _per_stage_ms(values) -> str:
  if not values or any(v is None for v in values):
    return "n/a"
  return " / ".join(f"{v:.1f}" for v in values)


def _pipeline_cells(result) -> List[str]:
  """One framework's five pipeline columns for one cell."""
  pipe = result.stats.pipeline if result and result.stats else None
  if pipe is None:
    text = ("not pipelined" if result is not None and result.stats
            else _throughput_text(result))
    return [text] + [""] * 4
  schedule = pipe.schedule + (f", V={pipe.virtual_stages}"
                              if pipe.virtual_stages > 1 else "")
  if pipe.replicas > 1:
    schedule += f", {pipe.replicas} replicas"
  bubble = ("n/a" if pipe.bubble_fraction is None
            else f"{100 * pipe.bubble_fraction:.1f}%")
  if pipe.bubble_fraction_theory is not None:
    bubble += f" ({100 * pipe.bubble_fraction_theory:.1f}%)"
  if pipe.bubble_source == "derived":
    bubble += ", derived"
  return [f"{pipe.stages}×{pipe.micro_batches} {schedule}", bubble,
          _per_stage_ms(pipe.compute_ms), _per_stage_ms(pipe.update_ms),
          _per_stage_ms(pipe.transfer_ms)]


def _throughput_text(result, with_range=True) -> str:
  if result is None:
    return "not run"
  if result.status == comparison_lib.UNSUPPORTED:
    return "not supported"
  if result.status == comparison_lib.FAILED:
    return "failed"
  s = result.stats
  text = f"{s.samples_per_second:.0f}"
  if with_range and len(s.runs_samples_per_second) > 1:
    text += (f" [{min(s.runs_samples_per_second):.0f}-"
             f"{max(s.runs_samples_per_second):.0f}]")
  return text


def _group_section(comparison: Comparison, key: GroupKey) -> str:
  analysis = comparison.analyses[key]
  out = io.StringIO()
  out.write(f"\n## {comparison.group_label(key)}\n\n")
  headers = ["cell", "runs ok", "samples/s [range]", "×base", "×best single",
             "step ms", "data wait", "compute", "ckpt stall", "other",
             "overlap eff.", "work CPU-ms", "bound ms", "vs bound",
             "exposed comm", "verdict"]
  rows = []
  for cell in comparison.cells(key):
    result = comparison.results[key][cell]
    row = [comparison.matrix.label(cell),
           f"{result.num_ok}/{result.num_runs}", _throughput_text(result)]
    if result.stats is None:
      rows.append(row + [""] * (len(headers) - len(row)))
      continue
    s = result.stats
    row += [_ratio(analysis.speedup_vs_baseline[cell]),
            _ratio(analysis.speedup_vs_best_single[cell]), _ms(s.step_s)]
    row += [_ms(s.phases_s[p]) for p in PHASE_COLUMNS]
    row.append(_efficiency_text(analysis.efficiency[cell]))
    row += _bound_cells(s, analysis.resource_bound[cell])
    # Exposed all-reduce is inside compute here (the ideal adds it back);
    # shown apart, so the all-reduce knobs show the phase they move.
    row += [_exposed_comm_text(s), s.verdict]
    rows.append(row)
  out.write(_table(headers, rows) + "\n")
  out.write(_components_text(comparison, key))
  out.write(_marginal_text(comparison, key))
  out.write(_slowdowns_text(comparison, key))
  return out.getvalue()


def _exposed_comm_text(s) -> str:
  """The exposed all-reduce, "(derived)" where the run derived it from a
  step without it rather than timing it (TensorFlow)."""
  if s.exposed_comm_s is None:
    return "n/a"
  return _ms(s.exposed_comm_s) + (" (derived)" if s.exposed_comm_derived
                                  else "")


def _components_text(comparison: Comparison, key: GroupKey) -> str:
  comp = comparison.analyses[key].components
  if comp is None:
    return "\nThe baseline failed: no serial components, no efficiency.\n"
  rows = [[_ms(comp.data_wait_s), _ms(comp.compute_s),
           _ms(comp.contention_s), _ms(comp.checkpoint_s),
           _ms(comp.other_s), _ms(comp.serial_s), _ms(comp.ideal_s)]]
  return ("\nSerial components from the baseline cell, ms per step (C is "
          "compute timed alone, X what sharing the host added to it; the "
          "ideal leaves X out):\n\n" +
          _table(["D data wait", "C compute", "X contention", "K ckpt stall",
                  "O other", "serial", "ideal"], rows) + "\n")


def _marginal_text(comparison: Comparison, key: GroupKey) -> str:
  effects = comparison.analyses[key].marginal_effects
  if not effects:
    return ""
  rows = []
  for effect in effects:
    alone = comparison.stats(key)
    base_cell = Cell(tuple(effect.choice if i == effect.axis else 0
                           for i in range(len(comparison.matrix.axes))))
    alone_ratio = (comparison.analyses[key].speedup_vs_baseline.get(base_cell)
                   if base_cell in alone else None)
    rows.append([comparison.axis_label(effect.axis, effect.choice),
                 _ratio(alone_ratio), str(len(effect.ratios)),
                 _ratio(statistics.median(effect.ratios)),
                 f"{min(effect.ratios):.2f}-{max(effect.ratios):.2f}"])
  return ("\nWhat each setting did when added (throughput with / without "
          "it), alone and over every context measured:\n\n" +
          _table(["setting", "alone", "contexts", "median", "range"], rows) +
          "\n")


def _slowdowns_text(comparison: Comparison, key: GroupKey) -> str:
  slowdowns = comparison.analyses[key].slowdowns
  if not slowdowns:
    return "\nNo slow-downs beyond the noise.\n"
  rows = []
  for s in slowdowns:
    stats = comparison.stats(key)
    rows.append([
        "interference" + (" (all parts)" if s.slower_than_all_parts else "")
        if s.is_interference else "slower alone",
        comparison.axis_label(s.added_axis, s.cell.choices[s.added_axis]),
        comparison.matrix.label(s.reference),
        f"{_ms(stats[s.reference].step_s)} -> {_ms(stats[s.cell].step_s)}",
        f"{_pct(s.slowdown_frac)} " + (
            f"(per repeat {intervals.format_interval(s.step_ratio, 2)})"
            if overlap_metrics.ratio_verdict(s.step_ratio) else
            f"(tol. {100 * s.tolerance_frac:.0f}%)"),
        compare_findings.phases_text(s.grown_phases) or "none alone"])
  return ("\nSlow-downs: adding a setting made the step slower.\n\n" +
          _table(["kind", "added", "to", "step ms", "slow-down",
                  "phases that grew"], rows) + "\n")


def _problems_section(comparison: Comparison) -> str:
  rows = []
  for key in comparison.groups():
    for cell in comparison.cells(key):
      result = comparison.results[key][cell]
      if result.errors:
        status = ("not supported by " + key[0]
                  if result.status == comparison_lib.UNSUPPORTED else
                  f"{result.num_runs - result.num_ok} of {result.num_runs} "
                  "runs failed")
        rows.append([comparison.group_label(key),
                     comparison.matrix.label(cell), status,
                     " / ".join(e.replace("|", "\\|") for e in
                                result.errors)])
  if not rows:
    return "\n## Failed or refused cells\n\nNone.\n"
  return ("\n## Failed or refused cells\n\n" +
          _table(["group", "cell", "status", "error"], rows) + "\n")


def _plots_section(output_dir: str) -> str:
  names = [n for n in PLOT_NAMES
           if os.path.exists(os.path.join(output_dir, n))]
  if not names:
    return ""
  return "\n## Plots\n\n" + "".join(f"![{n[:-4]}]({n})\n\n" for n in names)


# --------------------------------------------------------------------- CSV


def _axis_columns(comparison: Comparison) -> List[str]:
  return ([a.name for a in comparison.workloads.axes] +
          [a.name for a in comparison.matrix.axes])


def _axis_values(comparison: Comparison, workload: Cell, cell: Cell
                 ) -> List[str]:
  values = []
  for matrix, point in ((comparison.workloads, workload),
                        (comparison.matrix, cell)):
    values += ["+".join(a.settings[c])
               for a, c in zip(matrix.axes, point.choices)]
  return values


def _csv_text(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(headers)
  writer.writerows(rows)
  return out.getvalue()


def _num(value: Optional[float], digits: int = 6) -> str:
  return "" if value is None else f"{value:.{digits}g}"


def _pipeline_csv(pipe: Optional[overlap_metrics.PipelineStats]
                  ) -> List[str]:
  """The PIPELINE_COLUMNS of one cell; per-stage lists joined by ';'."""
  if pipe is None:
    return [""] * len(PIPELINE_COLUMNS)

  def per_stage(values):
    return ";".join(_num(v) for v in values)

  return [pipe.schedule, _num(pipe.stages), _num(pipe.micro_batches),
          _num(pipe.virtual_stages), _num(pipe.replicas),
          _num(pipe.bubble_fraction), _num(pipe.bubble_fraction_theory),
          pipe.bubble_source, per_stage(pipe.compute_ms),
          per_stage(pipe.update_ms), per_stage(pipe.transfer_ms),
          per_stage(pipe.bubble_ms)] + [
              per_stage(r[f"{part}_ms"] for r in pipe.idle_parts_ms)
              if pipe.idle_parts_ms else ""
              for part in overlap_metrics.IDLE_PARTS] + [
                  _flag(pipe.idle_explained),
                  ";".join("" if b is None else str(b)
                           for b in pipe.saved_activation_peak_bytes),
                  _flag(pipe.all_reduce_overlapped)]


def _flag(value: Optional[bool]) -> str:
  return "" if value is None else str(value).lower()


def format_results_csv(comparison: Comparison) -> str:
  """One row per cell: the medians and metrics the report shows."""
  headers = (["framework", "group", "cell", "num_optimizations"] +
             _axis_columns(comparison) +
             ["status", "runs_ok", "runs", "samples_per_second",
              "samples_per_second_min", "samples_per_second_max", "step_ms"] +
             [f"{p}_ms" for p in PHASE_COLUMNS] +
             ["step_spread", "speedup_vs_baseline", "speedup_vs_best_single",
              "overlap_efficiency", "overlap_efficiency_raw",
              "checkpoint_interval_s", "work_cpu_ms", "cores",
              "resource_bound_ms", "resource_efficiency",
              "step_over_bound_low", "step_over_bound_high",
              "resource_verdict"] + list(PIPELINE_COLUMNS) +
             ["exposed_comm_ms", "verdict", "error"])
  rows = []
  for key in comparison.groups():
    analysis = comparison.analyses[key]
    for cell in comparison.cells(key):
      result = comparison.results[key][cell]
      row = [key[0], comparison.group_label(key), comparison.matrix.label(cell),
             len(cell.optimizations)] + _axis_values(comparison, key[1], cell)
      row += [result.status, result.num_ok, result.num_runs]
      s = result.stats
      if s is None:
        row += [""] * (len(headers) - len(row) - 1)
      else:
        eff = analysis.efficiency[cell]
        row += [_num(s.samples_per_second),
                _num(min(s.runs_samples_per_second)),
                _num(max(s.runs_samples_per_second)), _num(1e3 * s.step_s)]
        row += [_num(1e3 * s.phases_s[p]) for p in PHASE_COLUMNS]
        row += [_num(s.step_spread),
                _num(analysis.speedup_vs_baseline[cell]),
                _num(analysis.speedup_vs_best_single[cell]),
                _num(eff.value if eff else None),
                _num(eff.raw if eff else None),
                _num(s.checkpoint_interval_s)]
        bound = analysis.resource_bound[cell]
        ratio = (bound.step_over_bound if bound else None) or {}
        row += [_num(1e3 * s.work_s if s.work_s is not None else None),
                _num(s.cores),
                _num(1e3 * bound.bound_s if bound else None),
                _num(bound.efficiency if bound else None),
                _num(ratio.get("low")), _num(ratio.get("high")),
                bound.verdict if bound else ""]
        row += _pipeline_csv(s.pipeline)
        row += [_num(None if s.exposed_comm_s is None
                     else 1e3 * s.exposed_comm_s), s.verdict]
      row.append(" / ".join(result.errors))
      rows.append(row)
  return _csv_text(headers, rows)


def format_runs_csv(comparison: Comparison, output_dir: str) -> str:
  """One row per run, its numbers copied from its run.json."""
  headers = (["framework", "group", "cell", "repeat", "status",
              "samples_per_second", "step_ms"] +
             [f"{p}_ms" for p in PHASE_COLUMNS] +
             ["measured_steps", "wall_s", "run_dir", "error"])
  order = {c: i for i, c in enumerate(comparison.matrix.cells())}
  workload_order = {w: i for i, w in enumerate(comparison.workloads.cells())}
  outcomes = sorted(comparison.outcomes, key=lambda o: (
      workload_order[o.workload], list(comparison.frameworks).index(
          o.framework), order[o.cell], o.repeat))
  rows = []
  for o in outcomes:
    row = [o.framework, comparison.group_label((o.framework, o.workload)),
           comparison.matrix.label(o.cell), o.repeat, o.status]
    if o.record:
      phases = o.record["phases"]
      row += [_num(o.record["samples_per_second"]),
              _num(1e3 * phases["step"]["mean"])]
      row += [_num(1e3 * phases.get(p, {}).get("mean", 0.0))
              for p in PHASE_COLUMNS]
      row.append(o.record["measured_steps"])
    else:
      row += [""] * (3 + len(PHASE_COLUMNS))
    row += [f"{o.wall_s:.1f}", os.path.relpath(o.run_dir, output_dir),
            o.error]
    rows.append(row)
  return _csv_text(headers, rows)
