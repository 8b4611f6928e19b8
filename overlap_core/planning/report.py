"""The planning command's printout and files, shared by both frameworks.

Each framework's `plan` entry point measures (graph, profile) its own way
and hands them here: the cost model is fitted, the split chosen, and one
report printed, so a PyTorch plan and a TensorFlow plan read the same.
"""

import dataclasses
import os
from typing import List, Mapping, Optional, Sequence

from overlap_core.planning.cost_model import CostModel, fit_cost_model
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.partition import StagePlan, partition
from overlap_core.planning.profile import Profile


@dataclasses.dataclass(frozen=True)
class PlanResult:
  """Everything a planning run decided, with what it was decided from."""
  graph: LayerGraph
  profile: Profile
  cost_model: CostModel
  plan: StagePlan
  even_plan: StagePlan  # the baseline, always shown beside the choice
  num_microbatches: int


def make_plan(graph: LayerGraph, profile: Profile, *, num_stages: int,
              microbatch_size: int, num_microbatches: int, split: str = "auto",
              cut_layers: Sequence[str] = (),
              bandwidth_bytes_per_s: Optional[float] = None,
              replicas: int = 1) -> PlanResult:
  """Fits the cost model on `profile` and splits `graph` with it.

  Raises:
    ValueError: one line, for a split the graph cannot take.
  """
  model = fit_cost_model([(graph, profile)])
  times_s = model.predict_graph(graph, microbatch_size)
  common = dict(num_stages=num_stages, batch_size=microbatch_size,
                bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                replicas=replicas, num_microbatches=num_microbatches,
                update_s=model.predict_updates(graph),
                update_call_s=model.update_call_s,
                gradient_sum_s_per_byte=model.gradient_sum_s_per_byte)
  plan = partition(graph, times_s, mode=split, cut_layers=cut_layers,
                   **common)
  even = partition(graph, times_s, mode="even", **common)
  return PlanResult(graph, profile, model, plan, even, num_microbatches)


def format_report(result: PlanResult) -> str:
  """Graph, profile, cost-model error, the split and the even baseline."""
  parts = [result.graph.summary(), "", result.profile.summary(), "",
           result.cost_model.report(), "",
           result.plan.table(result.num_microbatches)]
  if result.plan.mode != "even":
    parts += ["", "Baseline: " + result.even_plan.table(
        result.num_microbatches)]
  return "\n".join(parts)


def write_text_files(output_dir: str, texts: Mapping[str, str]) -> List[str]:
  """Writes {file name: text} under `output_dir` (made if missing), for
  both planners' files; returns the paths in the order of `texts`."""
  os.makedirs(output_dir, exist_ok=True)
  paths = []
  for name, text in texts.items():
    path = os.path.join(output_dir, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    paths.append(path)
  return paths


def write_plan_files(result: PlanResult, output_dir: str) -> list:
  """graph.json, graph.dot, profile.json and plan.txt under `output_dir`."""
  paths = write_text_files(output_dir, {
      "graph.json": result.graph.to_json(),
      "graph.dot": result.graph.to_dot(),
      "profile.json": result.profile.to_json(),
      "plan.txt": format_report(result) + "\n"})
  png = result.graph.write_png(os.path.join(output_dir, "graph.png"))
  return paths + ([png] if png else [])
