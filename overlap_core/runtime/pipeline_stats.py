"""What a pipeline spends, per stage: the run.json `pipeline` section.

Both frameworks record a pipelined step in these three phases, per stage:

  stage_compute  the stage running forward and backward of its micro-batches
  bubble         the stage waiting on a neighbour (GPipe's fill and drain)
  transfer       point-to-point copies: activations forward, gradients back

In a pipelined run they replace the ledger's `compute` phase of each step:
the three partition the compute span (see `split_compute_span`), so phases
still add up to the step. Per stage they are kept here, one value per step
and phase; the section reports per-step medians in ms beside the plan's
predictions (null without a profile), with the measured bubble fraction

  bubble / (stage_compute + bubble + transfer), summed over stages

next to GPipe's theory (S - 1) / (M + S - 1). How each figure was obtained
(timed per stage, or derived from the schedule) differs by framework; the
section's `sources` says which is which.

  stats = StageStats(num_stages=2)
  stats.add(0, STAGE_COMPUTE, 0.012)
  stats.add(0, BUBBLE, 0.004)
  stats.end_step()
  stats.per_stage_ms()[0][STAGE_COMPUTE]  # 12.0
"""

import statistics
import threading
from typing import Dict, List, Optional, Sequence, Tuple

STAGE_COMPUTE = "stage_compute"
BUBBLE = "bubble"
TRANSFER = "transfer"
PIPELINE_PHASES = (STAGE_COMPUTE, BUBBLE, TRANSFER)
_THEORY_SCHEDULES = ("gpipe", "1f1b")


class StageStats:
  """Seconds per stage, phase and step; thread-safe.

  A stage's phases may be recorded from the thread that runs it; a step's
  values are kept apart from the next step's by `end_step`.
  """

  def __init__(self, num_stages: int):
    if num_stages < 1:
      raise ValueError(f"Invalid value for argument `num_stages`. Received: "
                       f"{num_stages}; allowed: an integer >= 1")
    self.num_stages = num_stages
    self._lock = threading.Lock()
    self.reset()

  def reset(self) -> None:
    """Forgets every step so far (warm-up steps)."""
    with self._lock:
      self._open = self._empty_step()
      self._steps: List[List[Dict[str, float]]] = []

  def _empty_step(self) -> List[Dict[str, float]]:
    return [{p: 0.0 for p in PIPELINE_PHASES} for _ in range(self.num_stages)]

  def add(self, stage: int, phase: str, duration_s: float) -> None:
    """Adds `duration_s` of `phase` to `stage` in the open step."""
    if phase not in PIPELINE_PHASES:
      raise ValueError(f"phase={phase!r}: allowed: "
                       f"{', '.join(PIPELINE_PHASES)}")
    if not 0 <= stage < self.num_stages:
      raise ValueError(f"stage={stage}: allowed: 0 to {self.num_stages - 1}")
    with self._lock:
      self._open[stage][phase] += max(0.0, float(duration_s))

  def end_step(self) -> None:
    """Closes the open step."""
    with self._lock:
      self._steps.append(self._open)
      self._open = self._empty_step()

  @property
  def num_steps(self) -> int:
    with self._lock:
      return len(self._steps)

  def per_stage_ms(self, skip_steps: int = 0) -> List[Dict[str, float]]:
    """Per stage, the per-step median of each phase in ms (None: no step)."""
    with self._lock:
      steps = self._steps[skip_steps:] or self._steps
      return [{p: (1e3 * statistics.median(s[k][p] for s in steps)
                   if steps else None) for p in PIPELINE_PHASES}
              for k in range(self.num_stages)]

  def bubble_fraction(self, skip_steps: int = 0) -> Optional[float]:
    """Measured bubble over all three phases, summed over stages."""
    per_stage = self.per_stage_ms(skip_steps)
    if any(v is None for s in per_stage for v in s.values()):
      return None
    total = sum(sum(s.values()) for s in per_stage)
    return sum(s[BUBBLE] for s in per_stage) / total if total else None


def bubble_fraction_theory(schedule: str, stages: int,
                           micro_batches: int) -> Optional[float]:
  """(S - 1) / (M + S - 1) for GPipe and 1F1B; None for other schedules."""
  if schedule not in _THEORY_SCHEDULES:
    return None
  return (stages - 1) / (micro_batches + stages - 1)


def split_compute_span(start_s: float, end_s: float, *,
                       stage_compute_s: float,
                       transfer_s: float) -> List[Tuple[str, float, float]]:
  """The ledger's three phases partitioning one compute span.

  The span is the step's compute as the host saw it; `stage_compute_s` and
  `transfer_s` are a stage's own (e.g. the mean stage's). Compute comes
  first, then transfers, and the rest is bubble; a span shorter than the
  parts is filled in that order, so the three always add up to the span.
  """
  span = max(0.0, end_s - start_s)
  compute = min(span, max(0.0, stage_compute_s))
  transfer = min(span - compute, max(0.0, transfer_s))
  bounds = [start_s, start_s + compute, start_s + compute + transfer, end_s]
  phases = (STAGE_COMPUTE, TRANSFER, BUBBLE)
  return [(p, bounds[i], bounds[i + 1]) for i, p in enumerate(phases)]


def pipeline_section(*, schedule: str, stages: int, micro_batches: int,
                     virtual_stages: int, replicas: int, split: str,
                     cut_layers: Sequence[str], stats: StageStats,
                     stage_layers: Sequence[Sequence[str]],
                     stage_devices: Sequence[str],
                     predicted_ms: Optional[Sequence[float]] = None,
                     predicted_memory_mb: Optional[Sequence[float]] = None,
                     sources: Optional[Dict[str, str]] = None,
                     skip_steps: int = 0) -> dict:
  """run.json's `pipeline` section: the plan, theory and measurements.

  Args:
    schedule, stages, micro_batches, virtual_stages, replicas, split,
      cut_layers: the run's pipeline as configured and cut.
    stats: the per-stage phases of the run's steps.
    stage_layers: per stage, the layers it runs.
    stage_devices: per stage, where it runs.
    predicted_ms: per stage, the plan's predicted ms per step (None: the
      run had no profile to predict from).
    predicted_memory_mb: per stage, the plan's predicted memory.
    sources: phase -> how it was obtained ("measured: ...", "derived: ...").
    skip_steps: warm-up steps left out of the medians.
  """
  measured = stats.per_stage_ms(skip_steps)
  per_stage = []
  for k in range(len(stage_layers)):
    per_stage.append({
        "stage": k,
        "layers": list(stage_layers[k]),
        "device": stage_devices[k],
        "predicted_ms": predicted_ms[k] if predicted_ms else None,
        "predicted_memory_mb": (predicted_memory_mb[k]
                                if predicted_memory_mb else None),
        "compute_ms": measured[k][STAGE_COMPUTE],
        "bubble_ms": measured[k][BUBBLE],
        "transfer_ms": measured[k][TRANSFER],
    })
  return {
      "schedule": schedule,
      "stages": stages,
      "micro_batches": micro_batches,
      "virtual_stages": virtual_stages,
      "replicas": replicas,
      "split": split,
      "cut_layers": list(cut_layers),
      "bubble_fraction_theory": bubble_fraction_theory(schedule, stages,
                                                       micro_batches),
      "bubble_fraction": stats.bubble_fraction(skip_steps),
      "per_stage": per_stage,
      "sources": dict(sources or {}),
  }
