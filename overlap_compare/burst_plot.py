"""Each layer's time against its device count, from a burst plan's JSON.

DeepPool's VGG-16 figure: one line per layer, the predicted forward +
backward + all-reduce time at every candidate width, with the width the
plan chose marked. Layers whose line flattens do not scale; those are the
ones a burst plan keeps narrow.

  python -m overlap_compare.burst_plot PLAN.json OUT.png

The planning commands (`python -m torch_parity.burst_plan`) run this after
writing the plan, when matplotlib is installed.
"""

import sys
from typing import Optional

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless hosts have no display
# pylint: disable=g-import-not-at-top,wrong-import-position
import matplotlib.pyplot as plt

from overlap_core.planning.burst import BurstPlan

DPI = 80
NUM_LABELLED = 10  # the slowest layers get a legend entry; the rest are grey


def write_scaling_plot(plan: BurstPlan, path: str,
                       title: Optional[str] = None) -> str:
  """Draws the plan's per-layer scaling curves into a PNG at `path`."""
  widths = list(plan.widths)
  curves = [lp for lp in plan.layers if len(lp.time_by_width_s) == len(widths)]
  if not curves:
    raise ValueError(f"burst plan of {plan.model!r} has no per-width times; "
                     "make it again with this version of the planner")
  slowest = sorted(curves, key=lambda lp: -lp.time_by_width_s[0])
  labelled = {lp.layer for lp in slowest[:NUM_LABELLED]}
  fig, ax = plt.subplots(figsize=(8, 5))
  for lp in curves:
    times_ms = [max(t * 1e3, 1e-6) for t in lp.time_by_width_s]
    chosen = widths.index(lp.num_devices)
    if lp.layer in labelled:
      line, = ax.plot(widths, times_ms, marker="o", linewidth=1.5,
                      label=f"{lp.layer} (k={lp.num_devices})")
      ax.plot([widths[chosen]], [times_ms[chosen]], marker="*",
              markersize=14, color=line.get_color())
    else:
      ax.plot(widths, times_ms, color="#c0c0c0", linewidth=0.8)
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xticks(widths)
  ax.set_xticklabels([str(w) for w in widths])
  ax.set_xlabel("devices the layer runs on (global batch "
                f"{plan.global_batch} split over them)")
  ax.set_ylabel("layer time, ms (forward + backward + all-reduce)")
  ax.set_title(title or f"{plan.model}: layer time against device count "
               f"(star: planned width, limit {plan.amplification_limit:g})")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7, loc="upper right")
  fig.tight_layout()
  fig.savefig(path, dpi=DPI)
  plt.close(fig)
  return path


def main(argv) -> int:
  if len(argv) != 3:
    print("usage: python -m overlap_compare.burst_plot PLAN.json OUT.png",
          file=sys.stderr)
    return 2
  try:
    with open(argv[1], encoding="utf-8") as f:
      plan = BurstPlan.from_json(f.read())
    print(write_scaling_plot(plan, argv[2]))
  except (OSError, ValueError, KeyError, TypeError) as e:
    print(f"burst_plot: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
