"""When to checkpoint: every N steps, or the smallest interval under a bound.

The adaptive policy follows CheckFreq (Mohan et al., FAST'21): measure what a
checkpoint costs, then checkpoint as often as an overhead bound allows. A
checkpoint costs the training loop two things:

  stall          the time the training thread is blocked (the snapshot, or
                 the whole save for a synchronous one);
  interference   the time steps lose while a background persist competes
                 with them for cores, memory bandwidth and links. If a persist
                 of P seconds slows a step from t to t_busy, the steps it
                 overlaps lose P * (1 - t / t_busy) in total.

Checkpointing every k steps then costs (stall + interference) / (k * t) of
the training time, so k = ceil((stall + interference) / (bound * t)). Also,
k * t >= P, so that a persist ends before the next snapshot is due (else
the busy policy, wait or skip, has to intervene). The policy probes first
(one checkpoint after `probe_steps` steps), plans when the probe's persist
has finished, and replans at every checkpoint from running medians, so it
follows costs that change. Every plan is kept with its reason.

Multi-worker runs must agree on the cadence. Decisions happen only at steps
every worker can compute (checkpoint steps, and probe points while no plan
exists), and there `agree` combines the workers' estimates (an all-reduce
maximum), so every worker plans from the same numbers.

Nothing here imports a framework; both trainers use it unchanged.
"""

import collections
import dataclasses
import math
import statistics
from typing import Callable, List, Optional, Sequence

from overlap_core.runtime.config import CHECKPOINT_AUTO

AUTO = CHECKPOINT_AUTO  # the `every_steps` that asks for the adaptive policy
UNKNOWN = -1.0  # an estimate with no measurement yet (all-reduce safe)

Agree = Callable[[Sequence[float]], Sequence[float]]


@dataclasses.dataclass(frozen=True)
class CostEstimate:
  """Medians of what the last steps and checkpoints cost, in seconds."""
  step_s: float  # a step with no persist running
  busy_step_s: float  # a step while a persist runs
  stall_s: float  # training blocked, per checkpoint
  persist_s: float  # one background persist

  def to_vector(self) -> List[float]:
    return [self.step_s, self.busy_step_s, self.stall_s, self.persist_s]

  @classmethod
  def from_vector(cls, vector: Sequence[float]) -> "CostEstimate":
    return cls(*[float(v) for v in vector])

  @property
  def interference_s(self) -> float:
    if self.busy_step_s <= 0 or self.step_s <= 0 or self.persist_s <= 0:
      return 0.0
    return self.persist_s * max(0.0, 1.0 - self.step_s / self.busy_step_s)


@dataclasses.dataclass(frozen=True)
class CadenceDecision:
  step: int  # the step at which the decision was taken
  every_steps: int
  predicted_overhead_frac: float
  reason: str

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def plan_interval(costs: CostEstimate, max_overhead_frac: float, *,
                  max_every_steps: int = 1_000_000):
  """The smallest interval that keeps the checkpoint overhead in bound.

  Returns:
    (every_steps, predicted overhead fraction, the reason in words).
  """
  per_checkpoint_s = costs.stall_s + costs.interference_s
  by_overhead = math.ceil(per_checkpoint_s / (max_overhead_frac
                                              * costs.step_s))
  by_persist = math.ceil(max(costs.persist_s, 0.0) / costs.step_s)
  every = max(1, by_overhead, by_persist)
  clamped = every > max_every_steps
  every = min(every, max_every_steps)
  predicted = per_checkpoint_s / (every * costs.step_s)
  if clamped:
    binding = f"capped at {max_every_steps} steps"
  elif by_persist >= by_overhead and by_persist > 1:
    binding = (f"a persist takes {costs.persist_s * 1e3:.1f} ms, "
               f"{by_persist} steps, and must end before the next snapshot")
  elif by_overhead > 1:
    binding = f"the overhead bound {max_overhead_frac:.1%}"
  else:
    binding = "every step fits the bound"
  reason = (f"every {every} steps: stall {costs.stall_s * 1e3:.1f} ms + "
            f"interference {costs.interference_s * 1e3:.1f} ms per "
            f"checkpoint, steps of {costs.step_s * 1e3:.1f} ms -> predicted "
            f"overhead {predicted:.2%} (bound {max_overhead_frac:.1%}); "
            f"set by {binding}")
  return every, predicted, reason


def _median(samples) -> float:
  return statistics.median(samples) if samples else UNKNOWN


class CadencePolicy:
  """Says at which steps to checkpoint.

  Usage (one call of `is_due` per step, on every worker):

    policy = CadencePolicy(AUTO, max_overhead_frac=0.03, first_step=1)
    for step in ...:
      train_step()
      policy.observe_step(step_s, persisting=persister.busy)
      if policy.is_due(step, agree=all_reduce_max):
        ... snapshot; policy.observe_stall(stall_s)
      ... when a persist ends: policy.observe_persist(persist_s)

  Args:
    every_steps: a fixed interval, or AUTO.
    max_overhead_frac: the bound the adaptive policy keeps to (0.03 = 3%).
    first_step: the first step this process runs (one past a restored one).
    probe_steps: steps before the probe checkpoint, and between attempts to
      plan while the probe's persist is still running.
    window: how many recent samples the medians use.
  """

  def __init__(self, every_steps: int, *, max_overhead_frac: float = 0.03,
               first_step: int = 1, probe_steps: int = 10, window: int = 50,
               max_every_steps: int = 1_000_000,
               log: Callable[[str], None] = lambda message: None):
    if every_steps < 0:
      raise ValueError(f"every_steps={every_steps}: allowed: AUTO (0) or an "
                       "integer >= 1")
    if not 0 < max_overhead_frac < 1:
      raise ValueError(f"max_overhead_frac={max_overhead_frac}: allowed: a "
                       "fraction between 0 and 1, e.g. 0.03")
    if probe_steps < 1:
      raise ValueError(f"probe_steps={probe_steps}: allowed: >= 1")
    self.fixed_every_steps = every_steps or None
    self.max_overhead_frac = max_overhead_frac
    self._probe_steps = probe_steps
    self._max_every_steps = max_every_steps
    self._log = log
    self._idle_steps = collections.deque(maxlen=window)
    self._busy_steps = collections.deque(maxlen=window)
    self._stalls = collections.deque(maxlen=max(5, window // 10))
    self._persists = collections.deque(maxlen=max(5, window // 10))
    self.decisions: List[CadenceDecision] = []
    self.every_steps: Optional[int] = self.fixed_every_steps
    self._last_checkpoint_step: Optional[int] = None
    self._next_attempt: Optional[int] = None
    self.restart_at(first_step)

  def restart_at(self, first_step: int) -> None:
    """Starts the adaptive cadence over: a probe after `probe_steps` steps."""
    self._next_due = first_step + self._probe_steps - 1
    self._next_attempt = None

  @property
  def is_auto(self) -> bool:
    return self.fixed_every_steps is None

  def observe_step(self, step_s: float, *, persisting: bool) -> None:
    """A training step's time, without any checkpoint stall in it."""
    (self._busy_steps if persisting else self._idle_steps).append(step_s)

  def observe_stall(self, stall_s: float) -> None:
    self._stalls.append(stall_s)

  def observe_persist(self, persist_s: float) -> None:
    self._persists.append(persist_s)

  def local_estimate(self) -> CostEstimate:
    return CostEstimate(step_s=_median(self._idle_steps),
                        busy_step_s=_median(self._busy_steps),
                        stall_s=_median(self._stalls),
                        persist_s=_median(self._persists))

  def is_due(self, step: int, agree: Optional[Agree] = None) -> bool:
    """Whether to checkpoint after `step`; may replan (see the module doc).

    Every worker must call this at every step with the same `step`, since
    `agree` may be a collective.
    """
    if not self.is_auto:
      return step % self.fixed_every_steps == 0
    due = step >= self._next_due
    if due:
      self._last_checkpoint_step = step
    planning = (due and self.every_steps is not None) or (
        self._next_attempt is not None and step >= self._next_attempt)
    if planning:
      self._plan(step, agree)
    elif due:
      # The probe: plan once its persist has been measured.
      self._next_due = math.inf
      self._next_attempt = step + self._probe_steps
    return due

  def _plan(self, step: int, agree: Optional[Agree]) -> None:
    vector = self.local_estimate().to_vector()
    costs = CostEstimate.from_vector(agree(vector) if agree else vector)
    if costs.step_s <= 0 or costs.stall_s < 0 or costs.persist_s < 0:
      self._next_attempt = step + self._probe_steps  # not measured yet
      return
    every, predicted, reason = plan_interval(
        costs, self.max_overhead_frac, max_every_steps=self._max_every_steps)
    self._next_attempt = None
    current = self.every_steps
    # A longer interval is taken at once (the bound needs it). A shorter one
    # only when it is 10% shorter, and at most half as long per decision:
    # the interference estimate is a difference of two noisy medians, and on
    # a loaded host it swings; this keeps the cadence from flapping with it.
    if current is not None and every < (current + 1) // 2:
      planned, every = every, (current + 1) // 2
      predicted *= planned / every
      reason += (f"; shortened only to {every} steps, at most halving per "
                 "decision")
    changed = current is None or every > current or every < 0.9 * current
    if changed:
      self.every_steps = every
    self._next_due = max(self._last_checkpoint_step + self.every_steps,
                         step + 1)
    if changed:
      decision = CadenceDecision(step=step, every_steps=every,
                                 predicted_overhead_frac=predicted,
                                 reason=reason)
      self.decisions.append(decision)
      self._log(f"checkpoint cadence at step {step}: {reason}")
