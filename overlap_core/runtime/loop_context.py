"""What every training loop does around a step, framework-neutral.

The TensorFlow loops (`tfoverlap.loops`: the custom loop and the
`model.fit` callback) and the PyTorch loop (`torch_parity.loops`) differ in
how they run a step; what happens after it does not. Keeping that here, once,
means the checkpoint stall, the step's end in the ledger, the progress line
and the TensorBoard scalars are decided identically on both sides.

  ctx = LoopContext(ledger=ledger, progress=printer, checkpointer=None,
                    write_scalars=lambda step, loss: None, first_step=1,
                    last_step=100, global_batch_size=64)
  for step in range(ctx.first_step, ctx.last_step + 1):
    with ctx.ledger.phase(ledger_lib.COMPUTE):
      loss = ...
    after_step(ctx, step, loss)
"""

import dataclasses
import time
from typing import Callable, Optional, Sequence

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.paired_removal import PairedRemoval
from overlap_core.runtime.progress import ProgressPrinter


@dataclasses.dataclass
class LoopContext:
  """What a loop needs besides the model: bookkeeping and cadence."""
  ledger: ledger_lib.StepLedger
  progress: ProgressPrinter
  checkpointer: Optional[object]  # is_due(step) and save(step), or None
  write_scalars: Callable[[int, float], None]
  first_step: int  # the step to run first (1, or one past a restored step)
  last_step: int
  global_batch_size: int
  # on_step_end(step, step_s) after each step, e.g. a BackgroundRunner
  background: Optional[object] = None
  # The cause removed in alternate blocks of steps, or None
  # (overlap_core.runtime.paired_removal).
  pairing: Optional[PairedRemoval] = None


def compute_phase(ledger: ledger_lib.StepLedger, split_compute=None):
  """Times the enclosed step as its compute phase, or as the phases
  `split_compute(start_s, end_s)` returns, which tile its span
  ([(phase, start_s, end_s)]: a pipelined step's, compute and its carved
  parts). The whole span's CPU time is compute's: the parts are shares of
  one span's wall time, not work of their own."""
  if split_compute is None:
    return ledger.phase(ledger_lib.COMPUTE)
  return _SplitComputeSpan(ledger, split_compute)


class _SplitComputeSpan:
  """`compute_phase` with a split. A class, not a generator, for the
  reason `ledger._Timed` is one: it is entered every step, and its time
  is the ledger's own cost, which falls between the steps' phases."""
  __slots__ = ("_ledger", "_split", "_cpu", "_start_s")

  def __init__(self, ledger: ledger_lib.StepLedger, split_compute):
    self._ledger = ledger
    self._split = split_compute
    self._cpu = ledger.cpu_of(ledger_lib.COMPUTE)

  def __enter__(self) -> None:
    self._start_s = time.perf_counter()
    self._cpu.__enter__()

  def __exit__(self, *exc_info) -> None:
    # The split's own CPU is compute's, as the span's is; recorded even
    # when the step raised, as a `with` block's finally would.
    try:
      for phase, begin, end in self._split(self._start_s,
                                           time.perf_counter()):
        self._ledger.add(phase, begin, end)
    finally:
      self._cpu.__exit__(*exc_info)


def settle_split(ledger: ledger_lib.StepLedger, split_compute) -> None:
  """After a loop's last step: what the split's contention balance still
  holds goes back to compute (`contention_split.ContentionSplit.settle`), for a
  split that carves contention, or each arm's of one that alternates
  (`paired_removal.AlternatingCalls.settle`)."""
  settle = getattr(split_compute, "settle", None)
  if settle is not None:
    settle(ledger)


def after_step(ctx: LoopContext, step: int, loss: float, *,
               may_checkpoint: bool = True,
               end_s: Optional[float] = None) -> None:
  """Checkpoint, close the step in the ledger, report.

  Args:
    may_checkpoint: False inside a multi-step call, where the variables
      already hold a later step's state (see `after_execution`).
    end_s: where the step ends in the ledger, for a step that is a share
      of a multi-step call; None: now.
  """
  if (may_checkpoint and ctx.checkpointer is not None
      and not (ctx.pairing and ctx.pairing.skips_checkpoint(step))
      and ctx.checkpointer.is_due(step)):
    with ctx.ledger.phase(ledger_lib.CHECKPOINT_STALL):
      ctx.checkpointer.save(step)
  record = ctx.ledger.end_step(step, ctx.global_batch_size, end_s=end_s)
  if ctx.background is not None:
    ctx.background.on_step_end(step, record.duration_s)
  ctx.progress.maybe_print(ctx.ledger, step, loss)
  ctx.write_scalars(step, loss)


def after_execution(ctx: LoopContext, first_step: int,
                    losses: Sequence[float], start_s: float,
                    end_s: float, data_wait_s: Optional[float] = None,
                    split_compute=None) -> None:
  """Closes the steps of one call that ran len(losses) steps.

  The call is timed as one span; each of its steps is recorded as an equal
  share of it, in order (the last one also holds what happens after the
  call: the checkpoint stall, the bookkeeping of all its steps). Within a
  share, the call's measured data wait divided by its steps comes first as
  `data_wait`, the rest is `compute`; without a measured wait (`model.fit`)
  the share is all `compute`, its input wait inside.

  Checkpointing is asked only after the last step: only then do the
  variables hold the state of the step a checkpoint would be named after.
  The cadence therefore sees only the calls' last steps, which the adaptive
  policy allows (it checkpoints at the first step at or past the one it
  planned) and a fixed cadence meets when it is a multiple of the steps per
  call (checked with the flags).

  Args:
    data_wait_s: the call's steps' waits for their batches, summed, or None
      when the call does not measure them.
    split_compute: (start_s, end_s) -> [(phase, start_s, end_s)] that tile
      a share's compute span, as `compute_phase` takes it; None: the span
      is `compute`.
  """
  per_step_s = (end_s - start_s) / len(losses)
  # The wait is timed on the graph's clock and the span on ours: a share
  # never holds more wait than it lasts.
  wait_s = (None if data_wait_s is None
            else min(max(data_wait_s, 0.0) / len(losses), per_step_s))
  for i, loss in enumerate(losses):
    share_start_s = start_s + i * per_step_s
    share_end_s = share_start_s + per_step_s
    if wait_s is not None:
      ctx.ledger.add(ledger_lib.DATA_WAIT, share_start_s,
                     share_start_s + wait_s)
      share_start_s += wait_s
    for phase, begin, end in (
        split_compute(share_start_s, share_end_s) if split_compute
        else [(ledger_lib.COMPUTE, share_start_s, share_end_s)]):
      ctx.ledger.add(phase, begin, end)
    last = i == len(losses) - 1
    after_step(ctx, first_step + i, float(loss), may_checkpoint=last,
               end_s=None if last else share_end_s)


class ScalarWindows:
  """The ledger's step scalars every `every_steps` steps, for TensorBoard.

  Each report covers the steps since the previous one, so both frameworks'
  scalar writers plot the same windows under the same tags.

  Usage:
    windows = ScalarWindows(ledger, every_steps=10)
    scalars = windows.due(step)  # None between reports
  """

  def __init__(self, ledger: ledger_lib.StepLedger, every_steps: int):
    self._ledger = ledger
    self._every_steps = every_steps
    self._last_step = 0

  def due(self, step: int) -> Optional[dict]:
    """`summarize_window` of the steps since the last report, or None.

    Returns:
      None unless `step` is a multiple of `every_steps`.
    """
    if step % self._every_steps:
      return None
    scalars = ledger_lib.summarize_window(self._ledger.window(self._last_step))
    self._last_step = step
    return scalars
