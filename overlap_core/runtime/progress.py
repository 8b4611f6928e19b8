"""Progress lines while a trainer runs, framework-neutral."""

import sys
import time

from overlap_core.runtime import ledger as ledger_lib


class ProgressPrinter:
  """Prints one line every `every_steps` steps, from the ledger's window.

  Lines, not a redrawn bar: they read the same in a terminal, a CI log and a
  file, and each carries the phase shares of the steps since the last line.
  """

  def __init__(self, *, total_steps: int, every_steps: int, enabled: bool,
               stream=None, prefix: str = ""):
    self._total_steps = total_steps
    self._every_steps = every_steps
    self._enabled = enabled
    self._stream = stream or sys.stdout
    self._prefix = prefix
    self._last_step = 0
    self._start = time.perf_counter()

  def maybe_print(self, ledger: ledger_lib.StepLedger, step: int,
                  loss: float) -> bool:
    """Prints a line for the steps since the last one; True if it did."""
    if not self._enabled:
      return False
    if step % self._every_steps and step != self._total_steps:
      return False
    scalars = ledger_lib.summarize_window(ledger.window(self._last_step))
    self._last_step = step

    def share(name):
      return 100 * scalars[f"{name}_fraction"]

    # Only a run that measures its exposed all-reduce prints it.
    comm = (f"comm {share(ledger_lib.EXPOSED_COMM):4.1f}%  "
            if f"{ledger_lib.EXPOSED_COMM}_fraction" in scalars else "")
    elapsed = time.perf_counter() - self._start
    eta = elapsed / step * (self._total_steps - step)
    print(f"{self._prefix}step {step:>{len(str(self._total_steps))}}/"
          f"{self._total_steps}  loss {loss:.4f}  "
          f"{scalars['samples_per_second']:8.1f} samples/s  "
          f"data {share(ledger_lib.DATA_WAIT):4.1f}%  "
          f"compute {share(ledger_lib.COMPUTE):5.1f}%  {comm}"
          f"ckpt {share(ledger_lib.CHECKPOINT_STALL):4.1f}%  "
          f"eta {eta:5.1f}s", file=self._stream, flush=True)
    return True
