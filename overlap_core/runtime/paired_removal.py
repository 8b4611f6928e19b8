"""A cause removed and restored in alternate blocks of one run's steps.

What removing a phase's cause saves is usually measured with two runs, one
with the cause and one without. On a 2-core host that difference carries
the two processes' own speeds: one runs about half a millisecond a step
faster or slower than the next, whatever it does (BENCHMARKS §17). Here
one run holds both: its steps are cut into blocks of `block_steps`, and
the blocks alternate between the job as configured ("with") and the job
with the cause removed ("without"), in the order with, without, without,
with, and again, so that a drift of the host over the run falls on both
alike. The saving is then the difference of two means of the same
process's steps, and the ledger's phases of those same steps say where
it went (run.json's `paired_removal`).

The causes, and how a step goes without them:

  input       the step takes a batch resident on the device, read before
              training without the pipeline, and does not ask the pipeline
              for one. The batches are the run's own, a distinct one for
              each step without input (`resident_batches`), so that these
              steps train on what the job trains on;
  checkpoint  the step takes no checkpoint, even where one is due;
  offload     the step runs with offload paused (the step function the
              run timed alone without offload before training), and the
              ledger splits its span against that step alone: no
              `offload` phase, and `contention` beyond it.
  all_reduce  the step all-reduces no gradient: DDP's step under
              `no_sync`, its loss still averaged over the replicas
              (PyTorch, as --all_reduce=off runs every step), or the
              step that applies each replica's own gradients
              (TensorFlow, the one `tfoverlap.exposed_comm` times before
              training). The replicas' weights part from the first such
              step on, as under --all_reduce=off, so such a run saves no
              checkpoint and evaluates nothing; what it measures is the
              steps' cost, which weights that differ do not change;
  pipeline_waits
              every stage runs the step apart, on stand-ins for its
              neighbours' tensors made before training (as
              --pipeline_stages_apart runs every step), so it neither
              waits for them nor transfers: what the bubble and transfer
              phases say their cause costs. Those steps train on the
              stand-ins, so such a run saves no checkpoint and evaluates
              nothing, as a run of stages apart does.

The first `settle_steps` of every block are not counted in either half:
there the previous block's work is still ending. After a block without
its input, the pipeline's buffers were filling beside those steps and
hand the next steps batches at once; after a block with checkpoints, the
last save's writes may still be reaching the disk. The run's warm-up
steps are not counted either.

  pairing = PairedRemoval(INPUT, block_steps=20)
  pairing.removed(step)   # True in a block without the input
  batches = apply_input_removal(pipeline_iterator, pairing,
                                read_resident_batches, first_step=1,
                                last_step=200)
  summarize(pairing, ledger.steps, warmup_steps=10)
"""

from typing import Callable, Iterator, Optional, Sequence

from overlap_core.runtime import ledger as ledger_lib

NONE = "none"
INPUT = "input"
CHECKPOINT = "checkpoint"
OFFLOAD = "offload"
ALL_REDUCE = "all_reduce"
PIPELINE_WAITS = "pipeline_waits"
CAUSES = (NONE, INPUT, CHECKPOINT, OFFLOAD, ALL_REDUCE, PIPELINE_WAITS)
DEFAULT_BLOCK_STEPS = 20
WITH, WITHOUT = "with", "without"
# The block pattern: a block's index modulo 4 is "without" at 1 and 2.
_WITHOUT_IN_FOUR = (1, 2)
# The most the batches of the steps without input may hold; past it they
# are taken in turn. They once were the run's first batch alone, trained
# on a hundred times: the model came to fit it, and the PyTorch job's
# steps without input ran below the step timed alone before training in
# 10 of 11 runs, by 0.49 ms at the median; with batches of their own, in
# 17 of 21, by 0.21 ms (BENCHMARKS §17). Contention, carved against that
# step, cannot be negative, so the ledger lost the difference.
RESIDENT_BATCHES_MAX_BYTES = 1 << 30


def in_block_without(step: int, block_steps: int) -> bool:
  """Whether `step` (numbered from 1) falls in a block without the cause,
  in the order with, without, without, with, repeated."""
  return ((step - 1) // block_steps) % 4 in _WITHOUT_IN_FOUR


class PairedRemoval:
  """Which steps go without the cause, and which are counted.

  Steps are numbered from 1, as the loops number them; block b holds
  steps b * block_steps + 1 ... (b + 1) * block_steps, the same blocks
  after a resume.
  """

  def __init__(self, cause: str, block_steps: int = DEFAULT_BLOCK_STEPS):
    if cause not in CAUSES[1:]:
      raise ValueError(f"cause={cause!r}: allowed: one of {CAUSES[1:]}")
    if block_steps < 2:
      raise ValueError(f"block_steps={block_steps}: allowed: 2 or more")
    self.cause = cause
    self.block_steps = block_steps
    # Half a block: the depth of a prefetch buffer or a save's writes,
    # with room; the other half is counted.
    self.settle_steps = block_steps // 2
    # How many distinct batches the steps without input take in turn, once
    # `apply_input_removal` has read them.
    self.resident_batches: Optional[int] = None

  def removed(self, step: int) -> bool:
    """Whether `step` runs without the cause."""
    return in_block_without(step, self.block_steps)

  def counted(self, step: int) -> bool:
    """Whether `step` counts in its half: past its block's settling."""
    return (step - 1) % self.block_steps >= self.settle_steps

  def skips_checkpoint(self, step: int) -> bool:
    return self.cause == CHECKPOINT and self.removed(step)

  def arm(self, step: int) -> str:
    return WITHOUT if self.removed(step) else WITH

  def counted_steps(self, num_steps: int, warmup_steps: int) -> dict:
    """How many of a run's steps 1..num_steps each half counts."""
    counts = {WITH: 0, WITHOUT: 0}
    for step in range(warmup_steps + 1, num_steps + 1):
      if self.counted(step):
        counts[self.arm(step)] += 1
    return counts

  def steps_by_arm(self, first_step: int, last_step: int) -> dict:
    """How many of steps first_step..last_step each half runs, counted or
    not."""
    steps = {WITH: 0, WITHOUT: 0}
    for step in range(first_step, last_step + 1):
      steps[self.arm(step)] += 1
    return steps

  def describe(self) -> dict:
    described = {"cause": self.cause, "block_steps": self.block_steps,
                 "settle_steps": self.settle_steps,
                 "order": f"{WITH}, {WITHOUT}, {WITHOUT}, {WITH}, repeated"}
    if self.resident_batches is not None:
      described["resident_batches"] = self.resident_batches
    return described


def from_config(cause: str, block_steps: int) -> Optional[PairedRemoval]:
  """The run's pairing, or None for --paired_removal=none."""
  return None if cause == NONE else PairedRemoval(cause, block_steps)


def removes(pairing: Optional[PairedRemoval], cause: str) -> bool:
  """Whether the run's pairing (None: none) removes `cause`."""
  return pairing is not None and pairing.cause == cause


class AlternatingCalls:
  """`with_cause(*args)`, or `without_cause(*args)` in a step without the
  cause.

  The k-th call is step first_step + k's: made for what the loops call
  exactly once per step (the step function, its ledger split, `next` on
  the batches).
  """

  def __init__(self, with_cause: Callable, without_cause: Callable,
               pairing: PairedRemoval, *, first_step: int):
    self._with = with_cause
    self._without = without_cause
    self._pairing = pairing
    self._next_step = first_step

  def __call__(self, *args):
    step = self._next_step
    self._next_step += 1
    if self._pairing.removed(step):
      return self._without(*args)
    return self._with(*args)

  def settle(self, ledger, lower_by_s: float = 0.0) -> float:
    """Settles each arm that is a split carving contention
    (`contention_split.ContentionSplit.settle`) over its own steps, as each
    carved with a balance of its own (`split_per_arm`), against a
    reference `lower_by_s` lower where it was timed again after the loop;
    the seconds moved."""
    return sum(
        arm.settle(ledger, owns_step=owns_step, lower_by_s=lower_by_s)
        for arm, owns_step in ((self._with, self._with_cause_step),
                               (self._without, self._pairing.removed))
        if hasattr(arm, "settle"))

  def _with_cause_step(self, step: int) -> bool:
    return not self._pairing.removed(step)


class AlternatingBatches:
  """The pipeline's batches, or resident ones in steps without input.

  The k-th `next()` is step first_step + k's batch, as the loops ask one
  per step. A step without input does not ask the pipeline, which goes on
  filling its buffers beside it up to their depth (the settling steps).
  """

  def __init__(self, batches: Iterator, resident_batches: Iterator,
               pairing: PairedRemoval, *, first_step: int):
    self._batches = batches
    self._next = AlternatingCalls(lambda: next(batches),
                                  lambda: next(resident_batches), pairing,
                                  first_step=first_step)

  def __iter__(self) -> "AlternatingBatches":
    return self

  def __next__(self):
    return self._next()

  def close(self) -> None:
    """Closes the pipeline's iterator where it has threads to stop."""
    close = getattr(self._batches, "close", None)
    if close is not None:
      close()


def apply_input_removal(batches: Iterator, pairing: Optional[PairedRemoval],
                        read_resident_batches: Callable[..., Iterator], *,
                        first_step: int, last_step: int) -> Iterator:
  """`batches`, or `AlternatingBatches` of them where `pairing` removes
  the input.

  Args:
    batches: the pipeline's iterator, from step `first_step`'s batch on.
    read_resident_batches: (start_batch, count, max_bytes) -> an iterator
      of batches resident on the device, called only where the input is
      removed (each side's `data.make_resident_iterator`). The pipeline's
      batches serve the steps with input, so the steps without it take
      the batches after those: the run trains on each batch once, as it
      would unpaired.
    last_step: the run's last step.
  """
  if pairing is None or pairing.cause != INPUT:
    return batches
  steps = pairing.steps_by_arm(first_step, last_step)
  resident = read_resident_batches(
      start_batch=first_step - 1 + steps[WITH], count=max(steps[WITHOUT], 1),
      max_bytes=RESIDENT_BATCHES_MAX_BYTES)
  pairing.resident_batches = resident.num_batches
  return AlternatingBatches(batches, resident, pairing,
                            first_step=first_step)


def split_per_arm(pairing: Optional[PairedRemoval],
                  make_split: Callable[[], Callable], *,
                  first_step: int,
                  make_split_without: Optional[Callable[[], Callable]] = None
                  ) -> Callable:
  """The ledger's split of a step's compute span against the step timed
  alone, one for each arm where `pairing` removes the input, checkpoints
  or the all-reduce.

  Contention's balance (`contention_split.ExcessBalance`) carries the time steps
  ran below the reference into the steps after. One balance for the run
  would carry the arm without the cause's fast steps into the next block
  with it, and call that arm's contention compute. Offload's arms each
  have a split already (`apply_offload_removal`).

  Args:
    make_split: () -> a new split, with a balance of its own (each side's
      `ReferenceStep.split_compute`).
    make_split_without: the same for the arm without the cause, where its
      steps are split otherwise (TensorFlow's without the all-reduce,
      against the step alone less its derived exposed all-reduce); None:
      `make_split` for both arms.
  """
  if pairing is None or pairing.cause == OFFLOAD:
    return make_split()
  return AlternatingCalls(make_split(), (make_split_without or make_split)(),
                          pairing, first_step=first_step)


def apply_step_removal(pairing: Optional[PairedRemoval], cause: str,
                       train_step, make_step_without: Callable[[], Callable],
                       *, first_step: int) -> Callable:
  """`train_step`, alternating with its variant without `cause` where
  `pairing` removes it: ALL_REDUCE (the step that all-reduces no
  gradient) or PIPELINE_WAITS (the stages' step apart).

  Args:
    make_step_without: () -> the step without the cause, called only
      where `pairing` removes it.
  """
  if not removes(pairing, cause):
    return train_step
  return AlternatingCalls(train_step, make_step_without(), pairing,
                          first_step=first_step)


def apply_offload_removal(pairing: Optional[PairedRemoval], train_step,
                          split_compute, *, cost,
                          make_step_without: Callable[[], Callable],
                          inner_split: Optional[Callable],
                          first_step: int) -> tuple:
  """(train_step, split_compute), each alternating with its variant
  without offload where `pairing` removes offload.

  Args:
    cost: the run's `offload_cost.OffloadCost`, the step timed alone with
      and without offload; a step without offload is split against the
      latter.
    make_step_without: () -> the step function with offload paused,
      called only where offload is removed.
    inner_split: the run's own split of a step's compute span beside
      offload (an exposed all-reduce), or None.

  Raises:
    RuntimeError: the run did not time its step alone without offload
      (the compatibility table refuses such runs first).
  """
  if pairing is None or pairing.cause != OFFLOAD:
    return train_step, split_compute
  without = getattr(cost, "without_offload", None)
  if without is None:
    raise RuntimeError("--paired_removal=offload without the step timed "
                       "alone with and without offload")
  return (AlternatingCalls(train_step, make_step_without(), pairing,
                           first_step=first_step),
          AlternatingCalls(split_compute,
                           without.split_compute(inner=inner_split),
                           pairing, first_step=first_step))


def _mean_ms(values: Sequence[float]) -> Optional[float]:
  return 1e3 * sum(values) / len(values) if values else None


def summarize(pairing: PairedRemoval, steps: Sequence, *,
              warmup_steps: int) -> dict:
  """Each half's counted steps and phase means, and the saving.

  Args:
    pairing: the run's pairing.
    steps: the ledger's step records, in order (`StepLedger.steps`).
    warmup_steps: the leading records left out, as the ledger's summary
      leaves them.

  Returns:
    `describe()`, and `halves`: {with, without: {steps, phases_ms}},
    each phase's mean per counted step in ms (0 where a step did not
    record it; `ledger.STEP` the whole step, `ledger.OTHER` what no phase
    holds); `saving_ms`: the step's mean with the cause less without it;
    `change_ms`: each phase's. None where a half counted no step.
  """
  counted = {WITH: [], WITHOUT: []}
  for record in steps[warmup_steps:]:
    if pairing.counted(record.step):
      counted[pairing.arm(record.step)].append(record)
  names = sorted({n for records in counted.values() for r in records
                  for n in r.phases_s})
  halves = {}
  for arm, records in counted.items():
    phases_ms = {n: _mean_ms([r.phases_s.get(n, 0.0) for r in records])
                 for n in names}
    phases_ms[ledger_lib.STEP] = _mean_ms([r.duration_s for r in records])
    phases_ms[ledger_lib.OTHER] = _mean_ms(
        [r.duration_s - sum(r.phases_s.values()) for r in records])
    halves[arm] = {"steps": len(records), "phases_ms": phases_ms}
  both = all(h["steps"] for h in halves.values())
  change_ms = {n: (halves[WITH]["phases_ms"][n]
                   - halves[WITHOUT]["phases_ms"][n]) if both else None
               for n in halves[WITH]["phases_ms"]}
  return {**pairing.describe(), "halves": halves,
          "saving_ms": change_ms[ledger_lib.STEP], "change_ms": change_ms}
