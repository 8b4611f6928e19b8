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

import contextlib
import dataclasses
import time
from typing import Callable, Optional

from overlap_core.runtime import ledger as ledger_lib
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


@contextlib.contextmanager
def compute_phase(ledger: ledger_lib.StepLedger, split_compute=None):
  """Times the enclosed step as its compute phase, or, for a pipelined
  step, as the phases `split_compute(start_s, end_s)` returns, which tile
  its span ([(phase, start_s, end_s)]; those have no CPU time)."""
  if split_compute is None:
    with ledger.phase(ledger_lib.COMPUTE):
      yield
    return
  start = time.perf_counter()
  try:
    yield
  finally:
    for phase, begin, end in split_compute(start, time.perf_counter()):
      ledger.add(phase, begin, end)


def after_step(ctx: LoopContext, step: int, loss: float) -> None:
  """Checkpoint, close the step in the ledger, report."""
  if ctx.checkpointer is not None and ctx.checkpointer.is_due(step):
    with ctx.ledger.phase(ledger_lib.CHECKPOINT_STALL):
      ctx.checkpointer.save(step)
  record = ctx.ledger.end_step(step, ctx.global_batch_size)
  if ctx.background is not None:
    ctx.background.on_step_end(step, record.duration_s)
  ctx.progress.maybe_print(ctx.ledger, step, loss)
  ctx.write_scalars(step, loss)


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
