"""A comparison's runs, gathered per cell and analyzed per group.

`overlap_compare` runs every (framework, workload, cell, repeat) as a
trainer subprocess and keeps one `RunOutcome` each. This module turns those
into per-cell results (`CellResult`: ok, failed or not supported, with the
medians of the successful repeats) and per-group analyses (one group is one
framework on one workload: its own baseline, speed-ups and slow-downs).
Report writers and plots read a `Comparison` and nothing else.
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from overlap_compare import metrics as overlap_metrics
from overlap_compare.matrix import Cell, Matrix

OK = "ok"
FAILED = "failed"
UNSUPPORTED = "unsupported"


@dataclasses.dataclass(frozen=True)
class RunOutcome:
  """One trainer run of the comparison.

  Attributes:
    framework: "tensorflow" or "pytorch".
    workload, cell: where it sits in the workload grid and the matrix.
    repeat: 1-based.
    status: OK, FAILED (crashed, killed, timed out, no run.json) or
      UNSUPPORTED (the trainer refused the flags: exit status 2).
    run_dir: its --model_dir.
    error: one line, for FAILED and UNSUPPORTED.
    wall_s: the process's wall time.
    record: the run.json, for OK.
  """
  framework: str
  workload: Cell
  cell: Cell
  repeat: int
  status: str
  run_dir: str
  error: str = ""
  wall_s: float = 0.0
  record: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class CellResult:
  """One cell of one group, over its repeats.

  Attributes:
    status: OK if any repeat succeeded, else UNSUPPORTED if the trainer
      refused it, else FAILED.
    stats: medians of the successful repeats (None unless OK).
    num_runs: repeats attempted.
    errors: the distinct errors of the repeats that did not succeed.
  """
  status: str
  stats: Optional[overlap_metrics.CellStats]
  num_runs: int
  errors: Tuple[str, ...]

  @property
  def num_ok(self) -> int:
    return self.stats.num_runs if self.stats else 0


GroupKey = Tuple[str, Cell]  # (framework, workload)


def summarize_cell(outcomes: Sequence[RunOutcome]) -> CellResult:
  """Folds one cell's repeats into a CellResult."""
  ok = [o for o in outcomes if o.status == OK]
  errors = tuple(dict.fromkeys(o.error for o in outcomes if o.status != OK))
  if ok:
    status = OK
  elif any(o.status == UNSUPPORTED for o in outcomes):
    status = UNSUPPORTED
  else:
    status = FAILED
  stats = (overlap_metrics.summarize_records([o.record for o in ok],
                                             [o.repeat for o in ok])
           if ok else None)
  return CellResult(status=status, stats=stats,
                    num_runs=len(outcomes), errors=errors)


@dataclasses.dataclass
class Comparison:
  """Everything a report needs: the plan, the outcomes and their analysis.

  Args:
    matrix: the optimizations' axes.
    workloads: the workload axes (a Matrix with one cell when none).
    frameworks: in the order asked for.
    outcomes: every run, any order.
    noise_floor: see overlap_metrics.find_slowdowns.
    meta: free-form facts for the report's header (command, machine, ...).
  """
  matrix: Matrix
  workloads: Matrix
  frameworks: Sequence[str]
  outcomes: Sequence[RunOutcome]
  noise_floor: float = overlap_metrics.DEFAULT_NOISE_FLOOR
  meta: Dict[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    by_cell: Dict[Tuple[str, Cell, Cell], List[RunOutcome]] = {}
    for o in self.outcomes:
      by_cell.setdefault((o.framework, o.workload, o.cell), []).append(o)
    self.results: Dict[GroupKey, Dict[Cell, CellResult]] = {}
    for (framework, workload, cell), runs in by_cell.items():
      runs.sort(key=lambda o: o.repeat)
      self.results.setdefault((framework, workload), {})[cell] = (
          summarize_cell(runs))
    self.analyses: Dict[GroupKey, overlap_metrics.GroupAnalysis] = {
        key: overlap_metrics.analyze_group(self.stats(key), self.noise_floor)
        for key in self.results}

  def groups(self) -> List[GroupKey]:
    """Groups with results, framework-major, in plan order."""
    return [(f, w) for w in self.workloads.cells() for f in self.frameworks
            if (f, w) in self.results]

  def cells(self, key: GroupKey) -> List[Cell]:
    return [c for c in self.matrix.cells() if c in self.results[key]]

  def stats(self, key: GroupKey) -> Dict[Cell, overlap_metrics.CellStats]:
    return {c: r.stats for c, r in self.results[key].items()
            if r.stats is not None}

  def group_label(self, key: GroupKey) -> str:
    framework, workload = key
    if not self.workloads.axes:
      return framework
    return f"{framework}, {self.workloads.full_label(workload)}"

  def axis_label(self, axis_index: int, choice: int) -> str:
    return self.matrix.axes[axis_index].describe(choice)

  def sources(self) -> Dict[str, str]:
    """{"model": ..., "data": ...}: where the runs' models and data came
    from, as their run.json records it (a zoo name, the user's import path,
    or a .keras file with its digest); several, comma-separated, when a
    workload axis varies them."""
    found = {"model": {}, "data": {}}
    for o in self.outcomes:
      for what in found:
        source = ((o.record or {}).get(what) or {}).get("source")
        if source:
          text = f"{source['value']} ({source['source']}"
          if source.get("sha256"):
            text += f", sha256 {source['sha256'][:12]}"
          found[what][text + ")"] = None
    return {what: ", ".join(texts) for what, texts in found.items() if texts}

  def framework_versions(self) -> Dict[str, str]:
    """{framework: version} from the first run.json of each framework."""
    versions = {}
    for o in self.outcomes:
      if o.record and o.framework not in versions:
        env = o.record.get("environment", {})
        versions[o.framework] = str(env.get(o.framework) or
                                    env.get("torch") or "?")
    return versions
