"""When to checkpoint: every N steps, or the smallest interval under a bound.

The adaptive policy follows CheckFreq (Mohan et al., FAST'21): measure what a
checkpoint costs, then checkpoint as often as an overhead bound allows. A
checkpoint costs the training loop three things:

  stall          the time the training thread is blocked (the snapshot, or
                 the whole save for a synchronous one);
  after-snapshot what the first step after a snapshot takes beyond an
                 ordinary step. On a CPU, TensorFlow's snapshot shares the
                 variables' buffers and the next update copies them
                 (copy-on-write): the stall leaves that copy out, this
                 step holds it;
  interference   the time steps lose while a background persist competes
                 with them for cores, memory bandwidth and links. Measured
                 two ways, and the larger is taken:
                   by step times: if a persist of P seconds slows a step
                   from t to t_busy, the steps it overlaps lose
                   P * (1 - t / t_busy) in total;
                   by CPU time: a persist that needs c CPU-seconds on a host
                   whose cores training keeps busy a share u of the time
                   takes about u * c from training.
                 The first is a difference of two noisy medians; on a
                 2-core host it came out 2 to 10 times under the loss
                 measured against runs without checkpoints. The second
                 rests on two clocks that noise barely moves.

Checkpointing every k steps then costs C / (k * t) of the training time,
where C is the sum of the three, so k = ceil(C / (bound * t)). Also,
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


def _known(value: float) -> bool:
  return value > 0


@dataclasses.dataclass(frozen=True)
class CostEstimate:
  """Medians of what the last steps and checkpoints cost, in seconds.

  The last three may be UNKNOWN: estimates from before they were measured,
  and callers that measure only the first four, still plan.
  """
  step_s: float  # a step with no persist running
  busy_step_s: float  # a step while a persist runs
  stall_s: float  # training blocked, per checkpoint
  persist_s: float  # one background persist, wall time
  after_snapshot_s: float = UNKNOWN  # the first step after a snapshot
  persist_cpu_s: float = UNKNOWN  # CPU time of one persist's thread
  cpu_share: float = UNKNOWN  # share of the host's cores training keeps busy

  def to_vector(self) -> List[float]:
    return [self.step_s, self.busy_step_s, self.stall_s, self.persist_s,
            self.after_snapshot_s, self.persist_cpu_s, self.cpu_share]

  @classmethod
  def from_vector(cls, vector: Sequence[float]) -> "CostEstimate":
    return cls(*[float(v) for v in vector])

  @property
  def after_snapshot_extra_s(self) -> float:
    """What the first step after a snapshot takes beyond an ordinary one."""
    if not (_known(self.after_snapshot_s) and _known(self.step_s)):
      return 0.0
    return max(0.0, self.after_snapshot_s - self.step_s)

  @property
  def interference_by_steps_s(self) -> float:
    if not (_known(self.busy_step_s) and _known(self.step_s)
            and _known(self.persist_s)):
      return 0.0
    return self.persist_s * max(0.0, 1.0 - self.step_s / self.busy_step_s)

  @property
  def interference_by_cpu_s(self) -> float:
    if not (_known(self.persist_cpu_s) and _known(self.cpu_share)):
      return 0.0
    return self.persist_cpu_s * min(1.0, self.cpu_share)

  @property
  def interference_s(self) -> float:
    return max(self.interference_by_steps_s, self.interference_by_cpu_s)

  @property
  def per_checkpoint_s(self) -> float:
    """All a checkpoint costs the training loop (see the module doc)."""
    return (max(self.stall_s, 0.0) + self.after_snapshot_extra_s
            + self.interference_s)


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
  per_checkpoint_s = costs.per_checkpoint_s
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
            f"after-snapshot step {costs.after_snapshot_extra_s * 1e3:.1f} "
            f"ms + interference {costs.interference_s * 1e3:.1f} ms (by "
            f"step times {costs.interference_by_steps_s * 1e3:.1f}, by CPU "
            f"{costs.interference_by_cpu_s * 1e3:.1f}) per checkpoint, "
            f"steps of {costs.step_s * 1e3:.1f} ms -> predicted "
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
      policy.observe_step(step_s, persisting=persister.busy,
                          cpu_share=cpu_s / (step_s * num_cores))
      if policy.is_due(step, agree=all_reduce_max):
        ... snapshot; policy.observe_stall(stall_s)
      ... when a persist ends: policy.observe_persist(persist_s, cpu_s=c)

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
    # every_steps and max_overhead_frac come from a CheckpointConfig, which
    # validated them; probe_steps is the policy's own knob.
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
    self._after_snapshots = collections.deque(maxlen=max(5, window // 10))
    self._persist_cpus = collections.deque(maxlen=max(5, window // 10))
    self._cpu_shares = collections.deque(maxlen=window)
    self._snapshot_just_taken = False
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

  def observe_step(self, step_s: float, *, persisting: bool,
                   num_steps: int = 1,
                   cpu_share: Optional[float] = None) -> None:
    """A training step's time, without any checkpoint stall in it.

    Args:
      step_s: the mean of `num_steps` steps that ran in one span (a loop
        that runs several steps per call reports each call's span).
      persisting: whether a persist ran during them.
      num_steps: how many steps the span held.
      cpu_share: the share of the host's CPU capacity the process used
        during them; kept from spans with no persist running, where it is
        the training's own.
    """
    if self._snapshot_just_taken:
      self._snapshot_just_taken = False
      # The span holds the step after the snapshot; its other steps are
      # taken to be ordinary ones.
      ordinary_s = _median(self._idle_steps)
      if num_steps > 1 and ordinary_s > 0:
        self._after_snapshots.append(step_s * num_steps
                                     - ordinary_s * (num_steps - 1))
      else:
        self._after_snapshots.append(step_s)
    (self._busy_steps if persisting else self._idle_steps).append(step_s)
    if cpu_share is not None and not persisting:
      self._cpu_shares.append(cpu_share)

  def observe_stall(self, stall_s: float) -> None:
    """A checkpoint's stall; the next step observed follows its snapshot."""
    self._stalls.append(stall_s)
    self._snapshot_just_taken = True

  def observe_persist(self, persist_s: float, *,
                      cpu_s: Optional[float] = None) -> None:
    """A finished persist: its wall time, and its thread's CPU time."""
    self._persists.append(persist_s)
    if cpu_s is not None:
      self._persist_cpus.append(cpu_s)

  def local_estimate(self) -> CostEstimate:
    return CostEstimate(step_s=_median(self._idle_steps),
                        busy_step_s=_median(self._busy_steps),
                        stall_s=_median(self._stalls),
                        persist_s=_median(self._persists),
                        after_snapshot_s=_median(self._after_snapshots),
                        persist_cpu_s=_median(self._persist_cpus),
                        cpu_share=_median(self._cpu_shares))

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
