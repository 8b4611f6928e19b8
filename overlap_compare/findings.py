"""The findings of a comparison, in plain words, from its numbers.

For each group (framework x workload): the baseline and the fastest cell,
the best single optimization, whether the best combination beat it beyond
the noise, and the largest interference; and, where the runs recorded CPU
times, whether the best combination and the worst interference hit the
machine's limit or lost to interference (`metrics.ResourceBound`). Over
all groups: how often combining paid off. The report puts these first.
"""

from typing import List, Tuple

from overlap_compare import metrics as overlap_metrics
from overlap_compare.comparison import Comparison, GroupKey
from overlap_compare.matrix import Cell
from overlap_core.runtime import intervals

# How the best combination fared against the best single optimization.
PAID_OFF, LOST, EVEN = "paid off", "lost", "even"
# Opens the evidence of a verdict decided by ratios paired by repeat.
PAIRED_EVIDENCE = "step ratio per repeat"


def _pct(value: float) -> str:
  return f"{100 * value:+.0f}%"


def phases_text(grown) -> str:
  """`compute +12.0 ms, data_wait +1.2 ms` for a slow-down's grown phases."""
  return ", ".join(f"{p} +{1e3 * g:.1f} ms" for p, g in grown)


def _exceeded_text(bound) -> str:
  """A step under its lower bound: which measured parts are off."""
  if bound.machine_limited:
    return (f"{bound.verdict}: the step beat "
            f"the work over the cores ({1e3 * bound.work_bound_s:.1f} ms), "
            "so the CPU times counted more than the step used")
  parts = bound.parts
  alone = ", C timed alone" if parts is not None and parts.contention_s else ""
  named = ("" if parts is None else
           f" (D {1e3 * parts.data_wait_s:.1f}, C {1e3 * parts.compute_s:.1f},"
           f" K {1e3 * parts.checkpoint_s:.1f}, O {1e3 * parts.other_s:.1f} "
           f"ms{alone})")
  return (f"{bound.verdict}: the step beat the "
          f"critical-path ideal {1e3 * bound.ideal_s:.1f} ms = max(D, C, K) "
          f"+ O, whose parts{named} come from the baseline cell")


def bound_text(bound) -> str:
  """Where a cell stands against its resource bound, in one sentence."""
  if bound.exceeded:
    text = _exceeded_text(bound)
  else:
    text = (f"it {bound.verdict}: its step is {bound.efficiency:.0%} as "
            f"short as the bound allows ({1e3 * bound.bound_s:.1f} ms: the "
            f"work over the cores {1e3 * bound.work_bound_s:.1f} ms, the "
            f"critical-path ideal {1e3 * bound.ideal_s:.1f} ms)")
  ratio = bound.step_over_bound
  if ratio is not None and ratio.get("low") is not None:
    text += (f"; step over bound per repeat "
             f"{intervals.format_interval(ratio, digits=2)}")
  return text


def _tolerance(comparison: Comparison, *stats) -> float:
  return max([comparison.noise_floor] + [s.step_spread for s in stats])


def group_findings(comparison: Comparison, key: GroupKey) -> List[str]:
  """Plain statements about one group, from its numbers."""
  analysis = comparison.analyses[key]
  stats = comparison.stats(key)
  label = comparison.matrix.label
  if not stats:
    return ["No cell produced results."]
  baseline = next((c for c in stats if c.is_baseline), None)
  lines = []
  fastest = max(stats, key=lambda c: stats[c].samples_per_second)
  if baseline is None:
    lines.append("The baseline did not run, so there are no speed-ups. "
                 f"Fastest: {label(fastest)}, "
                 f"{stats[fastest].samples_per_second:.0f} samples/s.")
    return lines
  lines.append(
      f"Baseline: {stats[baseline].samples_per_second:.0f} samples/s. "
      f"Fastest: {label(fastest)}, "
      f"{stats[fastest].samples_per_second:.0f} samples/s "
      f"(×{analysis.speedup_vs_baseline[fastest]:.2f} over the baseline).")
  single = analysis.best_single
  if single is None:
    return lines
  lines.append(f"Best single optimization: {label(single)} "
               f"(×{analysis.speedup_vs_baseline[single]:.2f}).")
  combos = [c for c in stats if len(c.optimizations) >= 2]
  if combos:
    best = max(combos, key=lambda c: stats[c].samples_per_second)
    lines.append(_combination_verdict(comparison, key, best, single,
                                      "Best combination"))
    if analysis.resource_bound.get(best):
      lines[-1] = (lines[-1][:-1] + "; "
                   + bound_text(analysis.resource_bound[best]) + ".")
    full = [c for c in combos
            if len(c.optimizations) == len(comparison.matrix.axes)]
    if full and len(comparison.matrix.axes) > 2:
      best_full = max(full, key=lambda c: stats[c].samples_per_second)
      if best_full != best:
        lines.append(_combination_verdict(comparison, key, best_full, single,
                                          "With every axis on, the best"))
  interference = [s for s in analysis.slowdowns if s.is_interference]
  if interference:
    worst = max(interference, key=lambda s: s.slowdown_frac)
    lines.append(
        f"{len(interference)} interference finding(s); the largest: adding "
        f"{comparison.axis_label(worst.added_axis, worst.cell.choices[worst.added_axis])}"
        f" to {label(worst.reference)} made the step "
        f"{100 * worst.slowdown_frac:.0f}% slower"
        + (f" (per repeat {intervals.format_interval(worst.step_ratio, 2)})"
           if overlap_metrics.ratio_verdict(worst.step_ratio) else "")
        + (f" ({phases_text(worst.grown_phases)} grew)."
           if worst.grown_phases else "."))
    if analysis.resource_bound.get(worst.cell):
      lines[-1] = (lines[-1][:-1] + "; "
                   + bound_text(analysis.resource_bound[worst.cell]) + ".")
  elif combos:
    lines.append("No combination was slower than its parts beyond the "
                 "noise.")
  lines += _pipeline_findings(comparison, stats)
  return lines


def _pipeline_findings(comparison: Comparison, stats) -> List[str]:
  """Per pipelined cell: which stage wastes the most of its step, and on
  what (`overlap_core.runtime.bubble_parts`)."""
  lines = []
  for cell, cell_stats in stats.items():
    pipe = cell_stats.pipeline
    worst = pipe.most_idle_stage() if pipe else None
    if worst is None:
      continue
    stage, share, part = worst
    text = (f"Pipeline {comparison.matrix.label(cell)}: stage {stage} idles "
            f"{100 * share:.0f}% of its step, most of it "
            f"{part.replace('_', ' ')}")
    if pipe.idle_explained is False:
      text += " (the parts leave more than the tolerance unexplained)"
    lines.append(text + ".")
  return lines


def judge_combination(comparison: Comparison, key: GroupKey, cell: Cell,
                      single: Cell) -> Tuple[str, str]:
  """(verdict, evidence) of a combination against the best single one.

  With enough repeats for an interval, the verdict is where the interval
  of step(cell) / step(single), paired by repeat, lies: below 1 "paid
  off", above 1 "lost", across it "even". With fewer, the throughput
  ratio is held against the noise tolerance (the noise floor, or the
  cells' spread across repeats).
  """
  stats = comparison.stats(key)
  paired = overlap_metrics.paired_step_ratio(stats[cell], stats[single])
  side = overlap_metrics.ratio_verdict(paired)
  if side is not None:
    verdict = {overlap_metrics.FASTER: PAID_OFF,
               overlap_metrics.SLOWER: LOST}.get(side, EVEN)
    return verdict, (f"{PAIRED_EVIDENCE} "
                     + intervals.format_interval(paired, 2))
  ratio = comparison.analyses[key].speedup_vs_best_single[cell]
  tol = _tolerance(comparison, stats[cell], stats[single])
  verdict = PAID_OFF if ratio > 1 + tol else (
      LOST if ratio < 1 - tol else EVEN)
  return verdict, f"±{100 * tol:.0f}% noise"


def _combination_verdict(comparison: Comparison, key: GroupKey, cell: Cell,
                         single: Cell, what: str) -> str:
  ratio = comparison.analyses[key].speedup_vs_best_single[cell]
  verdict, evidence = judge_combination(comparison, key, cell, single)
  said = {
      PAID_OFF: f"combining paid off: {_pct(ratio - 1)} over the best single",
      LOST: f"combining did not pay: {_pct(ratio - 1)} against the best "
            "single",
      EVEN: f"combining changed nothing measurable: {_pct(ratio - 1)} "
            "against the best single",
  }[verdict]
  return f"{what}: {comparison.matrix.label(cell)}; {said} ({evidence})."


def combining_rows(comparison: Comparison) -> List[List[str]]:
  """Per group: best single vs best combination, and the verdict.

  Columns: group, best single (×base), best combination (×base),
  combination / single (throughput), evidence (the paired step ratio's
  interval, or the noise tolerance), verdict (PAID_OFF, LOST, EVEN).
  """
  rows = []
  for key in comparison.groups():
    stats = comparison.stats(key)
    analysis = comparison.analyses[key]
    single = analysis.best_single
    combos = [c for c in stats if len(c.optimizations) >= 2]
    if single is None or not combos:
      continue
    best = max(combos, key=lambda c: stats[c].samples_per_second)
    verdict, evidence = judge_combination(comparison, key, best, single)

    def named(cell):
      speedup = analysis.speedup_vs_baseline[cell]
      return comparison.matrix.label(cell) + (
          f" (×{speedup:.2f})" if speedup is not None else "")

    rows.append([comparison.group_label(key), named(single), named(best),
                 f"{analysis.speedup_vs_best_single[best]:.2f}", evidence,
                 verdict])
  return rows


def overall_findings(comparison: Comparison) -> List[str]:
  """How often combining beat the best single optimization, and the noise."""
  rows = combining_rows(comparison)
  if not rows:
    return []
  counts = {v: sum(1 for r in rows if r[-1] == v)
            for v in (PAID_OFF, LOST, EVEN)}
  lines = [f"Over {len(rows)} group(s), the best combination beat the best "
           f"single optimization beyond the noise in {counts[PAID_OFF]}, "
           f"lost to it in {counts[LOST]}, and was even with it in "
           f"{counts[EVEN]}."]
  num_interference = sum(
      sum(1 for s in comparison.analyses[k].slowdowns if s.is_interference)
      for k in comparison.groups())
  lines.append(f"Interference beyond the noise (a combination slower than "
               f"one of its parts): {num_interference} finding(s).")
  spreads = [(s.step_spread, comparison.group_label(k),
              comparison.matrix.label(c))
             for k in comparison.groups()
             for c, s in comparison.stats(k).items()]
  spread, group, cell = max(spreads)
  if spread > comparison.noise_floor:
    paired = all(r[-2].startswith(PAIRED_EVIDENCE) for r in rows)
    lines.append(
        f"The largest run-to-run spread was {100 * spread:.0f}% ({group}, "
        f"{cell}); " + (
            "the verdicts compare cells within each repeat, where a slow "
            "stretch of the host slows both alike." if paired else
            "differences smaller than a cell's spread are not counted as "
            "findings."))
  return lines
