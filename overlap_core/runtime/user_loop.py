"""The step ledger in a training loop the user wrote, framework-neutral.

`tfoverlap.ledger.LedgerCallback` (any Keras `model.fit`) and
`torch_parity.ledger.LoopLedger` (a hand-written PyTorch loop) time the
user's steps; what they keep and write is decided here, once, with the
trainers' own pieces: the `StepLedger`, the `LoopContext` that closes a
step (`after_step`: the ledger's step, the progress line), the run.json of
`run_record` and the breakdown table of `summary`. So a user loop's
run.json reads like a trainer's, and `overlap_compare` reads both.

  loop = UserLoop("runs/mine", framework="pytorch", batch_size=32)
  ctx = loop.begin(total_steps=100)  # holds the directory
  ...  # time each step into ctx.ledger; after_step(ctx, step, loss)
  record = loop.write(model_name="Net", num_params=..., ...)

Nothing here imports a framework.
"""

import os
import sys
import time
from typing import Iterable, Optional

from overlap_core.runtime import dir_lock
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import run_record, summary, user_code
from overlap_core.runtime.config import ArgumentError
from overlap_core.runtime.loop_context import LoopContext
from overlap_core.runtime.progress import ProgressPrinter

# run.json `flags`: a user loop has none.
_NO_FLAGS: dict = {}


def _is_count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class UserLoop:
  """Ledger, progress line and run.json of one run of a user's loop.

  Args:
    directory: where run.json goes; held (`dir_lock`) from `begin` until
      `write` or `abandon`, as a trainer holds its --model_dir.
    framework: "tensorflow" or "pytorch", as run.json names it.
    batch_size: samples per step (the global batch), for samples/s.
    log_every_steps: a progress line every this many steps.
    progress: whether to print progress lines and the final breakdown.
    stream: where those go (default: stdout).

  Raises:
    ArgumentError: at once, for an argument that is not allowed.
  """

  def __init__(self, directory: str, *, framework: str, batch_size: int,
               log_every_steps: int = 10, progress: bool = True,
               stream=None):
    if not isinstance(directory, str) or not directory:
      raise ArgumentError("directory", directory,
                          "allowed: a non-empty path")
    if not _is_count(batch_size):
      raise ArgumentError("batch_size", batch_size,
                          "allowed: an integer >= 1, the samples per step")
    if not _is_count(log_every_steps):
      raise ArgumentError("log_every_steps", log_every_steps,
                          "allowed: an integer >= 1")
    self.directory = directory
    self._framework = framework
    self._batch_size = batch_size
    self._log_every_steps = log_every_steps
    self._progress = bool(progress)
    self._stream = stream
    self._held: Optional[dir_lock.DirectoryLock] = None
    self._start_s = 0.0
    self.ctx: Optional[LoopContext] = None

  def begin(self, total_steps: Optional[int]) -> LoopContext:
    """Holds the directory and starts a fresh ledger for steps 1..total.

    Args:
      total_steps: the steps the loop will run, or None when unknown.

    Raises:
      DirectoryInUseError: another run or loop writes the directory.
    """
    self.abandon()  # a loop that raised before writing still holds it
    self._held = dir_lock.acquire(self.directory, setting="directory")
    self._start_s = time.perf_counter()
    ledger = ledger_lib.StepLedger()
    self.ctx = LoopContext(
        ledger=ledger,
        progress=self._make_progress(total_steps),
        checkpointer=None,  # a user's checkpoint stall is timed where it is
        write_scalars=lambda step, loss: None,
        first_step=1,
        last_step=total_steps or 0,
        global_batch_size=self._batch_size)
    return self.ctx

  def set_total_steps(self, total_steps: int) -> None:
    """The loop's length, once known after `begin`: for the progress line."""
    self.ctx.last_step = total_steps
    self.ctx.progress = self._make_progress(total_steps)

  def _make_progress(self, total_steps: Optional[int]) -> ProgressPrinter:
    return ProgressPrinter(total_steps=total_steps,
                           every_steps=self._log_every_steps,
                           enabled=self._progress, stream=self._stream)

  def write(self, *, model, model_name: str, num_params: int,
            weights_digest: str,
            environment: dict, strategy: dict, final: dict,
            phases_measured: Iterable[str],
            checkpoint_stats: Optional[dict] = None,
            notes: Iterable[str] = ()) -> dict:
    """Writes `<directory>/run.json`, prints the breakdown, lets go.

    Args:
      model: the model object (its class is run.json's `model.source`).
      model_name, num_params, weights_digest: the model, as the framework
        reports it.
      environment, strategy: run.json's sections of those names.
      final: the final losses and metrics.
      phases_measured: the ledger phases the loop really times; the others
        print "n/a".
      checkpoint_stats: the checkpoint callback's `stats()`, or None.
      notes: plain-words notes for run.json.

    Returns:
      The record written.
    """
    ledger = self.ctx.ledger
    phases_measured = list(phases_measured)
    record = run_record.build_run_record(
        framework=self._framework, config=_NO_FLAGS,
        environment=environment, model_name=model_name,
        num_params=num_params, strategy=strategy,
        ledger_summary=ledger.summary(), num_steps=len(ledger.steps),
        wall_s=time.perf_counter() - self._start_s, final=final,
        weights_digest=weights_digest, worker_index=0, num_workers=1,
        phases_measured=phases_measured,
        model_source=user_code.object_origin(model).describe(),
        outputs={"run_record": os.path.join(self.directory,
                                            run_record.RUN_RECORD_NAME)},
        checkpoint=checkpoint_stats,
        notes=["timed in the user's own training loop: no trainer flags",
               *notes])
    try:
      run_record.write_run_record(self.directory, record)
    finally:
      self.abandon()
    if self._progress:
      print(summary.format_breakdown(record, phases_measured=phases_measured),
            file=self._stream or sys.stdout, flush=True)
      print(summary.format_final(record), file=self._stream or sys.stdout,
            flush=True)
    return record

  def abandon(self) -> None:
    """Lets the directory go without writing (a loop that raised)."""
    if self._held is not None:
      self._held.release()
      self._held = None
