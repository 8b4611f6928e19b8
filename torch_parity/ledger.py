"""`LoopLedger`: the trainers' step ledger for a hand-written PyTorch loop.

The mirror of `tfoverlap.ledger.LedgerCallback`: where each step's time
goes (data wait, compute, checkpoint stall, the rest), a progress line, and
at the end the breakdown table and `<directory>/run.json`, written by the
same code as the trainers' (`overlap_core.runtime.user_loop`), so that
`overlap_compare` reads it like a trainer's run. PyTorch has no
`model.fit` to call back from, so the loop marks its phases itself, as
`torch_parity.loops.run_custom_loop` does.
"""

import contextlib
import dataclasses
import time
from typing import Iterable, Iterator, Optional

import torch

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.config import ArgumentError
from overlap_core.runtime.loop_context import after_step
from overlap_core.runtime.user_loop import UserLoop
from torch_parity import models

__all__ = ["LoopLedger"]

FRAMEWORK = "pytorch"
PHASES_MEASURED = ledger_lib.PHASES  # data wait, compute, checkpoint stall


@dataclasses.dataclass(frozen=True)
class _World:
  """What `trainer.describe_environment` reads of a strategy."""
  world_size: int


class LoopLedger:
  """The step ledger of the trainers, for a training loop you wrote.

  Wrap the loop in `with LoopLedger(...) as ledger:`, take its batches
  through `ledger.batches(loader)` (the wait for each is data_wait), call
  `ledger.step(loss)` when the step's update is done (compute: from the
  batch's arrival to here; reading the loss waits for a CUDA step to
  finish), and time a checkpoint in `with ledger.checkpoint_stall():`. A
  step ends when the next batch is asked for (or the block ends), so a
  checkpoint after `step()` is part of that step, as in the trainers.
  Prints a progress line every `log_every_steps` steps; when the block
  ends without an error, prints the per-step breakdown and writes
  `<directory>/run.json` in the trainers' schema, which `overlap_compare`
  reads. `record` holds it afterwards.

  Usage:
    with LoopLedger("runs/mine", model=model, batch_size=64) as ledger:
      for inputs, targets in ledger.batches(loader):
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        ledger.step(loss)
        if ledger.num_steps % 100 == 0:
          with ledger.checkpoint_stall():
            torch.save(model.state_dict(), "ckpt.pt")

  Where the batch is not taken from an iterable, `with ledger.data_wait():
  batch = ...` times its wait instead. Between `__enter__` and `__exit__`
  the ledger is `directory`'s one writer (a `DirectoryInUseError` refuses
  a second).

  Args:
    directory: where run.json is written.
    model: the module trained (its parameters and digest go in run.json).
    batch_size: samples per step, the global batch (for samples/s).
    total_steps: the steps the loop will run, for the progress line's
      total and ETA; None: unknown.
    log_every_steps: a progress line every this many steps.
    progress: False prints no progress lines nor breakdown.
    stream: where they go (default: stdout).

  Raises:
    ValueError (an ArgumentError): at once, for an argument that is not
      allowed, naming it.
  """

  def __init__(self, directory: str, *, model: torch.nn.Module,
               batch_size: int, total_steps: Optional[int] = None,
               log_every_steps: int = 10, progress: bool = True,
               stream=None):
    if not isinstance(model, torch.nn.Module):
      raise ArgumentError("model", type(model).__name__,
                          "allowed: the torch.nn.Module being trained")
    if total_steps is not None and not (
        isinstance(total_steps, int) and total_steps >= 1):
      raise ArgumentError("total_steps", total_steps,
                          "allowed: None or an integer >= 1")
    self._loop = UserLoop(directory, framework=FRAMEWORK,
                          batch_size=batch_size,
                          log_every_steps=log_every_steps,
                          progress=progress, stream=stream)
    self._model = model
    self._total_steps = total_steps
    self._ctx = None
    self._compute_start_s = 0.0
    self._last_mark_s = 0.0  # the end of the last phase marked
    self._pending_loss: Optional[float] = None  # a step not yet ended
    self.num_steps = 0  # steps marked with step()
    self.last_loss = float("nan")
    self.record: Optional[dict] = None

  @property
  def directory(self) -> str:
    return self._loop.directory

  def __enter__(self) -> "LoopLedger":
    self._ctx = self._loop.begin(self._total_steps)
    self.record = None
    self.num_steps = 0
    self._pending_loss = None
    self._compute_start_s = self._last_mark_s = time.perf_counter()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is not None:
      self._loop.abandon()
      return
    self._end_pending(end_s=None)
    self.record = self._write()

  def batches(self, iterable: Iterable) -> Iterator:
    """Yields `iterable`'s items, timing the wait for each as data_wait."""
    self._check_open("batches")
    iterator = iter(iterable)
    while True:
      self._end_pending(end_s=None)
      start_s = time.perf_counter()
      try:
        batch = next(iterator)
      except StopIteration:
        return
      self._mark_data_wait(start_s)
      yield batch

  @contextlib.contextmanager
  def data_wait(self):
    """Times the enclosed block as the wait for the next batch."""
    self._check_open("data_wait")
    self._end_pending(end_s=None)
    start_s = time.perf_counter()
    yield
    self._mark_data_wait(start_s)

  def step(self, loss=None) -> None:
    """Ends the step's compute (its update is done); the step ends when
    the next batch is asked for.

    Args:
      loss: the step's loss (a tensor or number), for the progress line
        and run.json; reading it waits for the step's CUDA work. None:
        the model's device is synchronized instead.
    """
    self._check_open("step")
    if self._pending_loss is not None:
      # No data wait marked since the last step: it ended at its last mark.
      self._end_pending(end_s=self._last_mark_s)
      self._compute_start_s = self._last_mark_s
    if loss is None:
      self._synchronize()
      loss_value = float("nan")
    else:
      loss_value = float(loss.detach() if torch.is_tensor(loss) else loss)
    now_s = time.perf_counter()
    self._ctx.ledger.add(ledger_lib.COMPUTE, self._compute_start_s, now_s)
    self._last_mark_s = now_s
    self._pending_loss = self.last_loss = loss_value
    self.num_steps += 1

  @contextlib.contextmanager
  def checkpoint_stall(self):
    """Times the enclosed block as training blocked by a checkpoint."""
    self._check_open("checkpoint_stall")
    with self._ctx.ledger.phase(ledger_lib.CHECKPOINT_STALL):
      yield
    self._last_mark_s = time.perf_counter()

  def _check_open(self, method: str) -> None:
    if self._ctx is None or self.record is not None:
      raise RuntimeError(f"LoopLedger.{method}() is used inside "
                         "`with LoopLedger(...) as ledger:`")

  def _mark_data_wait(self, start_s: float) -> None:
    end_s = time.perf_counter()
    self._ctx.ledger.add(ledger_lib.DATA_WAIT, start_s, end_s)
    self._compute_start_s = self._last_mark_s = end_s

  def _end_pending(self, *, end_s: Optional[float]) -> None:
    if self._pending_loss is None:
      return
    loss, self._pending_loss = self._pending_loss, None
    after_step(self._ctx, self.num_steps, loss, end_s=end_s)

  def _synchronize(self) -> None:
    parameter = next(self._model.parameters(), None)
    if parameter is not None and parameter.device.type == "cuda":
      torch.cuda.synchronize(parameter.device)

  def _write(self) -> dict:
    # Here, not at the top: the trainer imports every overlap.
    from torch_parity import trainer  # pylint: disable=g-import-not-at-top
    parameter = next(self._model.parameters(), None)
    device = str(parameter.device) if parameter is not None else "cpu"
    distributed = (torch.distributed.is_available()
                   and torch.distributed.is_initialized())
    world_size = torch.distributed.get_world_size() if distributed else 1
    ddp = isinstance(self._model, torch.nn.parallel.DistributedDataParallel)
    trained = self._model.module if ddp else self._model
    return self._loop.write(
        model=trained, model_name=type(trained).__name__,
        num_params=models.num_params(self._model),
        weights_digest=trainer.weights_digest(self._model),
        environment=trainer.describe_environment(_World(world_size)),
        strategy={"name": "user",
                  "class": "DistributedDataParallel" if ddp else "none",
                  "num_replicas": world_size, "devices": [device]},
        final={"train_loss": self.last_loss},
        phases_measured=PHASES_MEASURED)
