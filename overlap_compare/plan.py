"""A comparison's plan: its axes, frameworks, repeats, flags and run order.

The plan is all a comparison needs to know before anything runs, and all
`--report_only` needs to rebuild a report afterwards (it is saved as
compare.json beside the report).

  plan = Plan(matrix_spec="prefetch=0,2;checkpoint=sync,async",
              workloads_spec="preprocess_cost_ms=0,1",
              frameworks=["tensorflow", "pytorch"], repeats=3,
              trainer_args=["--model=small_cnn"])
  for repeat, framework, workload, cell in plan.schedule():
    plan.run_args(workload, cell)
"""

import os
from typing import List, Optional, Sequence, Tuple

from overlap_compare import matrix as matrix_lib
from overlap_compare.matrix import Cell, Matrix

RUNS_DIR = "runs"


# Flags that mean something only when the model is split into stages: the
# trainers refuse them with one stage, so a cell whose --pipeline_stages is
# 1 runs without them. A pipeline axis can then cross any other axis.
PIPELINE_ONLY_FLAGS = ("pipeline_microbatches", "pipeline_schedule",
                       "pipeline_split", "pipeline_virtual_stages",
                       "plan_profile")


def _flag_name(arg: str) -> str:
  return arg.lstrip("-").split("=", 1)[0]


def applicable_args(args: Sequence[str]) -> List[str]:
  """`args` without the pipeline-only flags when they ask for one stage
  (the last --pipeline_stages wins, as in the trainers' parser)."""
  stages = [a.split("=", 1)[1] for a in args
            if a.startswith("--pipeline_stages=")]
  if stages and stages[-1].strip() != "1":
    return list(args)
  return [a for a in args if _flag_name(a) not in PIPELINE_ONLY_FLAGS]


class Plan:
  """What a comparison runs: axes, frameworks, repeats and trainer flags."""

  def __init__(self, *, matrix_spec: str, workloads_spec: str,
               frameworks: Sequence[str], repeats: int,
               trainer_args: Sequence[str]):
    self.matrix_spec = matrix_spec
    self.workloads_spec = workloads_spec
    self.frameworks = list(frameworks)
    self.repeats = repeats
    self.trainer_args = list(trainer_args)
    self.matrix = Matrix(matrix_lib.parse_axes(matrix_spec))
    self.workloads = Matrix(matrix_lib.parse_axes(
        workloads_spec, min_settings=1, what="--workloads"))

  def to_json(self) -> dict:
    return {"matrix": self.matrix_spec, "workloads": self.workloads_spec,
            "frameworks": self.frameworks, "repeats": self.repeats,
            "trainer_args": self.trainer_args}

  @classmethod
  def from_json(cls, payload: dict) -> "Plan":
    return cls(matrix_spec=payload["matrix"],
               workloads_spec=payload["workloads"],
               frameworks=payload["frameworks"], repeats=payload["repeats"],
               trainer_args=payload["trainer_args"])

  def run_args(self, workload: Cell, cell: Cell) -> List[str]:
    """Trainer flags of one cell: common, then workload, then cell (less
    the pipeline-only flags of a cell with one stage)."""
    return applicable_args(self.trainer_args +
                           self.workloads.flag_args(workload) +
                           self.matrix.flag_args(cell))

  def same_run_as(self, workload: Cell, cell: Cell) -> Optional[Cell]:
    """The first cell before `cell` whose run is the same (the pipeline-
    only flags dropped from both), or None. Such a cell is not run: it
    would measure its twin again and report noise as an effect."""
    args = self.run_args(workload, cell)
    for earlier in self.matrix.cells():
      if earlier == cell:
        return None
      if self.run_args(workload, earlier) == args:
        return earlier
    return None

  def run_dir(self, root: str, framework: str, workload: Cell, cell: Cell,
              repeat: int) -> str:
    return os.path.join(root, RUNS_DIR, framework,
                        self.workloads.slug(workload), self.matrix.slug(cell),
                        f"r{repeat}")

  def schedule(self) -> List[Tuple[int, str, Cell, Cell]]:
    """(repeat, framework, workload, cell) in run order.

    Each repeat runs every cell once; the starting point rotates from
    repeat to repeat, so no cell always runs first or after the same one.
    """
    points = [(f, w, c) for w in self.workloads.cells()
              for c in self.matrix.cells() for f in self.frameworks
              if self.same_run_as(w, c) is None]
    order = []
    for repeat in range(1, self.repeats + 1):
      shift = (repeat - 1) * len(points) // self.repeats
      order += [(repeat, *p) for p in points[shift:] + points[:shift]]
    return order
