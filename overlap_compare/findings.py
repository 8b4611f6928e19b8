"""The findings of a comparison, in plain words, from its numbers.

For each group (framework x workload): the baseline and the fastest cell,
the best single optimization, whether the best combination beat it beyond
the noise, and the largest interference; and, where the runs recorded CPU
times, whether the best combination and the worst interference hit the
machine's limit or lost to interference (`metrics.ResourceBound`). Over
all groups: how often combining paid off. The report puts these first.
"""

from typing import List

from overlap_compare.comparison import Comparison, GroupKey
from overlap_compare.matrix import Cell


def _pct(value: float) -> str:
  return f"{100 * value:+.0f}%"


def phases_text(grown) -> str:
  """`compute +12.0 ms, data_wait +1.2 ms` for a slow-down's grown phases."""
  return ", ".join(f"{p} +{1e3 * g:.1f} ms" for p, g in grown)


def bound_text(bound) -> str:
  """Where a cell stands against its resource bound, in one sentence."""
  return (f"it {bound.verdict}: its step is {bound.efficiency:.0%} as short "
          f"as the bound allows ({1e3 * bound.bound_s:.1f} ms: the work "
          f"over the cores {1e3 * bound.work_bound_s:.1f} ms, the "
          f"critical-path ideal {1e3 * bound.ideal_s:.1f} ms)")


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
        + (f" ({phases_text(worst.grown_phases)} grew)."
           if worst.grown_phases else "."))
    if analysis.resource_bound.get(worst.cell):
      lines[-1] = (lines[-1][:-1] + "; "
                   + bound_text(analysis.resource_bound[worst.cell]) + ".")
  elif combos:
    lines.append("No combination was slower than its parts beyond the "
                 "noise.")
  return lines


def _combination_verdict(comparison: Comparison, key: GroupKey, cell: Cell,
                         single: Cell, what: str) -> str:
  stats = comparison.stats(key)
  ratio = comparison.analyses[key].speedup_vs_best_single[cell]
  tol = _tolerance(comparison, stats[cell], stats[single])
  if ratio > 1 + tol:
    verdict = f"combining paid off: {_pct(ratio - 1)} over the best single"
  elif ratio < 1 - tol:
    verdict = (f"combining did not pay: {_pct(ratio - 1)} against the best "
               "single")
  else:
    verdict = (f"combining changed nothing measurable: {_pct(ratio - 1)} "
               f"against the best single, within the ±{100 * tol:.0f}% noise")
  return f"{what}: {comparison.matrix.label(cell)}; {verdict}."


def combining_rows(comparison: Comparison) -> List[List[str]]:
  """Per group: best single vs best combination, and the verdict.

  Columns: group, best single (×base), best combination (×base),
  combination / single, tolerance, verdict ("paid off", "lost", "even").
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
    ratio = analysis.speedup_vs_best_single[best]
    tol = _tolerance(comparison, stats[best], stats[single])
    verdict = "paid off" if ratio > 1 + tol else (
        "lost" if ratio < 1 - tol else "even")

    def named(cell):
      speedup = analysis.speedup_vs_baseline[cell]
      return comparison.matrix.label(cell) + (
          f" (×{speedup:.2f})" if speedup is not None else "")

    rows.append([comparison.group_label(key), named(single), named(best),
                 f"{ratio:.2f}", f"±{100 * tol:.0f}%", verdict])
  return rows


def overall_findings(comparison: Comparison) -> List[str]:
  """How often combining beat the best single optimization, and the noise."""
  rows = combining_rows(comparison)
  if not rows:
    return []
  counts = {v: sum(1 for r in rows if r[-1] == v)
            for v in ("paid off", "lost", "even")}
  lines = [f"Over {len(rows)} group(s), the best combination beat the best "
           f"single optimization beyond the noise in {counts['paid off']}, "
           f"lost to it in {counts['lost']}, and was even with it in "
           f"{counts['even']}."]
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
    lines.append(
        f"The largest run-to-run spread was {100 * spread:.0f}% ({group}, "
        f"{cell}); differences smaller than a cell's spread are not "
        "counted as findings.")
  return lines
