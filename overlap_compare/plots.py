"""The comparison's PNG plots: throughput, per-step breakdown, efficiency.

Drawn with matplotlib's Agg backend (no display needed), from a
`comparison.Comparison` only, so any report directory can be redrawn.

  paths = write_plots(comparison, "report_dir")
"""

import os
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless hosts have no display
# pylint: disable=g-import-not-at-top,wrong-import-position
import matplotlib.pyplot as plt
from PIL import Image

from overlap_compare import metrics as overlap_metrics
from overlap_compare.report import PLOT_NAMES
from overlap_compare.comparison import Comparison

THROUGHPUT_PNG, BREAKDOWN_PNG, EFFICIENCY_PNG = PLOT_NAMES
# Small files: the showcase report is committed.
DPI = 80
PHASE_COLORS = {"data_wait": "#4c72b0", "compute": "#55a868",
                "checkpoint_stall": "#c44e52", "other": "#b0b0b0"}
FRAMEWORK_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3")


def _width(cells) -> float:
  """Inches: room for a tick label like "+ strategy=mirrored" per cell."""
  return max(6.0, 1.3 * len(cells) + 1.5)


def _save(fig, path: str) -> None:
  """Writes a palette PNG: a few flat colours need no 24-bit pixels, and
  the file is about a third of the size."""
  fig.savefig(path, dpi=DPI)
  plt.close(fig)
  with Image.open(path) as image:
    small = image.convert("RGB").quantize(colors=64)
  small.save(path, optimize=True)


def _tick_label(comparison: Comparison, cell) -> str:
  return comparison.matrix.label(cell).replace(" + ", "\n+ ")


def _workload_title(comparison: Comparison, workload) -> str:
  if not comparison.workloads.axes:
    return ""
  return comparison.workloads.full_label(workload)


def _grouped_bars(comparison: Comparison, value_of, *, ylabel: str,
                  title: str, path: str, with_range=None,
                  note_of=None) -> None:
  """One panel per workload; per cell, one bar per framework.

  `note_of(framework, workload, cell)` may return a short text to print
  above that bar (e.g. why a value was clipped).
  """
  workloads = comparison.workloads.cells()
  cells = comparison.matrix.cells()
  frameworks = list(comparison.frameworks)
  width = 0.8 / len(frameworks)
  fig, axes = plt.subplots(len(workloads), 1, squeeze=False,
                           figsize=(_width(cells),
                                    3.4 * len(workloads)))
  for row, workload in enumerate(workloads):
    ax = axes[row][0]
    for f_index, framework in enumerate(frameworks):
      results = comparison.results.get((framework, workload), {})
      xs, heights, low, high = [], [], [], []
      for x, cell in enumerate(cells):
        value = value_of(framework, workload, cell, results.get(cell))
        if value is None:
          continue
        xs.append(x + (f_index - (len(frameworks) - 1) / 2) * width)
        heights.append(value)
        lo, hi = (with_range(results[cell]) if with_range
                  else (value, value))
        low.append(value - lo)
        high.append(hi - value)
      ax.bar(xs, heights, width, label=framework,
             color=FRAMEWORK_COLORS[f_index % len(FRAMEWORK_COLORS)],
             yerr=[low, high] if with_range else None, capsize=2)
      for x, cell in enumerate(cells):
        note = note_of(framework, workload, cell) if note_of else ""
        if note:
          ax.annotate(note, (x + (f_index - (len(frameworks) - 1) / 2) *
                             width, 0), xytext=(0, 2),
                      textcoords="offset points", ha="center", fontsize=6)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([_tick_label(comparison, c) for c in cells],
                       fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(", ".join(filter(None, [title,
                                         _workload_title(comparison,
                                                         workload)])),
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  _save(fig, path)


def plot_throughput(comparison: Comparison, path: str) -> None:
  def value(framework, workload, cell, result):
    del framework, workload, cell
    return result.stats.samples_per_second if result and result.stats \
        else None

  def spread(result):
    runs = result.stats.runs_samples_per_second
    return min(runs), max(runs)

  _grouped_bars(comparison, value, ylabel="samples/s (median repeat; bars: range)",
                title="Throughput", path=path, with_range=spread)


def plot_efficiency(comparison: Comparison, path: str) -> None:
  def value(framework, workload, cell, result):
    if not result or not result.stats:
      return None
    eff = comparison.analyses[(framework, workload)].efficiency.get(cell)
    return 100 * eff.value if eff else None

  def note(framework, workload, cell):
    eff = comparison.analyses.get((framework, workload))
    eff = eff.efficiency.get(cell) if eff else None
    if eff is None:
      result = comparison.results.get((framework, workload), {}).get(cell)
      return "n/a" if result is not None and result.stats else ""
    return "<0" if eff.raw < 0 else ">1" if eff.raw > 1 else ""

  _grouped_bars(comparison, value, ylabel="overlap efficiency, % (clipped)",
                title="Overlap efficiency", path=path, note_of=note)


def plot_breakdown(comparison: Comparison, path: str) -> None:
  """Stacked ms per step by phase; dashed lines at serial and ideal."""
  groups = comparison.groups()
  cells = comparison.matrix.cells()
  fig, axes = plt.subplots(len(groups), 1, squeeze=False,
                           figsize=(_width(cells),
                                    3.2 * len(groups)))
  for row, key in enumerate(groups):
    ax = axes[row][0]
    stats = comparison.stats(key)
    bottoms = [0.0] * len(cells)
    for phase in overlap_metrics.STEP_PHASES:
      heights = [1e3 * stats[c].phases_s[phase] if c in stats else 0.0
                 for c in cells]
      ax.bar(range(len(cells)), heights, 0.6, bottom=bottoms, label=phase,
             color=PHASE_COLORS[phase])
      bottoms = [b + h for b, h in zip(bottoms, heights)]
    components = comparison.analyses[key].components
    if components is not None:
      ax.axhline(1e3 * components.serial_s, color="black", ls="--", lw=0.8,
                 label="serial")
      ax.axhline(1e3 * components.ideal_s, color="black", ls=":", lw=0.8,
                 label="ideal")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([_tick_label(comparison, c) for c in cells],
                       fontsize=7)
    ax.set_ylabel("ms per step (median repeat)", fontsize=8)
    ax.set_title(f"Per-step breakdown: {comparison.group_label(key)}",
                 fontsize=9)
    ax.legend(fontsize=6, ncol=3)
    ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  _save(fig, path)


def write_plots(comparison: Comparison, output_dir: str) -> Dict[str, str]:
  """Draws the three plots into output_dir; returns {name: path}."""
  os.makedirs(output_dir, exist_ok=True)
  paths = {}
  drawers: List = [(THROUGHPUT_PNG, plot_throughput),
                   (BREAKDOWN_PNG, plot_breakdown),
                   (EFFICIENCY_PNG, plot_efficiency)]
  if not comparison.groups():
    return paths
  for name, draw in drawers:
    path = os.path.join(output_dir, name)
    draw(comparison, path)
    paths[name] = path
  return paths
