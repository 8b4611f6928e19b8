"""The burst plan's steps that both planning commands and trainers share.

The batches to profile, the plan (with a fitted cost model where the
profile does not reach), its files, and reading a plan back for a run.
The commands' flow that calls them is `command.burst_plan_main`.

  batches = batches_to_profile(global_batch=32, num_devices=4)
  plan = make_burst_plan(graph, profile, global_batch=32, num_devices=4,
                         amplification_limit=2.0)
  paths = write_burst_files(graph, profile, plan, "plan/")
"""

import os
from typing import List, Optional, Sequence, Tuple

from overlap_core.planning import burst
from overlap_core.planning import report
from overlap_core.planning.burst_costs import (CommModel, default_widths,
                                               split_samples)
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile

PLAN_NAME, PNG_NAME = "burst_plan.json", "burst_scaling.png"


def batches_to_profile(*, global_batch: int, num_devices: int,
                       widths: Optional[Sequence[int]] = None
                       ) -> Tuple[int, ...]:
  """The per-device batches a plan reads: the largest part at each width."""
  widths = widths or default_widths(num_devices, global_batch)
  return tuple(sorted({max(split_samples(global_batch, k)) for k in widths}))


def make_burst_plan(graph: LayerGraph, profile: Profile, *,
                    global_batch: int, num_devices: int,
                    amplification_limit: float,
                    comm: Optional[CommModel] = None,
                    widths: Optional[Sequence[int]] = None
                    ) -> burst.BurstPlan:
  """Plans; fits the cost model only if the profile misses a batch.

  Raises:
    ValueError, KeyError: one line, for what cannot be planned.
  """
  needed = set(batches_to_profile(global_batch=global_batch,
                                  num_devices=num_devices, widths=widths))
  cost_model = None
  if not needed <= set(profile.batch_sizes):
    # pylint: disable=g-import-not-at-top
    from overlap_core.planning.cost_model import fit_cost_model
    cost_model = fit_cost_model([(graph, profile)])
  return burst.plan_burst(graph, profile, global_batch=global_batch,
                          num_devices=num_devices,
                          amplification_limit=amplification_limit,
                          comm=comm or CommModel(), cost_model=cost_model,
                          widths=widths)


def write_burst_files(graph: LayerGraph, profile: Profile,
                      plan: burst.BurstPlan, output_dir: str) -> List[str]:
  """graph.json, profile.json, burst_plan.json and burst_plan.txt; prints
  the command that draws the scaling plot from them."""
  paths = report.write_text_files(output_dir, {
      "graph.json": graph.to_json(), "profile.json": profile.to_json(),
      PLAN_NAME: plan.to_json(), "burst_plan.txt": plan.table() + "\n"})
  # The plot needs matplotlib, which the neutral core never loads, and is
  # drawn by the comparison package, which sits above it; so the planner
  # names the command instead of running a layer above its own.
  print(f"scaling plot: python -m overlap_compare.burst_plot "
        f"{os.path.join(output_dir, PLAN_NAME)} "
        f"{os.path.join(output_dir, PNG_NAME)}")
  return paths


def read_plan(path: str) -> burst.BurstPlan:
  """A burst plan from its JSON file: what --burst_parallel checks and a
  trainer then runs.

  Raises:
    ValueError: one line, saying whether the file could not be read or
      does not hold a burst plan.
  """
  try:
    with open(path, encoding="utf-8") as f:
      return burst.BurstPlan.from_json(f.read())
  except OSError as e:
    raise ValueError(f"cannot read it ({e.strerror})") from None
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"not a burst plan ({' '.join(str(e).split())})"
                     ) from None


def plan_against_run(plan: burst.BurstPlan, plan_path: str,
                     ledger_summary: dict) -> dict:
  """run.json's `burst` section: what the plan predicted beside what the
  run measured, so that a user sees where the cost model was wrong."""
  measured_s = ledger_summary["phases"]["step"]["mean"]
  predicted_s = plan.iteration_s
  return {
      "plan": plan_path,
      "model": plan.model,
      "num_devices": plan.num_devices,
      "global_batch": plan.global_batch,
      "amplification_limit": plan.amplification_limit,
      "widths_by_layer": plan.widths_by_layer(),
      "predicted_iteration_ms": predicted_s * 1e3,
      "predicted_data_parallel_iteration_ms":
          plan.data_parallel_iteration_s * 1e3,
      "measured_step_ms": measured_s * 1e3,
      # > 1: the run was slower than the plan said (data wait included).
      "measured_over_predicted": (measured_s / predicted_s
                                  if predicted_s > 0 else None),
  }
