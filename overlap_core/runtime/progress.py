"""Progress lines while a trainer runs, framework-neutral."""

import sys
import time

from overlap_core.runtime import ledger as ledger_lib


class ProgressPrinter:
  """Prints one line every `every_steps` steps, from the ledger's window.

  Lines, not a redrawn bar: they read the same in a terminal, a CI log and a
  file, and each carries the phase shares of the steps since the last line.
  `total_steps=None` (data of unknown length) prints no total and no ETA.
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

    # Only a run that measures its exposed all-reduce or its contention
    # prints it.
    comm = (f"comm {share(ledger_lib.EXPOSED_COMM):4.1f}%  "
            if f"{ledger_lib.EXPOSED_COMM}_fraction" in scalars else "")
    contention = (f"contention {share(ledger_lib.CONTENTION):4.1f}%  "
                  if f"{ledger_lib.CONTENTION}_fraction" in scalars else "")
    position, eta = _position_and_eta(step, self._total_steps,
                                      time.perf_counter() - self._start)
    print(f"{self._prefix}{position}  loss {loss:.4f}  "
          f"{scalars['samples_per_second']:8.1f} samples/s  "
          f"data {share(ledger_lib.DATA_WAIT):4.1f}%  "
          f"compute {share(ledger_lib.COMPUTE):5.1f}%  {contention}{comm}"
          f"ckpt {share(ledger_lib.CHECKPOINT_STALL):4.1f}%  "
          f"{eta}".rstrip(), file=self._stream, flush=True)
    return True


def _position_and_eta(step: int, total_steps, elapsed_s: float):
  """("step 3/10", "eta 1.2s"), or ("step 3", "") when the total is unknown."""
  if total_steps is None:
    return f"step {step}", ""
  eta_s = elapsed_s / step * (total_steps - step)
  return (f"step {step:>{len(str(total_steps))}}/{total_steps}",
          f"eta {eta_s:5.1f}s")
