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

STAGE_COMPUTE = "stage_compute"  # a stage's forward/backward of its chunks
BUBBLE = "bubble"  # a stage waiting on a neighbour
TRANSFER = "transfer"  # point-to-point activation/gradient copies
PHASES = (STAGE_COMPUTE, BUBBLE, TRANSFER)
UPDATE = "update"  # the optimizer step: inside stage_compute, not a phase

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


class StageRecorder:
  """Bubble and transfer intervals of the current step, and every closed
  step's phase totals; thread-safe (gloo completes work on its own
  threads, and a runtime may record from a hook there).
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._pending: List[Interval] = []
    self._pending_update_s: Optional[float] = None
    self._steps: List[Dict[str, float]] = []

  def record(self, phase: str, start_s: float, end_s: float) -> None:
    """One interval of `phase` (BUBBLE or TRANSFER) in the current step."""
    if phase not in (BUBBLE, TRANSFER):
      raise ValueError(f"phase={phase!r}: allowed: {BUBBLE}, {TRANSFER} "
                       f"({STAGE_COMPUTE} is what they leave)")
    with self._lock:
      self._pending.append((phase, start_s, end_s))

  def record_update(self, start_s: float, end_s: float) -> None:
    """The optimizer's update of this step: a part of stage_compute, kept
    apart as UPDATE in the step's totals (not a ledger phase)."""
    with self._lock:
      self._pending_update_s = (self._pending_update_s or 0.0) + (
          end_s - start_s)

  def end_step(self, start_s: float, end_s: float) -> List[Interval]:
    """Closes the step that ran from start_s to end_s; returns its spans
    (`partition_span`) and keeps their per-phase totals."""
    with self._lock:
      pending, self._pending = self._pending, []
      update_s, self._pending_update_s = self._pending_update_s, None
    spans = partition_span(start_s, end_s, pending)
    totals = {phase: 0.0 for phase in PHASES}
    for phase, begin, end in spans:
      totals[phase] += end - begin
    if update_s is not None:
      totals[UPDATE] = update_s
    with self._lock:
      self._steps.append(totals)
    return spans

  @property
  def steps(self) -> List[Dict[str, float]]:
    with self._lock:
      return list(self._steps)

  def medians_ms(self, warmup_steps: int = 0) -> Dict[str, Optional[float]]:
    """{compute_ms, bubble_ms, transfer_ms, update_ms}: per-step medians
    after the warm-up (all steps if none is left); None before any step,
    and update_ms None unless every step recorded its update."""
    steps = self.steps
    measured = steps[warmup_steps:] or steps
    keys = {STAGE_COMPUTE: "compute_ms", BUBBLE: "bubble_ms",
            TRANSFER: "transfer_ms", UPDATE: "update_ms"}
    return {key: (1e3 * statistics.median(s[phase] for s in measured)
                  if measured and all(phase in s for s in measured) else None)
            for phase, key in keys.items()}


def stage_entry(stage: int, *, layers: Sequence[str], device: str,
                medians_ms: Dict[str, Optional[float]],
                predicted_ms: Optional[float] = None,
                predicted_update_ms: Optional[float] = None,
                predicted_memory_mb: Optional[float] = None) -> dict:
  """One row of `per_stage`: the plan's prediction beside the measurement
  (predictions None when the run had no profile). predicted_ms and
  compute_ms are the whole stage_compute of a step; the update_ms pair is
  the optimizer's share of each (measured None where the runtime cannot
  time it apart)."""
  return {"stage": stage, "layers": list(layers), "device": device,
          "predicted_ms": predicted_ms,
          "predicted_update_ms": predicted_update_ms,
          "predicted_memory_mb": predicted_memory_mb,
          "compute_ms": medians_ms.get("compute_ms"),
          "update_ms": medians_ms.get("update_ms"),
          "bubble_ms": medians_ms.get("bubble_ms"),
          "transfer_ms": medians_ms.get("transfer_ms")}


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
                     per_stage: Sequence[dict] = ()) -> dict:
  """run.json's `pipeline`: the schedule, the split, the theoretical and
  the measured bubble, and one `stage_entry` per stage (ms per step)."""
  return {
      "schedule": schedule,
      "stages": stages,
      "micro_batches": micro_batches,
      "virtual_stages": virtual_stages,
      "replicas": replicas,
      "split": split,
      "cut_layers": list(cut_layers),
      "bubble_fraction_theory": bubble_fraction_theory(
          schedule, stages, micro_batches, virtual_stages),
      "bubble_fraction": measured_bubble_fraction(per_stage),
      "per_stage": sorted((dict(row) for row in per_stage),
                          key=lambda row: row["stage"]),
  }
