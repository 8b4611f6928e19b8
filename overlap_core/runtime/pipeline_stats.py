"""What a pipeline stage spends per step: the run.json `pipeline` section.

Both trainers' pipeline runtimes time three phases on every rank:

  stage_compute  the stage running forward and backward of its
                 micro-batches (and what else the step computes: the loss,
                 the optimizer step, a replicated stage's gradient
                 all-reduce, the schedule's own bookkeeping)
  bubble         the stage waiting on a neighbour: an activation or a
                 gradient that has not arrived yet
  transfer       point-to-point copies: posting sends and receives and
                 waiting for a send to leave

Inside stage_compute, a runtime that can see the optimizer's update (the
PyTorch one calls `optimizer.step()` on the host) also times it apart,
`record_update`, so that run.json shows how much of a stage's step was
its update: the part of the plan's prediction that the micro-batch count
does not scale.

In a pipelined run these three replace the ledger's `compute` phase of each
step and partition it: `partition_span` turns the bubble and transfer
intervals a runtime recorded into spans that tile the compute span, the
gaps between them being stage_compute.

  recorder = StageRecorder()
  recorder.record(BUBBLE, start_s, end_s)      # from the runtime's hooks
  spans = recorder.end_step(step_start_s, step_end_s)  # -> ledger.add(...)
  section = pipeline_section(schedule="gpipe", stages=2, micro_batches=2,
                             per_stage=[stage_entry(0, recorder, ...), ...])
"""

import statistics
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from overlap_core.runtime import bubble_parts, comm_stats

STAGE_COMPUTE = "stage_compute"  # a stage's forward/backward of its chunks
BUBBLE = "bubble"  # a stage waiting on a neighbour
TRANSFER = "transfer"  # point-to-point activation/gradient copies
PHASES = (STAGE_COMPUTE, BUBBLE, TRANSFER)
UPDATE = "update"  # the optimizer step: inside stage_compute, not a phase
LOSS = "loss"  # the last stage's loss: inside stage_compute, not a phase
# Posting sends and receives: the part of transfer that is not a wait
# (a wait on a send can be a wait on the neighbour's receive).
POSTING = "posting"
# A replicated stage's gradient all-reduce that the step waited for: a
# phase of its own, carved out of the step like the bubble.
EXPOSED_COMM = comm_stats.EXPOSED_COMM

Interval = Tuple[str, float, float]  # (phase, start_s, end_s)


def bubble_fraction_theory(schedule: str, stages: int, micro_batches: int,
                           virtual_stages: int = 1) -> Optional[float]:
  """The idle share of a step the schedule's own arithmetic predicts.

  GPipe and 1F1B: (S - 1) / (M + S - 1) (1F1B changes memory, not the
  bubble). Interleaved 1F1B with V stages per rank shrinks the fill and
  drain by V (Narayanan et al., 2021): (S - 1) / (V M + S - 1). Zero-bubble
  schedules aim at none and have no closed form here: None.
  """
  if stages < 1 or micro_batches < 1 or virtual_stages < 1:
    raise ValueError(f"Invalid stages/micro_batches/virtual_stages: "
                     f"{stages}, {micro_batches}, {virtual_stages}; allowed:"
                     " integers >= 1")
  if schedule in ("gpipe", "1f1b"):
    return (stages - 1) / (micro_batches + stages - 1)
  if schedule == "interleaved_1f1b":
    return (stages - 1) / (virtual_stages * micro_batches + stages - 1)
  return None


def partition_span(start_s: float, end_s: float,
                   intervals: Sequence[Interval]) -> List[Interval]:
  """Spans that tile [start_s, end_s]: the intervals, clipped to it and
  in time order, and stage_compute in every gap between them.

  Intervals come from one thread and do not overlap; should two touch or
  overlap anyway (a clock read late), the later one starts where the
  earlier ended, so no time is counted twice.
  """
  spans: List[Interval] = []
  cursor = start_s
  for phase, begin, end in sorted(intervals, key=lambda i: i[1]):
    begin, end = max(begin, cursor), min(end, end_s)
    if end <= begin:
      continue
    if begin > cursor:
      spans.append((STAGE_COMPUTE, cursor, begin))
    spans.append((phase, begin, end))
    cursor = end
  if end_s > cursor:
    spans.append((STAGE_COMPUTE, cursor, end_s))
  return spans


def idle_intervals(start_s: float, end_s: float,
                   busy: Sequence[Tuple[float, float]]) -> List[Interval]:
  """BUBBLE intervals: the parts of [start_s, end_s] that no busy
  (start_s, end_s) interval covers. Busy intervals may overlap (a stage
  handed its next input while still on the last one is busy once)."""
  idle: List[Interval] = []
  cursor = start_s
  for begin, end in sorted(busy):
    begin, end = max(begin, start_s), min(end, end_s)
    if end <= begin:
      continue
    if begin > cursor:
      idle.append((BUBBLE, cursor, begin))
    cursor = max(cursor, end)
  if end_s > cursor:
    idle.append((BUBBLE, cursor, end_s))
  return idle


def busy_seconds(busy: Sequence[Tuple[float, float]]) -> float:
  """The time the union of busy (start_s, end_s) intervals covers: a
  stage's own work in a step, where `idle_intervals` leaves out of its
  span what it covers (a stage timed alone has no span but its work)."""
  if not busy:
    return 0.0
  start_s = min(b for b, _ in busy)
  end_s = max(e for _, e in busy)
  return (end_s - start_s) - sum(
      e - b for _, b, e in idle_intervals(start_s, end_s, busy))


class StageRecorder:
  """Bubble and transfer intervals of the current step, and every closed
  step's phase totals; thread-safe (gloo completes work on its own
  threads, and a runtime may record from a hook there).
  """

  def __init__(self, *, times_all_reduce: bool = False):
    """times_all_reduce: every step records its EXPOSED_COMM (a stage
    with replicas), so a step without a wait counts zero, not unknown."""
    self._lock = threading.Lock()
    self._times_all_reduce = times_all_reduce
    self._pending: List[Interval] = []
    self._pending_parts: Dict[str, float] = {}
    self._steps: List[Dict[str, float]] = []

  @property
  def phases(self) -> Tuple[str, ...]:
    """The ledger phases this recorder's spans use."""
    return PHASES + ((EXPOSED_COMM,) if self._times_all_reduce else ())

  def record(self, phase: str, start_s: float, end_s: float) -> None:
    """One interval of `phase` (BUBBLE, TRANSFER or, with
    times_all_reduce, EXPOSED_COMM) in the current step."""
    allowed = self.phases[1:]
    if phase not in allowed:
      raise ValueError(f"phase={phase!r}: allowed: {', '.join(allowed)} "
                       f"({STAGE_COMPUTE} is what they leave)")
    with self._lock:
      self._pending.append((phase, start_s, end_s))

  def record_update(self, start_s: float, end_s: float) -> None:
    """The optimizer's update of this step: a part of stage_compute, kept
    apart as UPDATE in the step's totals (not a ledger phase)."""
    self._record_part(UPDATE, end_s - start_s)

  def record_loss(self, start_s: float, end_s: float) -> None:
    """One micro-batch's loss on the last stage: a part of stage_compute,
    kept apart as LOSS (summed over the step's micro-batches)."""
    self._record_part(LOSS, end_s - start_s)

  def record_posting(self, start_s: float, end_s: float) -> None:
    """Handing one batch of sends and receives to the backend: a part of
    a TRANSFER interval (also recorded), kept apart as POSTING."""
    self._record_part(POSTING, end_s - start_s)

  def _record_part(self, part: str, seconds: float) -> None:
    with self._lock:
      self._pending_parts[part] = self._pending_parts.get(part, 0.0) + seconds

  def discard_pending(self) -> None:
    """Drops what was recorded since the last step closed: steps the
    ledger does not record (the stage timed alone before training)."""
    with self._lock:
      self._pending, self._pending_parts = [], {}

  def end_step(self, start_s: float, end_s: float) -> List[Interval]:
    """Closes the step that ran from start_s to end_s; returns its spans
    (`partition_span`) and keeps their per-phase totals."""
    with self._lock:
      pending, self._pending = self._pending, []
      parts, self._pending_parts = self._pending_parts, {}
    spans = partition_span(start_s, end_s, pending)
    totals = {phase: 0.0 for phase in self.phases}
    for phase, begin, end in spans:
      totals[phase] += end - begin
    totals.update(parts)
    with self._lock:
      self._steps.append(totals)
    return spans

  @property
  def steps(self) -> List[Dict[str, float]]:
    with self._lock:
      return list(self._steps)

  def medians_ms(self, warmup_steps: int = 0) -> Dict[str, Optional[float]]:
    """{compute_ms, bubble_ms, transfer_ms, update_ms, loss_ms,
    posting_ms, exposed_comm_ms}: per-step medians after the warm-up (all
    steps if none is left); None before any step, and the last four None
    unless every step recorded them."""
    steps = self.steps
    measured = steps[warmup_steps:] or steps
    keys = {STAGE_COMPUTE: "compute_ms", BUBBLE: "bubble_ms",
            TRANSFER: "transfer_ms", UPDATE: "update_ms", LOSS: "loss_ms",
            POSTING: "posting_ms", EXPOSED_COMM: "exposed_comm_ms"}
    return {key: (1e3 * statistics.median(s[phase] for s in measured)
                  if measured and all(phase in s for s in measured) else None)
            for phase, key in keys.items()}


def stage_entry(stage: int, *, layers: Sequence[str], device: str,
                medians_ms: Dict[str, Optional[float]],
                predicted_ms: Optional[float] = None,
                predicted_update_ms: Optional[float] = None,
                predicted_memory_mb: Optional[float] = None,
                saved_activation_peak_bytes: Optional[int] = None) -> dict:
  """One row of `per_stage`: the plan's prediction beside the measurement
  (predictions None when the run had no profile). predicted_ms and
  compute_ms are the whole stage_compute of a step; the update_ms pair is
  the optimizer's share of each, loss_ms the last stage's loss, posting_ms
  the share of transfer_ms spent posting, not waiting (measured None where
  the runtime cannot time it apart); exposed_comm_ms the
  replicas' all-reduce the step waited for (None without replicas);
  saved_activation_peak_bytes the most bytes of tensors saved for
  backward the stage held at once in a step (None where not counted)."""
  return {"stage": stage, "layers": list(layers), "device": device,
          "predicted_ms": predicted_ms,
          "predicted_update_ms": predicted_update_ms,
          "predicted_memory_mb": predicted_memory_mb,
          "compute_ms": medians_ms.get("compute_ms"),
          "update_ms": medians_ms.get("update_ms"),
          "bubble_ms": medians_ms.get("bubble_ms"),
          "transfer_ms": medians_ms.get("transfer_ms"),
          "posting_ms": medians_ms.get("posting_ms"),
          "loss_ms": medians_ms.get("loss_ms"),
          "exposed_comm_ms": medians_ms.get("exposed_comm_ms"),
          "saved_activation_peak_bytes": saved_activation_peak_bytes}


def measured_bubble_fraction(per_stage: Sequence[dict]) -> Optional[float]:
  """bubble / (stage_compute + bubble + transfer), summed over stages."""
  bubble = total = 0.0
  for row in per_stage:
    parts = [row.get("compute_ms"), row.get("bubble_ms"),
             row.get("transfer_ms")]
    if any(p is None for p in parts):
      return None
    bubble += parts[1]
    total += sum(parts)
  return bubble / total if total > 0 else None


def pipeline_section(*, schedule: str, stages: int, micro_batches: int,
                     virtual_stages: int = 1, replicas: int = 1,
                     split: str = "even", cut_layers: Sequence[str] = (),
                     per_stage: Sequence[dict] = (),
                     all_reduce_overlapped: Optional[bool] = None) -> dict:
  """run.json's `pipeline`: the schedule, the split, the theoretical and
  the measured bubble, one `stage_entry` per stage (ms per step), and each
  stage's idle time in parts (`bubble_parts`).

  all_reduce_overlapped: with replicas, whether each stage's all-reduce
  ran during backward (True) or after the schedule's step (False); None
  where no stage all-reduces (one pipeline)."""
  parts = bubble_parts.split_idle(per_stage, schedule=schedule,
                                  micro_batches=micro_batches,
                                  virtual_stages=virtual_stages)
  return {
      "schedule": schedule,
      "stages": stages,
      "micro_batches": micro_batches,
      "virtual_stages": virtual_stages,
      "replicas": replicas,
      "all_reduce_overlapped": all_reduce_overlapped,
      "split": split,
      "cut_layers": list(cut_layers),
      "bubble_fraction_theory": bubble_fraction_theory(
          schedule, stages, micro_batches, virtual_stages),
      "bubble_fraction": measured_bubble_fraction(per_stage),
      "per_stage": sorted((dict(row) for row in per_stage),
                          key=lambda row: row["stage"]),
      "bubble_parts": {"per_stage": parts,
                       "summary": bubble_parts.summarize(parts)},
  }
