"""What a comparison matrix measured: speed-ups, overlap efficiency, interference.

Everything here works on run.json dicts (either framework's) and on the
cells of a `matrix.Matrix`; nothing runs or imports a framework.

Definitions (the report prints them too):

- A cell's numbers are those of its median repeat: the successful run
  whose mean step time is the median (of an even number, the faster of the
  two middle ones). Its `samples_per_second`, and its `phases.<name>.mean`
  (seconds per measured step, so a checkpoint's stall is spread over all
  steps), come from one run, so throughput, step and phases agree and the
  phases add up to the step. Taking each number's median separately would
  not: with two repeats the median throughput is not the throughput of the
  median step.
- Speed-up over the baseline: throughput(cell) / throughput(baseline).
  Speed-up over the best single: throughput(cell) / the highest throughput
  of the cells that move exactly one axis.
- Overlap efficiency. The baseline cell provides the components, measured
  serially: D = its data wait (input prefetch off, if that is the
  baseline), C = its compute, K = its checkpoint stall (a synchronous save,
  if that is the baseline), O = its other time and X = its contention
  (compute's excess over the same step timed alone, where the run timed
  one; else 0). Serial = D + C + X + K + O, the baseline's step. Ideal =
  max(D, C, K) + O: every component hidden behind the longest one, with
  nothing slowed by sharing, so C is compute timed alone and X is no part
  of it. Efficiency of a
  cell with step S = (serial - S) / (serial - ideal): 0 is no better than
  serial, 1 is the ideal. It is clipped to [0, 1] and the raw value kept:
  below 0 the cell is slower than serial; above 1 it beat the ideal, which
  happens when an optimization made a component itself cheaper (data
  parallelism shrinking compute), outside what overlap alone can do. It is
  undefined when serial - ideal is under 2% of serial: there is nothing to
  overlap.
- Resource bound. The ideal assumes each component has resources of its
  own; on a CPU host they share the cores. A cell's work W is the CPU
  time its process tree spent per step (run.json `cpu`, times the number
  of workers, which share this host's cores), and W / cores is the
  shortest step that work allows. The bound is max(ideal, W / cores), and
  the resource efficiency bound / S (1: at the bound). A cell within the
  noise of its bound, where W / cores set the bound, hit the machine's
  limit: no overlap could go faster on these cores. A cell well above its
  bound lost time to interference (waits, contention), not to a lack of
  cores. Spin-waiting threads count as work, so the work bound errs high.
  "Within the noise" has a margin of its own, AT_BOUND_MARGIN (10%): no
  step keeps every core busy throughout. With enough repeats for an
  interval, each repeat's step is held against its own bound (its own W,
  the baseline's ideal): the interval of S / bound wholly within 1 + the
  margin is at the bound, wholly beyond it is interference, and across it
  the cell cannot be placed. With fewer, S <= bound * (1 + tolerance) is
  at the bound (tolerance as for slow-downs below, with the margin in
  place of the noise floor). The bound is a lower bound: a cell whose
  step lies below it (the interval of S / bound wholly below 1, or with
  fewer repeats S < bound * (1 - tolerance), BEAT_BOUND_MARGIN in place of
  the noise floor) shows that a part of it was mismeasured: the baseline's
  D, C, K or O, or the cell's work W. It is "exceeded", never "at the
  ideal"; `benchmarks/ledger_fidelity.py` checks the parts against the
  step time their removal saves.
- Slow-down: adding an optimization x to a cell P made it slower. With
  enough repeats for an interval (`paired_step_ratio`): the interval of
  step(P + x) / step(P), paired by repeat, lies wholly above 1 and its
  median above 1 + the noise floor. With fewer: step(P + x) > step(P) *
  (1 + tolerance), tolerance being the larger of the noise floor and each
  cell's spread across repeats ((max - min) of its step times over its
  median repeat's). When P has an optimization of its own, the
  slow-down is interference: the combination is slower than one of its
  parts. The phases named are those whose per-step time grew by at least a
  fifth of the step's growth.
"""

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from overlap_core.runtime import bubble_parts, intervals, pipeline_stats
from overlap_core.runtime import verdict as verdict_lib
from overlap_core.runtime.ledger import (CHECKPOINT_STALL, COMPUTE,
                                        COMPUTE_PARTS, CONTENTION, DATA_WAIT,
                                        EXPOSED_COMM, OTHER)
from overlap_compare.matrix import Cell

# The phases that partition a step (their means add up to the step's mean).
STEP_PHASES = (DATA_WAIT, COMPUTE, CHECKPOINT_STALL, OTHER)
# Below this share of serial time there is nothing worth overlapping, and the
# efficiency ratio would divide noise by noise.
MIN_OVERLAPPABLE_FRAC = 0.02
# A phase is named as having grown when it accounts for at least this share
# of the step's growth.
GROWN_PHASE_SHARE = 0.2
DEFAULT_NOISE_FLOOR = 0.05
# How far above its resource bound a step may be and still count as at the
# machine's limit. The bound has every core busy through the whole step,
# which no step does: its threads wait on one another at hand-offs (a batch
# handed to the step, the step's dispatch between ops, the update before
# the next step), and those waits are part of the work's shape, not
# interference. A step whose cores were busy at least 1 / 1.10 = 91% of it
# counts as full; one further off lost time that overlap could have won.
AT_BOUND_MARGIN = 0.10
# How far below its bound a step must be to have beaten it: a cell's step
# and its baseline's phases are read on one clock, so beyond the spread of
# its repeats only rounding and small noise separate a step at the bound
# from one under it.
BEAT_BOUND_MARGIN = 0.02
# The verdict of a cell whose step beat its lower bound, by which part set
# the bound.
IDEAL_EXCEEDED = "the ideal was exceeded; its parts are off"
WORK_BOUND_EXCEEDED = "the work bound was exceeded; its parts are off"
# Where a paired step ratio's interval lies against 1.
FASTER, SLOWER, EVEN = "faster", "slower", "even"
# A resource-bound verdict whose interval spans both answers.
UNPLACED = "could not be placed (noise)"
_ROUNDING = 1e-9
# A pipeline stage's idle time in parts, in the order the report shows
# them (`overlap_core.runtime.bubble_parts`).
IDLE_PARTS = bubble_parts.PARTS + (bubble_parts.RESIDUAL,)


@dataclasses.dataclass(frozen=True)
class PipelineStats:
  """A pipelined run's `pipeline` section, as the report compares it.

  The step phases fold stage_compute, bubble and transfer back into
  compute so that every cell's phases add up; this keeps them apart, per
  stage, with the schedule's own arithmetic beside the measured bubble.

  Attributes:
    schedule, stages, micro_batches, virtual_stages, replicas: as run.
    bubble_fraction: measured bubble over the stages' whole step time
      (`pipeline_stats.measured_bubble_fraction`), or None.
    bubble_fraction_theory: the schedule's (S-1)/(M+S-1), or None.
    compute_ms, update_ms, transfer_ms, bubble_ms: per stage, ms per step
      (update_ms is the optimizer's share of compute_ms); None where the
      runtime did not record it.
    bubble_source: how the bubble was had, from the section's `sources`
      ("measured" or "derived"), or "" when the run did not say.
    idle_parts_ms: per stage, {part: ms per step} of its idle time
      (`bubble_parts`: step, idle, each part and the residual, all "_ms"
      keys), or None where the run did not take it apart.
    idle_explained: every stage's residual is within the stated tolerance
      (`bubble_parts.RESIDUAL_TOLERANCE_FRAC`); None without parts.
    saved_activation_peak_bytes: per stage, the most bytes of tensors
      saved for backward it held at once; None where not counted.
    all_reduce_overlapped: with replicas, whether their all-reduce ran
      during backward; None where no stage all-reduces or not recorded.
  """
  schedule: str
  stages: int
  micro_batches: int
  virtual_stages: int
  replicas: int
  bubble_fraction: Optional[float]
  bubble_fraction_theory: Optional[float]
  compute_ms: Tuple[Optional[float], ...]
  update_ms: Tuple[Optional[float], ...]
  transfer_ms: Tuple[Optional[float], ...]
  bubble_ms: Tuple[Optional[float], ...]
  bubble_source: str = ""
  idle_parts_ms: Optional[Tuple[Dict[str, float], ...]] = None
  idle_explained: Optional[bool] = None
  saved_activation_peak_bytes: Tuple[Optional[int], ...] = ()
  all_reduce_overlapped: Optional[bool] = None

  def most_idle_stage(self) -> Optional[Tuple[int, float, str]]:
    """(stage, idle share of its step, the largest part's name) of the
    stage that idles the largest share of its step; None without parts."""
    rows = [r for r in self.idle_parts_ms or () if r.get("step_ms")]
    if not rows:
      return None
    row = max(rows, key=lambda r: r["idle_ms"] / r["step_ms"])
    largest = max(IDLE_PARTS, key=lambda p: row[f"{p}_ms"])
    return row["stage"], row["idle_ms"] / row["step_ms"], largest


def pipeline_stats_of(record: dict) -> Optional[PipelineStats]:
  """The run's PipelineStats, or None when it was not pipelined."""
  section = record.get("pipeline")
  if not section:
    return None
  rows = sorted(section.get("per_stage") or (), key=lambda r: r["stage"])

  def column(key):
    return tuple(row.get(key) for row in rows)

  source = (section.get("sources") or {}).get(pipeline_stats.BUBBLE, "")
  parts = section.get("bubble_parts") or {}
  summary = parts.get("summary") or {}
  return PipelineStats(
      schedule=section["schedule"], stages=section["stages"],
      micro_batches=section["micro_batches"],
      virtual_stages=section.get("virtual_stages", 1),
      replicas=section.get("replicas", 1),
      bubble_fraction=section.get("bubble_fraction"),
      bubble_fraction_theory=section.get("bubble_fraction_theory"),
      compute_ms=column("compute_ms"), update_ms=column("update_ms"),
      transfer_ms=column("transfer_ms"), bubble_ms=column("bubble_ms"),
      bubble_source=source.split(":", 1)[0].strip(),
      idle_parts_ms=(tuple(dict(p) for p in parts["per_stage"])
                     if parts.get("per_stage") else None),
      idle_explained=summary.get("explained"),
      saved_activation_peak_bytes=column("saved_activation_peak_bytes"),
      all_reduce_overlapped=section.get("all_reduce_overlapped"))


@dataclasses.dataclass(frozen=True)
class CellStats:
  """One cell's measurements: those of its median repeat.

  Attributes:
    num_runs: repeats that produced a run.json.
    samples_per_second: the median repeat's steady-state throughput.
    step_s: its mean step time.
    phases_s: its mean time per step of each phase in STEP_PHASES.
    step_spread: (max - min) of the repeats' mean step times, over step_s;
      0 with one repeat.
    runs_samples_per_second: every repeat's throughput, in run order.
    checkpoint_interval_s: its seconds between checkpoints (cadence in
      steps times the mean step), or None without checkpoints.
    work_s: CPU seconds per step of all its workers' process trees, or
      None where run.json has no `cpu` section.
    cores: the cores those processes could use, or None.
    step_s_by_repeat: ((repeat, mean step time), ...) of every repeat that
      produced a run.json, for ratios paired by repeat; () when the
      repeats are not known.
    work_s_by_repeat: ((repeat, work_s), ...) alike, for the repeats that
      recorded CPU times.
    pipeline: the median repeat's pipeline, or None when not pipelined.
    exposed_comm_s: the median repeat's exposed all-reduce per step (part
      of `phases_s[COMPUTE]` there), or None where the run did not
      measure it (no all-reduce, or TensorFlow's model.fit).
    exposed_comm_derived: the exposed all-reduce was derived from a step
      without it (TensorFlow, run.json's `phases_derived`), not timed.
    contention_s: the median repeat's contention per step (part of
      `phases_s[COMPUTE]` there), or None where the run timed no
      reference step.
    verdict: what bounds the median repeat's steps
      (`overlap_core.runtime.verdict`), its label.
  """
  num_runs: int
  samples_per_second: float
  step_s: float
  phases_s: Dict[str, float]
  step_spread: float
  runs_samples_per_second: Tuple[float, ...]
  checkpoint_interval_s: Optional[float] = None
  work_s: Optional[float] = None
  cores: Optional[int] = None
  step_s_by_repeat: Tuple[Tuple[int, float], ...] = ()
  work_s_by_repeat: Tuple[Tuple[int, float], ...] = ()
  pipeline: Optional[PipelineStats] = None
  exposed_comm_s: Optional[float] = None
  exposed_comm_derived: bool = False
  contention_s: Optional[float] = None
  verdict: str = ""

  @property
  def phase_fractions(self) -> Dict[str, float]:
    return {p: (v / self.step_s if self.step_s else 0.0)
            for p, v in self.phases_s.items()}


@dataclasses.dataclass(frozen=True)
class OverlapComponents:
  """The serial components of a step, from the baseline cell (seconds):
  D, C (compute timed alone), K, O and X (contention); see the module doc.
  """
  data_wait_s: float
  compute_s: float
  checkpoint_s: float
  other_s: float
  contention_s: float = 0.0

  @property
  def serial_s(self) -> float:
    return (self.data_wait_s + self.compute_s + self.contention_s +
            self.checkpoint_s + self.other_s)

  @property
  def ideal_s(self) -> float:
    return max(self.data_wait_s, self.compute_s, self.checkpoint_s) + \
        self.other_s


@dataclasses.dataclass(frozen=True)
class Efficiency:
  """Overlap efficiency of one cell.

  Attributes:
    value: clipped to [0, 1].
    raw: before clipping.
    note: why it was clipped, or "".
  """
  value: float
  raw: float
  note: str


@dataclasses.dataclass(frozen=True)
class ResourceBound:
  """How close a cell came to what its work and critical path allow.

  Attributes:
    ideal_s: the critical-path ideal, max(D, C, K) + O.
    work_bound_s: the cell's work per step over the cores.
    bound_s: the larger of the two.
    efficiency: bound_s / the cell's step.
    at_bound: the step is within AT_BOUND_MARGIN of the bound; None when
      the interval of step / bound spans both answers.
    step_over_bound: step / bound within each repeat, summarized
      (`intervals.summarize_ratios`), or None without CPU times per repeat.
    exceeded: the step beat the bound, which a lower bound forbids: one of
      its parts was mismeasured (see the module doc).
    parts: the baseline's components the ideal is made of, to name them.
  """
  ideal_s: float
  work_bound_s: float
  bound_s: float
  efficiency: float
  at_bound: Optional[bool]
  step_over_bound: Optional[dict] = None
  exceeded: bool = False
  parts: Optional[OverlapComponents] = None

  @property
  def machine_limited(self) -> bool:
    """The work, not the critical path, sets the bound."""
    return self.work_bound_s >= self.ideal_s

  @property
  def verdict(self) -> str:
    if self.exceeded:
      return (WORK_BOUND_EXCEEDED if self.machine_limited
              else IDEAL_EXCEEDED)
    if self.at_bound is None:
      return UNPLACED
    if not self.at_bound:
      return "lost to interference"
    return ("hit the machine's limit" if self.machine_limited
            else "reached the critical-path ideal")


@dataclasses.dataclass(frozen=True)
class Slowdown:
  """Adding the optimization on `added_axis` to `reference` made it slower.

  Attributes:
    cell: the cell with the optimization added.
    added_axis: index of the axis whose setting was added.
    reference: `cell` without it.
    slowdown_frac: step(cell) / step(reference) - 1.
    tolerance_frac: what the slow-down had to exceed to count.
    grown_phases: (phase, growth in seconds per step), largest first.
    slower_than_all_parts: the cell is slower than every cell that drops
      one of its optimizations (for a pair A + B: slower than A and B).
    step_ratio: step(cell) / step(reference) paired by repeat
      (`paired_step_ratio`), or None.
  """
  cell: Cell
  added_axis: int
  reference: Cell
  slowdown_frac: float
  tolerance_frac: float
  grown_phases: Tuple[Tuple[str, float], ...]
  slower_than_all_parts: bool
  step_ratio: Optional[dict] = None

  @property
  def is_interference(self) -> bool:
    """The reference already had an optimization: a combination lost."""
    return not self.reference.is_baseline


@dataclasses.dataclass(frozen=True)
class MarginalEffect:
  """What one axis setting did when added, across every context it met.

  Attributes:
    axis: axis index.
    choice: setting index on that axis (never the baseline, 0).
    ratios: throughput(with) / throughput(without), one per context, in
      cell order; the first is the context with nothing else on.
  """
  axis: int
  choice: int
  ratios: Tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class GroupAnalysis:
  """Metrics of one framework x workload group of cells.

  Attributes:
    components: from the baseline cell; None when the baseline failed.
    speedup_vs_baseline, speedup_vs_best_single: per cell with stats.
    efficiency: per cell with stats, None where undefined.
    resource_bound: per cell with stats, None where its run.json has no
      CPU times or there is no baseline.
    best_single: the fastest single-optimization cell, or None.
    slowdowns: every slow-down found, interference and single alike.
    marginal_effects: per non-baseline axis setting.
  """
  components: Optional[OverlapComponents]
  speedup_vs_baseline: Dict[Cell, Optional[float]]
  speedup_vs_best_single: Dict[Cell, Optional[float]]
  efficiency: Dict[Cell, Optional[Efficiency]]
  resource_bound: Dict[Cell, Optional[ResourceBound]]
  best_single: Optional[Cell]
  slowdowns: List[Slowdown]
  marginal_effects: List[MarginalEffect]


def checkpoint_interval_s(record: dict) -> Optional[float]:
  """Seconds between checkpoints in a run: the cadence times the mean step.

  The cadence is the one in force at the end (`--checkpoint_every=auto`
  replans as it goes); None when the run made no checkpoints.
  """
  checkpoint = record.get("checkpoint") or {}
  every = checkpoint.get("final_every_steps") or checkpoint.get("every_steps")
  if checkpoint.get("mode", "none") == "none" or not every or every < 1:
    return None
  return every * record["phases"]["step"]["mean"]


def median_record(records: Sequence[dict]) -> dict:
  """The run whose mean step time is the median; of an even number of runs,
  the faster of the two middle ones (noise on a shared host only slows).

  Raises:
    ValueError: when `records` is empty.
  """
  if not records:
    raise ValueError("median_record needs at least one run record")
  ordered = sorted(records, key=lambda r: r["phases"]["step"]["mean"])
  return ordered[(len(ordered) - 1) // 2]


def _step_phases_s(phases: Mapping[str, dict]) -> Dict[str, float]:
  """Mean seconds per step of each of STEP_PHASES. A pipelined run records
  its compute as stage_compute, bubble and transfer (they partition it),
  an offloading run as offload and compute: here they are its compute
  again, so every cell's phases add up and compare with a plain run's; the
  split per stage is `CellStats.pipeline`."""
  means = {p: phases.get(p, {}).get("mean", 0.0) for p in STEP_PHASES}
  means[COMPUTE] += sum(phases.get(p, {}).get("mean", 0.0)
                        for p in COMPUTE_PARTS)
  return means


def summarize_records(records: Sequence[dict],
                      repeats: Optional[Sequence[int]] = None) -> CellStats:
  """One cell's stats from the run.json dicts of its successful repeats.

  Args:
    records: the run.json dicts.
    repeats: each record's repeat number, for ratios paired by repeat.

  Raises:
    ValueError: when `records` is empty, or `repeats` does not match it.
  """
  if repeats is not None and len(repeats) != len(records):
    raise ValueError(f"got {len(records)} records and {len(repeats)} "
                     "repeat numbers")
  median = median_record(records)
  step_s = median["phases"]["step"]["mean"]
  steps = [r["phases"]["step"]["mean"] for r in records]
  spread = (max(steps) - min(steps)) / step_s if step_s > 0 else 0.0
  works = [_work_s(r) for r in records]
  return CellStats(
      num_runs=len(records),
      samples_per_second=median["samples_per_second"],
      step_s=step_s,
      phases_s=_step_phases_s(median["phases"]),
      step_spread=spread,
      runs_samples_per_second=tuple(r["samples_per_second"] for r in records),
      checkpoint_interval_s=checkpoint_interval_s(median),
      work_s=_work_s(median), cores=(median.get("cpu") or {}).get("cores"),
      step_s_by_repeat=() if repeats is None else tuple(
          (int(n), s) for n, s in zip(repeats, steps)),
      work_s_by_repeat=() if repeats is None else tuple(
          (int(n), w) for n, w in zip(repeats, works) if w is not None),
      pipeline=pipeline_stats_of(median),
      exposed_comm_s=(median["phases"].get(EXPOSED_COMM) or {}).get("mean"),
      exposed_comm_derived=EXPOSED_COMM in median.get("phases_derived", ()),
      contention_s=(median["phases"].get(CONTENTION) or {}).get("mean"),
      verdict=verdict_lib.step_verdict(
          median["phases"], median.get("phases_measured")).label)


def _work_s(record: dict) -> Optional[float]:
  """CPU seconds per step of all a run's workers, or None without `cpu`."""
  cpu = record.get("cpu") or {}
  if cpu.get("work_s_per_step") is None:
    return None
  # Each worker records its own process tree; on one host they share the
  # cores, and the workers of a data-parallel job do alike work.
  workers = (record.get("worker") or {}).get("num_workers", 1)
  return cpu["work_s_per_step"] * workers


def paired_step_ratio(cell: CellStats, reference: CellStats
                      ) -> Optional[dict]:
  """step(cell) / step(reference) within each repeat both ran: the median
  with its order-statistics interval (`intervals.summarize_ratios`), or
  None when they share no repeat.

  Within a repeat the two cells ran minutes apart under the same load (the
  schedule runs every cell once per repeat), so a pair cancels what a slow
  stretch of a shared host does to both.
  """
  mine = dict(cell.step_s_by_repeat)
  theirs = dict(reference.step_s_by_repeat)
  common = sorted(set(mine) & set(theirs))
  if not common or any(theirs[r] <= 0 for r in common):
    return None
  return intervals.summarize_ratios([mine[r] for r in common],
                                    [theirs[r] for r in common])


def ratio_verdict(ratio: Optional[dict]) -> Optional[str]:
  """FASTER, SLOWER or EVEN for a paired step ratio whose interval lies
  below 1, above 1, or across it; None without an interval (too few
  repeats), where the caller falls back on the noise tolerance."""
  if ratio is None or ratio.get("low") is None:
    return None
  if ratio["high"] < 1:
    return FASTER
  if ratio["low"] > 1:
    return SLOWER
  return EVEN


def components_from(baseline: CellStats) -> OverlapComponents:
  # The cell's compute holds its contention (`_step_phases_s` folds it
  # back); the ideal's C is compute without it, the step timed alone.
  contention_s = baseline.contention_s or 0.0
  return OverlapComponents(
      data_wait_s=baseline.phases_s[DATA_WAIT],
      compute_s=baseline.phases_s[COMPUTE] - contention_s,
      checkpoint_s=baseline.phases_s[CHECKPOINT_STALL],
      other_s=baseline.phases_s[OTHER], contention_s=contention_s)


def overlap_efficiency(step_s: float, components: OverlapComponents
                       ) -> Optional[Efficiency]:
  """(serial - step) / (serial - ideal), clipped to [0, 1]; see the module doc.

  Returns:
    None when serial - ideal is under MIN_OVERLAPPABLE_FRAC of serial.
  """
  serial = components.serial_s
  overlappable = serial - components.ideal_s
  if serial <= 0 or overlappable < MIN_OVERLAPPABLE_FRAC * serial:
    return None
  raw = (serial - step_s) / overlappable
  if abs(raw) < _ROUNDING or abs(raw - 1) < _ROUNDING:
    # The baseline itself sums its phases in another order than its step.
    raw = round(raw)
  if raw < 0:
    return Efficiency(0.0, raw, "slower than serial")
  if raw > 1:
    return Efficiency(1.0, raw, "beat the ideal: a component got cheaper, or "
                      "the ideal's parts are off")
  return Efficiency(raw, raw, "")


def resource_bound(cell: CellStats, components: OverlapComponents, *,
                   margin: float = AT_BOUND_MARGIN
                   ) -> Optional[ResourceBound]:
  """The cell against max(ideal, work / cores); see the module doc.

  Args:
    margin: how far above the bound still counts as at it.

  Returns:
    None without CPU times or a step.
  """
  if cell.work_s is None or not cell.cores or cell.step_s <= 0:
    return None
  work_bound = cell.work_s / cell.cores
  bound = max(components.ideal_s, work_bound)
  ratio = _step_over_bound(cell, components.ideal_s)
  if ratio is not None and ratio.get("low") is not None:
    limit = 1 + margin
    at_bound = (True if ratio["high"] <= limit else
                False if ratio["low"] > limit else None)
    exceeded = ratio["high"] < 1
  else:
    at_bound = cell.step_s <= bound * (1 + _tolerance(margin, cell))
    exceeded = cell.step_s < bound * (1 - _tolerance(BEAT_BOUND_MARGIN,
                                                     cell))
  return ResourceBound(ideal_s=components.ideal_s, work_bound_s=work_bound,
                       bound_s=bound, efficiency=bound / cell.step_s,
                       at_bound=at_bound, step_over_bound=ratio,
                       exceeded=exceeded, parts=components)


def _step_over_bound(cell: CellStats, ideal_s: float) -> Optional[dict]:
  """step / max(ideal, work / cores) within each repeat that recorded its
  work, summarized; None when none did. A repeat's step and work come
  from one run, so a slow stretch of the host moves both."""
  works = dict(cell.work_s_by_repeat)
  repeats = [r for r, _ in cell.step_s_by_repeat if r in works]
  if not repeats:
    return None
  steps = dict(cell.step_s_by_repeat)
  return intervals.summarize_ratios(
      [steps[r] for r in repeats],
      [max(ideal_s, works[r] / cell.cores) for r in repeats])


def grown_phases(cell: CellStats, reference: CellStats
                 ) -> Tuple[Tuple[str, float], ...]:
  """Phases whose per-step time grew by at least GROWN_PHASE_SHARE of the
  step's growth, largest growth first."""
  step_growth = cell.step_s - reference.step_s
  growth = [(p, cell.phases_s[p] - reference.phases_s[p]) for p in STEP_PHASES]
  threshold = GROWN_PHASE_SHARE * max(step_growth, 0.0)
  named = [(p, g) for p, g in growth if g > 0 and g >= threshold]
  return tuple(sorted(named, key=lambda pg: -pg[1]))


def _tolerance(floor: float, *cells: CellStats) -> float:
  return max([floor] + [c.step_spread for c in cells])


def find_slowdowns(stats: Mapping[Cell, CellStats],
                   noise_floor: float = DEFAULT_NOISE_FLOOR
                   ) -> List[Slowdown]:
  """Every (cell, added optimization) whose addition made the step slower.

  Args:
    stats: measured cells; cells missing (failed) are skipped.
    noise_floor: the smallest relative slow-down that counts.

  Returns:
    Slow-downs in cell order, then axis order.
  """
  found = []
  for cell in sorted(stats):
    parts = {i: cell.without(i) for i in cell.optimizations}
    parts = {i: p for i, p in parts.items() if p in stats}
    for axis, reference in parts.items():
      ref, now = stats[reference], stats[cell]
      tolerance = _tolerance(noise_floor, now, ref)
      slowdown = now.step_s / ref.step_s - 1 if ref.step_s > 0 else 0.0
      paired = paired_step_ratio(now, ref)
      if ratio_verdict(paired) is None:
        if slowdown <= tolerance:
          continue
      # With an interval, the pairs decide: slower beyond doubt, and by
      # more than the noise floor.
      elif (ratio_verdict(paired) != SLOWER
            or paired["median"] <= 1 + noise_floor):
        continue
      slower_than_all = (len(parts) == len(cell.optimizations) and all(
          now.step_s > stats[p].step_s for p in parts.values()))
      found.append(Slowdown(cell, axis, reference, slowdown, tolerance,
                            grown_phases(now, ref), slower_than_all,
                            paired))
  return found


def marginal_effects(stats: Mapping[Cell, CellStats]
                     ) -> List[MarginalEffect]:
  """For each axis setting: its throughput ratio in every context measured."""
  ratios: Dict[Tuple[int, int], List[float]] = {}
  for cell in sorted(stats):
    for axis in cell.optimizations:
      without = cell.without(axis)
      if without in stats and stats[without].samples_per_second > 0:
        ratios.setdefault((axis, cell.choices[axis]), []).append(
            stats[cell].samples_per_second /
            stats[without].samples_per_second)
  return [MarginalEffect(axis, choice, tuple(r))
          for (axis, choice), r in sorted(ratios.items())]


def analyze_group(stats: Mapping[Cell, CellStats],
                  noise_floor: float = DEFAULT_NOISE_FLOOR) -> GroupAnalysis:
  """Speed-ups, efficiencies and slow-downs of one group's measured cells.

  Args:
    stats: {cell: its stats} for the cells that produced results; the
      baseline is the cell whose choices are all 0.
    noise_floor: see `find_slowdowns`.
  """
  baseline = next((c for c in stats if c.is_baseline), None)
  base = stats.get(baseline) if baseline is not None else None
  singles = [c for c in stats if len(c.optimizations) == 1]
  best_single = max(singles, key=lambda c: stats[c].samples_per_second,
                    default=None)
  components = components_from(base) if base is not None else None

  def ratio(cell, reference):
    if reference is None or stats[reference].samples_per_second <= 0:
      return None
    return stats[cell].samples_per_second / stats[reference].samples_per_second

  return GroupAnalysis(
      components=components,
      speedup_vs_baseline={c: ratio(c, baseline) for c in stats},
      speedup_vs_best_single={c: ratio(c, best_single) for c in stats},
      efficiency={c: (overlap_efficiency(stats[c].step_s, components)
                      if components else None) for c in stats},
      resource_bound={c: (resource_bound(stats[c], components)
                          if components else None) for c in stats},
      best_single=best_single,
      slowdowns=find_slowdowns(stats, noise_floor),
      marginal_effects=marginal_effects(stats))
