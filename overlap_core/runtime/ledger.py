"""The step ledger: where every training step's time goes, framework-neutral.

Both trainers wrap each phase of a step in `ledger.phase(name)` and close the
step with `ledger.end_step(...)`. The ledger keeps every span (for the trace)
and summarizes per-phase mean/p50/p95 over the steady-state steps.

  ledger = StepLedger()
  for step in range(1, num_steps + 1):
    with ledger.phase(DATA_WAIT):
      batch = next(iterator)
    with ledger.phase(COMPUTE):
      loss = train_step(batch)
    ledger.end_step(step, num_samples=batch_size)
  summary = ledger.summary()

In a pipelined run, `compute` is not recorded: each step's compute span is
recorded as the three phases of `overlap_core.runtime.pipeline_stats`
(stage_compute, bubble, transfer), which partition it, so the phases still
add up to the step. With a data-parallel all-reduce the ledger can see
(PyTorch's DDP and Horovod), the span's end that waited for it is
`exposed_comm` (`overlap_core.runtime.comm_stats`). With offload, the
step's compute span is recorded as `offload` (what offload adds to the
step: derived from the step timed alone with and without it,
`overlap_core.runtime.offload_cost`, or the copies run in series with
compute, `overlap_core.runtime.offload_stats`) and `compute`, the rest
(`carve_compute`). Where the step was timed alone before training, the
span beyond that reference is `contention`, compute slowed by the work
running beside it (`overlap_core.runtime.contention`). `COMPUTE_PARTS`
names every phase that stands for part of a compute span; where one
number is wanted for compute (progress shares, comparisons), they are
added back to it.

Beside each wall time the ledger keeps CPU time (`overlap_core.runtime.
cpu_clock`): per step, the CPU of the whole process tree (every thread,
and children such as DataLoader workers) and of the training thread; per
phase timed with `phase()`, on a sample of the steps
(`samples_phase_cpu`), the CPU of this process's threads and of the
training thread while the phase lasted. A phase added with `add()` was
timed elsewhere and has no CPU time.
"""

import dataclasses
import math
import statistics
import time
from typing import Callable, Dict, List, NamedTuple, Optional

from overlap_core.runtime import cpu_clock as cpu_clock_lib
from overlap_core.runtime import (comm_stats, contention, contention_split,
                                  offload_stats, pipeline_stats)

DATA_WAIT = "data_wait"  # blocked waiting for the next batch
COMPUTE = "compute"  # forward, backward, gradient all-reduce and update
CHECKPOINT_STALL = "checkpoint_stall"  # training blocked by a checkpoint
PHASES = (DATA_WAIT, COMPUTE, CHECKPOINT_STALL)
STEP = "step"  # the whole step: from the previous step's end to its own
OTHER = "other"  # step time outside any phase: logging, bookkeeping
OFFLOAD = offload_stats.OFFLOAD  # what offload adds to the step
EXPOSED_COMM = comm_stats.EXPOSED_COMM  # all-reduce backward did not hide
CONTENTION = contention.CONTENTION  # compute slowed by work beside the step
# The moves `relabel` may name. `summary` reports each, zero where nothing
# moved, so that every run's record has the same keys whatever its steps
# did: a run whose last steps ran below the step alone settles some
# contention back to compute, and one a little slower settles none.
NAMED_MOVES = (contention_split.SETTLED_BALANCE,
               contention_split.RETIMED_REFERENCE)
# Phases recorded in place of part or all of a step's compute span.
COMPUTE_PARTS = pipeline_stats.PHASES + (OFFLOAD, EXPOSED_COMM,
                                         CONTENTION)
# Compute parts that progress lines, scalars and verdicts report on their
# own rather than add back to compute: what a knob other than the model
# acts on (the all-reduce pack, the strategy; the input pipeline, the
# persist). Comparisons still add them back, so the ideal's compute is
# what it was before they were measured.
APART_FROM_COMPUTE = (EXPOSED_COMM, CONTENTION)
# The CPU clocks are read on every step up to this one (every step of a
# short run; the warm-up is at most 10) and on one step in
# PHASE_CPU_EVERY_STEPS after it. Each read is a system call, eight a step
# for two phases: on a 2-core host, a loop of empty phases spent 16 us a
# step in the ledger reading them every step and 10 us sampling them
# (between real steps, whose kernels leave the caches cold, the same work
# takes longer). A phase's CPU is the mean over the steps that read it.
# The step's own CPU (the process tree, the training thread) is read on
# the same steps, each read carrying the steps since the one before: the
# process clock sums every thread's time, so its cost grows with the
# threads, and in a profile of a 2.4 ms TensorFlow step (dozens of
# threads) the one read a step was the ledger's largest cost.
PHASE_CPU_EVERY_STEP_UNTIL = 16
PHASE_CPU_EVERY_STEPS = 8


def samples_phase_cpu(step_index: int) -> bool:
  """Whether the step at this 0-based index reads its phases' CPU, and
  the step's own."""
  return (step_index < PHASE_CPU_EVERY_STEP_UNTIL
          or step_index % PHASE_CPU_EVERY_STEPS == 0)


class Span(NamedTuple):
  """One timed phase of one step. A named tuple, not a frozen dataclass:
  a step makes three or four, and a frozen dataclass's constructor sets
  each field through object.__setattr__, several times slower."""
  name: str
  step: int
  start_s: float
  end_s: float

  @property
  def duration_s(self) -> float:
    return self.end_s - self.start_s


@dataclasses.dataclass(frozen=True)
class CpuClocks:
  """The CPU clocks the ledger reads (seconds); injectable for tests."""
  thread: Callable[[], float] = time.thread_time  # the training thread
  process: Callable[[], float] = time.process_time  # all of its threads
  tree: Callable[[], float] = None  # with its children; read once a step

  def __post_init__(self):
    if self.tree is None:
      object.__setattr__(self, "tree", cpu_clock_lib.ProcessTreeClock())


class StepRecord(NamedTuple):
  """One closed step; a named tuple for the reason `Span` is one."""
  step: int
  start_s: float
  end_s: float
  num_samples: int
  phases_s: Dict[str, float]
  # CPU seconds: the process tree and the training thread over the
  # `cpu_steps` steps that end with this one and that its reading covers
  # (0 and 0.0 on a step that read no CPU clock: the next reading carries
  # it), and (process, thread) per phase timed with `phase()` where the
  # step read them (`phase_cpu_sampled`; else {}).
  cpu_s: float
  thread_cpu_s: float
  phases_cpu_s: Dict[str, tuple]
  phase_cpu_sampled: bool = True
  cpu_steps: int = 1

  @property
  def duration_s(self) -> float:
    return self.end_s - self.start_s


def percentile(sorted_values: List[float], q: float) -> float:
  """Linear-interpolated percentile of an ascending list; q in [0, 100]."""
  if not sorted_values:
    return math.nan
  position = (len(sorted_values) - 1) * q / 100.0
  low = math.floor(position)
  high = min(low + 1, len(sorted_values) - 1)
  fraction = position - low
  return sorted_values[low] * (1 - fraction) + sorted_values[high] * fraction


def carve_compute(start_s: float, end_s: float, part: str,
                  part_s: float) -> List[tuple]:
  """Spans that tile a compute span [start_s, end_s]: `part` for `part_s`
  seconds (never below zero nor past the span), then `compute`.

  `part_s` is a sum of intervals spread through the span (copies between
  layers); it is put first because only its total is known. The part's
  span is kept even at zero seconds, so every step of a run that records
  the phase has it.

  Returns:
    [(part, start_s, split_s), (COMPUTE, split_s, end_s)].
  """
  split_s = start_s + min(max(part_s, 0.0), max(end_s - start_s, 0.0))
  return [(part, start_s, split_s), (COMPUTE, split_s, end_s)]


def describe_durations(values: List[float]) -> Dict[str, float]:
  ordered = sorted(values)
  count = len(ordered)
  return {
      "mean": sum(ordered) / count if count else math.nan,
      "p50": percentile(ordered, 50),
      "p95": percentile(ordered, 95),
      "total": sum(ordered),
  }


def default_warmup_steps(num_steps: int) -> int:
  """Steps left out of the summary: tracing and first-touch allocation.

  The first step of every framework includes graph tracing or lazy
  initialization; a tenth of the run, between 1 and 10 steps, covers it
  without throwing away short runs.
  """
  return max(1, min(10, num_steps // 10))


class _Timed:
  """`StepLedger.phase` and `cpu_of` as a context manager.

  A class, not a generator: every step enters two or three of them, and in
  a profile of a 3 ms PyTorch step the nested generator managers were half
  of the ledger's own cost per step."""
  __slots__ = ("_ledger", "_name", "_wall", "_start_s", "_cpu_start")

  def __init__(self, ledger: "StepLedger", name: str, *, wall: bool):
    self._ledger = ledger
    self._name = name
    self._wall = wall

  def __enter__(self) -> None:
    if self._wall:
      self._start_s = self._ledger._clock()
      self._ledger._open_step(self._start_s)
    self._cpu_start = self._ledger._start_cpu()

  def __exit__(self, *exc_info) -> None:
    # CPU first, then the wall clock: the order the nested form had.
    if self._cpu_start is not None:
      self._ledger._add_cpu(self._name, self._cpu_start)
    if self._wall:
      self._ledger.add(self._name, self._start_s, self._ledger._clock())


class StepLedger:
  """Records timed spans per training step and summarizes them.

  Args:
    clock: a monotonic clock in seconds; injectable so tests can drive it.
    cpu_clocks: the CPU clocks (default: this process's real ones).
  """

  def __init__(self, clock: Callable[[], float] = time.perf_counter,
               cpu_clocks: Optional[CpuClocks] = None):
    self._clock = clock
    self._cpu = cpu_clocks or CpuClocks()
    self._current_phases_cpu: Dict[str, tuple] = {}
    self._sampling_phase_cpu = samples_phase_cpu(0)
    # CPU readings at the last step's end that read them (tree, thread),
    # and the steps closed since.
    self._previous_cpu = (self._cpu.tree(), self._cpu.thread())
    self._steps_since_cpu_read = 0
    self._spans: List[Span] = []
    self._steps: List[StepRecord] = []
    self._current_step_start: Optional[float] = None
    self._current_phases: Dict[str, float] = {}
    # Steps are chained: each starts where the previous one ended, so time
    # spent between them (progress lines, framework internals) is "other"
    # and the step durations add up to the loop's wall time.
    self._previous_step_end: Optional[float] = None
    # relabel's named moves: {why: {index into steps: seconds}}.
    self._moves: Dict[str, Dict[int, float]] = {}
    # Each step's compute beyond the step alone, signed (record_excess).
    self._excess_s: Dict[int, float] = {}
    self.origin_s = clock()

  @property
  def steps(self) -> List[StepRecord]:
    return list(self._steps)

  @property
  def spans(self) -> List[Span]:
    return list(self._spans)

  def phase(self, name: str) -> "_Timed":
    """Times the enclosed block (`with ledger.phase(name):`) as phase
    `name` of the current step."""
    return _Timed(self, name, wall=True)

  def cpu_of(self, name: str) -> "_Timed":
    """Counts the enclosed block's CPU time as phase `name`'s, its wall
    time being added apart (a compute span split into parts: the CPU is
    the whole span's, counted as compute's)."""
    return _Timed(self, name, wall=False)

  def _start_cpu(self) -> Optional[tuple]:
    """The phase's CPU readings at its start; None on a step that does
    not read them (`samples_phase_cpu`)."""
    if not self._sampling_phase_cpu:
      return None
    return self._cpu.process(), self._cpu.thread()

  def _add_cpu(self, name: str, started: tuple) -> None:
    process, thread = self._current_phases_cpu.get(name, (0.0, 0.0))
    self._current_phases_cpu[name] = (
        process + self._cpu.process() - started[0],
        thread + self._cpu.thread() - started[1])

  def add(self, name: str, start_s: float, end_s: float) -> None:
    """Adds a phase measured elsewhere (e.g. by a callback) to this step."""
    self._open_step(start_s)
    self._current_phases[name] = (self._current_phases.get(name, 0.0) +
                                  end_s - start_s)
    self._spans.append(Span(name, len(self._steps) + 1, start_s, end_s))

  def _open_step(self, first_phase_start_s: float) -> None:
    if self._current_step_start is not None:
      return
    if self._previous_step_end is not None:
      self._current_step_start = self._previous_step_end
    else:
      self._current_step_start = first_phase_start_s

  def end_step(self, step: int, num_samples: int,
               end_s: Optional[float] = None) -> StepRecord:
    """Closes the current step; its duration runs until now, or until
    `end_s` for a step timed as a share of a longer span."""
    end = self._clock() if end_s is None else end_s
    self._steps_since_cpu_read += 1
    if self._sampling_phase_cpu:
      cpu = (self._cpu.tree(), self._cpu.thread())
      cpu_s = cpu[0] - self._previous_cpu[0]
      thread_cpu_s = cpu[1] - self._previous_cpu[1]
      cpu_steps, self._steps_since_cpu_read = self._steps_since_cpu_read, 0
      self._previous_cpu = cpu
    else:
      cpu_s = thread_cpu_s = 0.0
      cpu_steps = 0
    start = (self._current_step_start
             if self._current_step_start is not None else end)
    # The step's dicts go to its record as they are: new ones follow.
    record = StepRecord(step, start, end, num_samples,
                        self._current_phases, cpu_s=cpu_s,
                        thread_cpu_s=thread_cpu_s,
                        phases_cpu_s=self._current_phases_cpu,
                        phase_cpu_sampled=self._sampling_phase_cpu,
                        cpu_steps=cpu_steps)
    self._steps.append(record)
    self._spans.append(Span(STEP, step, start, end))
    self._current_step_start = None
    self._current_phases = {}
    self._current_phases_cpu = {}
    self._sampling_phase_cpu = samples_phase_cpu(len(self._steps))
    self._previous_step_end = end
    return record

  def relabel(self, seconds_by_index: Dict[int, float], source: str,
              target: str, *, why: Optional[str] = None) -> None:
    """Counts part of some steps' `source` phase as `target` instead.

    For what only the whole run shows (`overlap_core.runtime.
    replica_phases`, `contention_split.ContentionSplit.settle`): the step
    records' phases, and the trace's spans, whose first `source` span of
    each step gives its leading seconds to `target`. The steps'
    durations, and so the phases' sum, are unchanged.

    Args:
      seconds_by_index: {index into `steps`: seconds}, each at most that
        step's `source` time (more is clipped to it).
      source, target: phase names.
      why: a name for the move, one of `NAMED_MOVES`, under which
        `summary` reports its mean per measured step (`moved_ms`); None:
        not reported.
    """
    if why is not None and why not in NAMED_MOVES:
      raise ValueError(f"unknown move {why!r}: name one of {NAMED_MOVES}")
    moved = {}
    for index, seconds in seconds_by_index.items():
      phases = self._steps[index].phases_s
      seconds = min(seconds, phases.get(source, 0.0))
      if seconds <= 0.0:
        continue
      phases[source] -= seconds
      phases[target] = phases.get(target, 0.0) + seconds
      moved[index + 1] = seconds  # spans number the steps from 1
      if why is not None:
        by_index = self._moves.setdefault(why, {})
        by_index[index] = by_index.get(index, 0.0) + seconds
    spans = []
    for span in self._spans:
      seconds = moved.pop(span.step, None) if span.name == source else None
      if seconds is None:
        spans.append(span)
        continue
      split_s = span.start_s + seconds
      spans += [Span(target, span.step, span.start_s, split_s),
                Span(source, span.step, split_s, span.end_s)]
    self._spans = spans

  def record_excess(self, excess_by_index: Dict[int, float]) -> None:
    """Records some steps' compute beyond the step timed alone, signed
    (`contention_split.ContentionSplit.settle`), for `summary`'s
    `against_step_alone`.

    Args:
      excess_by_index: {index into `steps`: seconds, negative below it}.
    """
    self._excess_s.update(excess_by_index)

  def window(self, since_step: int) -> List[StepRecord]:
    """The steps numbered above `since_step`."""
    return [r for r in self._steps if r.step > since_step]

  def summary(self, warmup_steps: Optional[int] = None) -> dict:
    """Per-phase statistics over the steady-state steps.

    Returns:
      A dict with `warmup_steps`, `measured_steps`, `samples_per_second`
      (samples of measured steps / their summed step time), `phases`:
      {name: {mean, p50, p95, total, fraction}} for every phase in PHASES,
      plus `step` and `other`; a phase never entered has zeros. A phase
      timed with `phase()` also has `cpu_mean` and `thread_cpu_mean` (CPU
      seconds per step of this process's threads, and of the training
      thread, while it lasted: the mean over the measured steps that read
      them, `samples_phase_cpu`), and `step` has them for the whole step
      (per step its readings cover: `StepRecord.cpu_steps`),
      `cpu_mean` there including child processes. `cpu`: see
      `cpu_summary`. `moved_ms`: {why: ms per measured step} for each
      of `NAMED_MOVES`, zero where `relabel` made none.
      `against_step_alone`: over the measured steps split against the
      step timed alone (`record_excess`), their number, how many ran
      below it, and their median signed excess in ms; None without such
      steps.
    """
    if warmup_steps is None:
      warmup_steps = default_warmup_steps(len(self._steps))
    measured = self._steps[warmup_steps:] or self._steps
    step_total = sum(r.duration_s for r in measured)
    phases = {}
    names = list(PHASES) + sorted(
        {n for r in measured for n in r.phases_s} - set(PHASES))
    for name in names:
      stats = describe_durations([r.phases_s.get(name, 0.0) for r in measured])
      stats["fraction"] = stats["total"] / step_total if step_total else 0.0
      phases[name] = stats
    other = [r.duration_s - sum(r.phases_s.values()) for r in measured]
    phases[OTHER] = describe_durations(other)
    phases[OTHER]["fraction"] = (phases[OTHER]["total"] / step_total
                                 if step_total else 0.0)
    phases[STEP] = describe_durations([r.duration_s for r in measured])
    phases[STEP]["fraction"] = 1.0
    sampled = [r for r in measured if r.phase_cpu_sampled]
    for name in names:
      timed = [r.phases_cpu_s[name] for r in sampled
               if name in r.phases_cpu_s]
      if timed:
        phases[name]["cpu_mean"] = sum(p for p, _ in timed) / len(sampled)
        phases[name]["thread_cpu_mean"] = (sum(t for _, t in timed)
                                           / len(sampled))
    # Each reading covers its `cpu_steps`: the mean is per step covered.
    # The first measured step reads (the warm-up ends before the first
    # step that does not), so the steps covered are the measured ones up
    # to the last reading.
    covered = sum(r.cpu_steps for r in measured) or 1
    phases[STEP]["cpu_mean"] = sum(r.cpu_s for r in measured) / covered
    phases[STEP]["thread_cpu_mean"] = sum(
        r.thread_cpu_s for r in measured) / covered
    samples = sum(r.num_samples for r in measured)
    first_measured = len(self._steps) - len(measured)
    return {
        "warmup_steps": min(warmup_steps, len(self._steps)),
        "measured_steps": len(measured),
        "samples_per_second": samples / step_total if step_total else 0.0,
        "phases": phases,
        "cpu": cpu_summary(phases[STEP]["cpu_mean"], phases[STEP]["mean"]),
        "against_step_alone": _against_step_alone(
            [self._excess_s[i] for i in range(first_measured,
                                               len(self._steps))
             if i in self._excess_s]),
        "moved_ms": {
            why: 1e3 * sum(seconds for index, seconds
                           in self._moves.get(why, {}).items()
                           if index >= first_measured)
                 / max(len(measured), 1)
            for why in NAMED_MOVES},
    }


def _against_step_alone(excess_s: List[float]) -> Optional[dict]:
  """How the measured steps' compute stood against the step timed alone:
  None where no step was split against one."""
  if not excess_s:
    return None
  return {"steps": len(excess_s),
          "steps_below": sum(1 for e in excess_s if e < 0.0),
          "median_excess_ms": 1e3 * statistics.median(excess_s)}


def cpu_summary(work_s_per_step: float, step_s: float,
                processes: int = 1) -> dict:
  """What the steps' work asked of the host.

  `work_s_per_step`: CPU seconds per step of the process tree, or of the
  `processes` processes that together run one worker's steps (PyTorch's
  mirrored replicas, none the others' child). `cores`: the cores this
  process may use. `busy_cores`: work per second of step, the cores kept
  busy on average. `work_bound_s`: work / cores, the shortest step this
  work allows on these cores if nothing else runs and every core is
  shared perfectly: a step near it has filled the machine.
  """
  cores = cpu_clock_lib.usable_cores()
  return {"work_s_per_step": work_s_per_step, "cores": cores,
          "processes": processes,
          "busy_cores": work_s_per_step / step_s if step_s else 0.0,
          "work_bound_s": work_s_per_step / cores}


def summarize_window(records: List[StepRecord]) -> Dict[str, float]:
  """Throughput and per-phase share of a run of steps (progress, scalars)."""
  total = sum(r.duration_s for r in records)
  scalars = {
      "samples_per_second":
          sum(r.num_samples for r in records) / total if total else 0.0,
      "step_ms": 1e3 * total / len(records) if records else 0.0,
  }
  folded = tuple(p for p in COMPUTE_PARTS if p not in APART_FROM_COMPUTE)
  for name in PHASES:
    # A pipelined or offloading step records its compute in parts.
    parts = (name,) + (folded if name == COMPUTE else ())
    spent = sum(r.phases_s.get(part, 0.0) for r in records for part in parts)
    scalars[f"{name}_fraction"] = spent / total if total else 0.0
  for name in APART_FROM_COMPUTE:
    # Only where the run records it: a share of zero would claim a
    # measurement the framework cannot make (TensorFlow's all-reduce).
    if any(name in r.phases_s for r in records):
      spent = sum(r.phases_s.get(name, 0.0) for r in records)
      scalars[f"{name}_fraction"] = spent / total if total else 0.0
  return scalars
