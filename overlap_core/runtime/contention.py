"""Contention: what the work running beside a step cost its compute.

The ledger's waits count only the time a step stood still: `data_wait`
for the next batch, `checkpoint_stall` for a save. The work behind them
also runs *beside* the step: the input pipeline decoding the batches to
come, a checkpoint's persist, another process. On a host whose cores the
step already fills, that work slows the step's compute, and removing it
saves more than its wait. The fidelity benchmark measured this (BENCHMARKS
§17): TensorFlow's synthetic job waited 1.03 ms per step for its input,
and resident batches saved it 6.86 ms.

So the trainer times the step alone before training: the run's own step
function, on a resident copy of the run's first batch, before the
training input pipeline exists (one made earlier fills its buffers beside
the timed calls; each side's `reference_step`), after `WARMUP_CALLS`
untimed calls. The median of
`--reference_steps` timed calls is the reference step; the weights,
optimizer state and random streams are put back afterwards (each side's
`snapshot`), so the run trains exactly as it would without it. During
training, each step's compute span beyond the reference is `contention`,
carved out of compute like the other compute parts, so the phases still
add up to the step. It is derived, not timed: run.json lists it in
`phases_derived`, and the timings it came from under `strategy.
reference_step`.

Single steps jitter around the reference, by about half a millisecond
on a 2-core host, and a span cannot be negative: carving each step's
excess alone would keep the slow half of that jitter and drop the fast
half, and call it contention. So a step that ran faster than the
reference banks the difference, and the next steps' excess pays it back
before any is carved (`ExcessBalance`). What the balance still holds when
the loop ends ran below the reference after the excess it would have
paid: the loop gives it back to compute, from the last steps that carved
contention (`ContentionSplit.settle`), so that over a run the jitter
cancels and the phase's mean is the steps' mean excess over the reference
(up to the balance's cap). Unsettled, what the balance holds at the end
is contention the steps never had, up to one reference step over the
run; in the fidelity benchmark's runs of 400 steps it was 0.002 ms a
step at the median (BENCHMARKS §17).

What it cannot see: work that runs through the calibration as through
the run (a background job, another process on the host) is inside the
reference too, so it is not contention.

  reference = time_reference(lambda: train_step(batch), num_steps=5)
  split = reference.split_compute()  # or .split_compute(inner=comm_split)
  ...  # the loop: split(start_s, end_s) for each step's compute span
  split.settle(ledger)
"""

import dataclasses
import statistics
import time
from typing import Callable, List, Optional, Sequence, Tuple

from overlap_core.runtime.contention_split import (COMPUTE, CONTENTION,
                                                   ContentionSplit,
                                                   ExcessBalance,
                                                   split_stage_compute)

# The reference is subtracted from every step, so its error is every
# step's. The median of 5 calls moved by up to a millisecond from run to
# run on a 2-core host. Of 24 runs of a 12 ms step timed with 15 calls,
# 3 had a slow episode of the host (calls 3 to 5 ms slower, 8 to 11 in a
# row) over more than half of them, which moved their median by 1.5 to
# 3 ms. 31 calls kept the median out of an episode of that length, but
# not out of a spell over all of them, 3 to 8 ms, in 3 of 42 runs of the
# fidelity benchmark's one-process input cells. Timed twice, before the
# loop and after it (`RetimedSplit`), the lower median is out of a spell
# over either timing, so each takes 15 calls: with the warm-ups, the two
# cost a run of a 17 ms step 0.7 s, as one timing of 31 calls did.
DEFAULT_REFERENCE_STEPS = 15
# The first call traces or initializes lazily, and the next few still run
# slower while the framework's thread pools and allocator settle.
WARMUP_CALLS = 5


@dataclasses.dataclass(frozen=True)
class ReferenceStep:
  """The step timed alone on a resident batch, before training.

  Attributes:
    step_s: each timed call, in seconds.
    cost_s: what the calibration cost the run, warm-up and restore
      included.
  """
  step_s: Tuple[float, ...]
  cost_s: float
  # Whether the step was timed with the parts a run's own split carves
  # before compute (an exposed all-reduce): False where it was timed
  # without them (DDP's all-reduce paused), so the excess leaves them out.
  holds_parts: bool = True
  # The same calls timed again after the loop (`RetimedSplit`); empty
  # until then.
  later_step_s: Tuple[float, ...] = ()
  later_cost_s: float = 0.0

  @property
  def reference_s(self) -> float:
    """The median of the timing before the loop, or where the step was
    timed again after it (`RetimedSplit`), the lower of the two medians:
    a slow spell of the host raises the calls it falls on, and nothing
    makes a step alone faster than it is."""
    return min(statistics.median(timed)
               for timed in (self.step_s, self.later_step_s) if timed)

  def with_later(self, later: "ReferenceStep") -> "ReferenceStep":
    """This step with `later`'s calls as its timing after the loop."""
    return dataclasses.replace(self, later_step_s=later.step_s,
                               later_cost_s=later.cost_s)

  @property
  def lowered_by_s(self) -> float:
    """How far the timing after the loop lowered the reference the loop
    split its steps against (the first timing's median)."""
    return statistics.median(self.step_s) - self.reference_s

  @property
  def phases_derived(self) -> List[str]:
    return [CONTENTION]

  def less(self, part_s: float) -> "ReferenceStep":
    """The same step alone without `part_s` of its work: TensorFlow's step
    without its all-reduce is the step alone less the exposed all-reduce
    derived for it (`tfoverlap.exposed_comm`), so a run's steps without
    the all-reduce (--paired_removal=all_reduce) are split against what
    the ledger claims they cost."""
    return dataclasses.replace(
        self, step_s=tuple(s - part_s for s in self.step_s),
        later_step_s=tuple(s - part_s for s in self.later_step_s),
        holds_parts=False)

  def split_compute(self, inner: Optional[Callable] = None
                    ) -> ContentionSplit:
    """(start_s, end_s) -> the spans that tile a step's compute span:
    `inner`'s parts (an exposed all-reduce, say) first, then contention,
    then compute.

    Args:
      inner: the run's own split, `(start_s, end_s) -> spans` ending with
        its compute span (`ledger.carve_compute`), or None.
    """
    reference_s = self.reference_s  # a median: taken once, not per step
    balance = ExcessBalance(reference_s)

    def split(start_s: float, end_s: float) -> List[tuple]:
      spans = (inner(start_s, end_s) if inner else
               [(COMPUTE, start_s, end_s)])
      *parts, (name, compute_start_s, compute_end_s) = spans
      if name != COMPUTE:
        raise ValueError(f"the inner split ends with {name!r}, not compute")
      # A reference with the parts (an exposed all-reduce) is a whole step,
      # so the excess is taken over the whole span; one without them is
      # the step's own work, so the parts, timed apart, are left out.
      parts_s = 0.0 if self.holds_parts else sum(e - b for _, b, e in parts)
      excess_s = balance.carve((end_s - start_s) - reference_s - parts_s)
      split_s = compute_start_s + min(excess_s,
                                      compute_end_s - compute_start_s)
      return [*parts, (CONTENTION, compute_start_s, split_s),
              (COMPUTE, split_s, compute_end_s)]

    return ContentionSplit(split, balance, COMPUTE)

  def split_stage_compute(self, inner: Callable, compute: str
                          ) -> ContentionSplit:
    """(start_s, end_s) -> a pipeline stage's spans, `inner`'s (its
    bubble, transfer and `compute` spans in the order they ran), with the
    stage's compute beyond the reference carved out of its first
    `compute` spans as contention (`split_stage_compute`)."""
    return split_stage_compute(self.reference_s, inner, compute)

  def to_dict(self) -> dict:
    return {"derived_from": "the run's step on a resident copy of its "
                            "first batch, timed alone before training and "
                            "before its input pipeline, and again after "
                            "the loop where the run says so "
                            "(later_step_ms); the lower median",
            "reference_ms": 1e3 * self.reference_s,
            "lowered_after_loop_ms": 1e3 * self.lowered_by_s,
            "with_all_reduce": self.holds_parts,
            "step_ms": [1e3 * s for s in self.step_s],
            "later_step_ms": [1e3 * s for s in self.later_step_s],
            "warmup_calls": WARMUP_CALLS,
            "cost_s": self.cost_s + self.later_cost_s}


class RetimedSplit:
  """A run's split against `reference` (`ReferenceStep.split_compute`, or
  one per arm: `paired_removal.split_per_arm`) that, at the loop's end,
  times the step alone once more and carves the steps against the lower
  of the two medians before it settles (`ContentionSplit.settle`).

  Why twice: a slow spell of the host over the calibration puts the
  reference above the steps it splits; a step below the reference carves
  nothing, so the contention its cause made beside it goes to compute.
  In the fidelity benchmark's one-process input cells on a 2-core host
  (42 runs of a 14 to 24 ms step), the step alone came out above the
  run's own steps without input in 21, by up to 8 ms, and those are the
  runs that attributed less than the input's removal saved (BENCHMARKS
  §17). A second timing after the loop, on the same batch
  and state put back the same way, is unlikely to fall in the same
  spell; the work beside the steps has stopped by then or slows it, and
  neither makes it faster than the step alone, so the lower median is
  the better reference. The progress lines printed during the loop used
  the first.

  Args:
    split: the loop's split, whose `settle` takes `lower_by_s`.
    reference: what `split` carves against.
    retime: () -> the same step timed alone again (each side's
      `reference_step.calibrate`, with the arguments it had).
    keep: given `reference` with the later timing, for the run's record.
  """

  def __init__(self, split: Callable, reference: ReferenceStep,
               retime: Callable[[], ReferenceStep],
               keep: Callable[[ReferenceStep], None]):
    self._split = split
    self._reference = reference
    self._retime = retime
    self._keep = keep

  def __call__(self, start_s: float, end_s: float) -> List[tuple]:
    return self._split(start_s, end_s)

  def settle(self, ledger) -> float:
    """Times the step alone again, then settles `split` against the lower
    reference; the seconds the settling gave back to compute."""
    reference = self._reference.with_later(self._retime())
    self._keep(reference)
    return self._split.settle(ledger, lower_by_s=reference.lowered_by_s)


def retime_after_loop(split: Callable, reference,
                      retime: Callable[[], object],
                      keep: Callable[[object], None], *,
                      pipelined: bool = False) -> Callable:
  """`split`, timing the step alone again at the loop's end
  (`RetimedSplit`) where `reference` is a plain step alone, which both
  trainers' loops settle; `split` as it is for an offload's cost or a
  pipeline's stages (`pipelined`: a stage gives up its stand-ins before
  the loop), whose references are timed once."""
  if pipelined or type(reference) is not ReferenceStep:
    return split
  return RetimedSplit(split, reference, retime, keep)


@dataclasses.dataclass(frozen=True)
class StagesAlone:
  """Every stage of a pipeline timed alone, one stage at a time, where
  one ledger stands for the mean stage.

  A PyTorch rank holds one stage and keeps a ledger of its own, split
  against its own `ReferenceStep`. TensorFlow's stage servers are driven
  by one client, whose ledger is the mean stage's (`pipeline_processes.
  ProcessPipelineRuntime.record_step`): its stage_compute is the mean of
  the stages', so its contention is that beyond the mean of the stages'
  references, which is the mean of each stage's own excess.

  Attributes:
    stages: each stage's `ReferenceStep`, in stage order: its own work on
      stand-ins for its neighbours' tensors, as its clock timed it.
  """
  stages: Tuple[ReferenceStep, ...]

  @property
  def reference_s(self) -> float:
    """The mean stage's work alone: the mean of the stages' medians."""
    return statistics.mean(stage.reference_s for stage in self.stages)

  @property
  def cost_s(self) -> float:
    """What timing every stage cost the run (each stage's calibration is
    its own: they ran one after another)."""
    return sum(stage.cost_s for stage in self.stages)

  @property
  def phases_derived(self) -> List[str]:
    return [CONTENTION]

  def split_stage_compute(self, inner: Callable, compute: str
                          ) -> ContentionSplit:
    """`ReferenceStep.split_stage_compute` for the mean stage: `inner`'s
    spans are the mean stage's, and so is the reference."""
    return split_stage_compute(self.reference_s, inner, compute)

  def to_dict(self) -> dict:
    return {"derived_from": "each stage's own work of a step on stand-ins "
                            "for its neighbours' tensors, timed alone "
                            "before training, one stage at a time; the "
                            "ledger's is the mean stage's",
            "reference_ms": 1e3 * self.reference_s,
            "per_stage": [{"stage": k, "reference_ms": 1e3 * s.reference_s,
                           "step_ms": [1e3 * t for t in s.step_s],
                           "cost_s": s.cost_s}
                          for k, s in enumerate(self.stages)],
            "warmup_calls": WARMUP_CALLS, "cost_s": self.cost_s}


def times_reference(reference_steps: int, *, pipelined: bool, burst: bool,
                    fixed_offload: bool) -> bool:
  """Whether a run times its step alone before training, on both sides:
  not asked off (`--reference_steps=0`), and not a pipeline whose stages
  cannot run alone (`pipelined`: PyTorch's stages can, on stand-ins for
  their neighbours' tensors, where a rank holds one stage, and so can
  TensorFlow's stage servers, `--pipeline_runtime=processes`; not
  TensorFlow's devices runtime, whose stage_compute is its stages timed
  alone already) or a burst
  plan, whose compute spans are split their own way, nor an offload no
  step can run without (`fixed_offload`: PyTorch's parameters offload
  keeps the weights on the host). Each trainer adds what only its
  framework rules out."""
  return reference_steps > 0 and not (pipelined or burst or fixed_offload)


def time_reference(run_step: Callable[[], Optional[float]], *,
                   num_steps: int,
                   restore: Callable[[], None],
                   before_call: Optional[Callable[[], None]] = None,
                   own_clock: bool = False) -> ReferenceStep:
  """Times `run_step` alone; then `restore()`.

  Args:
    run_step: runs one step on the resident batch and returns once it is
      done (the device waited for); with `own_clock`, returns the seconds
      the step took by its own clock.
    num_steps: calls timed after `WARMUP_CALLS` untimed ones; at least 1.
    restore: puts back what the calls changed (weights, optimizer state,
      random streams).
    before_call: run before each call, untimed (replicas meeting at a
      barrier, so that their calls start together as their steps do).
    own_clock: each call's time is what `run_step` returns, not the
      host's span of the call: a TensorFlow pipeline stage's busy time,
      stamped on its own process, as its steps in training are timed
      (the client's span would add its dispatch to the stage server).
  """
  (reference,) = time_interleaved([run_step], num_steps=num_steps,
                                  restore=restore, before_call=before_call,
                                  own_clock=own_clock)
  return reference


def time_interleaved(run_steps: Sequence[Callable[[], Optional[float]]], *,
                     num_steps: int,
                     restore: Callable[[], None],
                     before_call: Optional[Callable[[], None]] = None,
                     own_clock: bool = False) -> List[ReferenceStep]:
  """Times each of `run_steps` alone, interleaved call by call (so that a
  change of the host's load during the calibration moves them alike),
  each after `WARMUP_CALLS` untimed calls; then `restore()`. `before_call`
  and `own_clock` as in `time_reference`.

  Returns:
    One `ReferenceStep` per function, in order; each `cost_s` is the
    whole calibration's.
  """
  if num_steps < 1:
    raise ValueError(f"Invalid value for argument `num_steps`. Received: "
                     f"{num_steps}; allowed: >= 1")
  start = time.perf_counter()
  step_s = [[] for _ in run_steps]
  try:
    for _ in range(WARMUP_CALLS):
      for run_step in run_steps:
        if before_call:
          before_call()
        run_step()
    for _ in range(num_steps):
      for run_step, timed in zip(run_steps, step_s):
        if before_call:
          before_call()
        call_start = time.perf_counter()
        own_s = run_step()
        timed.append(own_s if own_clock else
                     time.perf_counter() - call_start)
  finally:
    restore()
  cost_s = time.perf_counter() - start
  return [ReferenceStep(step_s=tuple(timed), cost_s=cost_s)
          for timed in step_s]
