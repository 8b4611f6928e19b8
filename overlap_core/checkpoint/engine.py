"""Checkpoint bookkeeping shared by every mode and both frameworks.

`CheckpointEngine` owns what does not depend on the framework: the cadence
(`cadence.CadencePolicy`), the background persist of a two-phase checkpoint,
what happens when a persist is still running at the next checkpoint
(`if_busy`), what happens when a save fails (`on_error`), and the numbers
run.json reports. A framework side supplies only how to take a snapshot and
how to copy one value to host memory (two-phase), or one blocking save call
(the baselines).

Two-phase, after CheckFreq:
  1. snapshot  on the training thread, between two updates: a consistent
               copy of every value (to device memory first when there is
               room, else straight to host memory). The training loop is
               blocked only for this; it is the checkpoint stall.
  2. persist   on one background thread: copy to host, serialize, write
               atomically with checksums (`checkpoint_files`), prune to the
               newest K good ones.

Every wait for a persist ends by `persist_timeout_s` after its start (see
`persist`): a hung filesystem becomes a CheckpointError under `on_error`,
and `close()` never hangs, so a training error on the way out is the one
reported. A run that does not restore refuses a directory holding
checkpoints unless told to `overwrite` them. A final save never rewrites a
checkpoint of the final step nor writes one behind the restored step: a
finished run that is run again stays finished.

Usage:
  cfg = CheckpointConfig(mode="async", every_steps=AUTO, keep=3)
  engine = CheckpointEngine(directory, cfg, take_snapshot=snap,
                            to_host=copy_to_host)
  for step in ...:
    train_step()
    if engine.is_due(step):
      engine.save(step)           # the stall
  engine.close()                  # waits for the last persist
"""

import dataclasses
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from overlap_core.checkpoint import cadence
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint import persist
from overlap_core.checkpoint.files import CheckpointError
from overlap_core.runtime import cpu_clock
from overlap_core.runtime.config import CheckpointConfig, DataConfig

CHECKPOINT_DIR_NAME = "checkpoints"
DEFAULT_PERSIST_TIMEOUT_S = 600.0
_ERRORS_KEPT = 5


@dataclasses.dataclass
class Snapshot:
  """A consistent copy of the training state, not yet on disk.

  `groups` maps a group ("model", "optimizer") to named values; a
  value is anything the engine's `to_host` turns into a NumPy array (for
  example a device tensor that was copied on the device).
  """
  step: int
  groups: Mapping[str, Mapping[str, Any]]
  state: Mapping


@dataclasses.dataclass(frozen=True)
class ResumePoint:
  """What a framework's `Checkpointer.restore_latest` restored."""
  step: int  # the last step the restored state includes
  state: dict  # the checkpoint's state.json (async); {"step": ...} otherwise
  path: str


def checkpoint_dir(model_dir: str) -> str:
  """Where a run's checkpoints live, in either framework."""
  return os.path.join(model_dir, CHECKPOINT_DIR_NAME)


def write_snapshot(directory: str, snapshot: Snapshot, *,
                   to_host: Callable[[Any], Any], keep: int) -> None:
  """Copies a snapshot to host memory, commits it, prunes to the newest `keep`.

  The persist phase of a two-phase checkpoint; a synchronous checkpoint of
  the same files calls it on the training thread.

  Raises:
    OSError: the write failed; nothing of it is left behind.
  """
  groups = {group: {name: to_host(value) for name, value in values.items()}
            for group, values in snapshot.groups.items()}
  checkpoint_files.write_checkpoint(directory, snapshot.step, groups,
                                    snapshot.state)
  checkpoint_files.prune(directory, keep, protect=snapshot.step)


def make_state_describer(data: DataConfig, *, seed: int,
                         num_train_examples: int) -> Callable[[int], dict]:
  """step -> what a checkpoint stores beside the tensors: where the data is.

  One global batch per step, so the steps done are the batches consumed; a
  resumed input pipeline skips that many.
  """
  examples_per_epoch = num_train_examples or None

  def describe(step: int) -> dict:
    examples = step * data.batch_size
    return {
        "epoch": examples // examples_per_epoch if examples_per_epoch else 0,
        "data_position": {"batches_consumed": step,
                          "examples_consumed": examples,
                          "global_batch_size": data.batch_size,
                          "dataset": data.dataset,
                          "seed": seed},
    }

  return describe


@dataclasses.dataclass(frozen=True)
class PersistCost:
  """What one background persist took: wall time, and its thread's CPU."""
  wall_s: float
  cpu_s: float


def _cpu_share(cpu_s: float, wall_s: float,
               num_cores: int) -> Optional[float]:
  """The share of the host's usable cores this process kept busy.

  Threads of this process only: a PyTorch DataLoader's worker processes are
  not in it, so with workers the share, and the CPU interference the
  cadence charges a persist, come out low.
  """
  if wall_s <= 0:
    return None
  return min(1.0, cpu_s / (wall_s * num_cores))


def _summary(samples: List[float]) -> Dict[str, float]:
  if not samples:
    return {"count": 0}
  ordered = sorted(samples)
  return {"count": len(ordered), "mean": statistics.fmean(ordered),
          "p50": statistics.median(ordered),
          "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
          "max": ordered[-1]}


class CheckpointEngine:
  """Cadence, background persist and failure policy of checkpoints.

  Args:
    directory: where this process writes checkpoints.
    cfg: the checkpoint settings, validated when `CheckpointConfig` was
      built (the one place they are): its mode names the record ("sync",
      "tf_async", "async"); every_steps is a fixed interval or
      `cadence.AUTO`, under the adaptive bound max_overhead_frac; keep
      committed checkpoints are kept (two-phase mode prunes; a baseline's
      own manager prunes in the other modes); on_error "raise"s a
      CheckpointError on the training thread, or "warn"s and goes on
      training; if_busy says what a due step does while the previous
      persist still runs: "wait" for it (the wait is stall) or "skip".
    is_writer: False on the workers that only take part in the cadence.
    take_snapshot: step -> Snapshot, for two-phase checkpoints.
    to_host: value -> NumPy array, run on the persist thread.
    save_inline: step -> None, for a baseline that saves in one call.
    agree: combines the workers' cost estimates (see cadence); None alone.
    first_step: the first step this process runs.
    log: where decisions and warnings go.
    persist_timeout_s: the longest a persist may run before it counts as
      failed (under `on_error`); every wait for it ends by then.
    restoring: whether this run restores from `directory`. A run that does
      not refuses a directory that holds checkpoints (whatever `on_error`).
    overwrite: with `restoring=False`, delete those checkpoints instead.
    resolve_hint: what the refusal tells the user to do.

  Raises:
    ValueError: both or neither of take_snapshot and save_inline.
    CheckpointDirectoryInUseError: `restoring=False`, no `overwrite`, and
      checkpoints in `directory`.
  """

  def __init__(self, directory: str, cfg: CheckpointConfig, *,
               is_writer: bool = True,
               take_snapshot: Optional[Callable[[int], Snapshot]] = None,
               to_host: Callable[[Any], Any] = lambda value: value,
               save_inline: Optional[Callable[[int], None]] = None,
               agree: Optional[cadence.Agree] = None, first_step: int = 1,
               log: Callable[[str], None] = checkpoint_files.warn_to_stderr,
               persist_timeout_s: float = DEFAULT_PERSIST_TIMEOUT_S,
               restoring: bool = True, overwrite: bool = False,
               resolve_hint: str = checkpoint_files.DEFAULT_RESOLVE_HINT):
    if (take_snapshot is None) == (save_inline is None):
      raise ValueError("give exactly one of take_snapshot (two-phase) and "
                       "save_inline (one blocking call)")
    self.directory = directory
    self.mode = cfg.mode
    self.keep = cfg.keep
    self.on_error = cfg.on_error
    self.if_busy = cfg.if_busy
    self.is_writer = is_writer
    self._take_snapshot = take_snapshot
    self._to_host = to_host
    self._save_inline = save_inline
    self._agree = agree
    self._log = log
    self.policy = cadence.CadencePolicy(
        cfg.every_steps, max_overhead_frac=cfg.max_overhead_frac,
        first_step=first_step, log=log)
    self._persists = persist.PersistThread(timeout_s=persist_timeout_s)
    self._last_mark: Optional[float] = None
    self._last_cpu_mark = 0.0
    # Read once: a syscall, not per step.
    self._num_cores = cpu_clock.usable_cores()
    self._last_marked_step = 0
    self._stall_in_step_s = 0.0
    self.stall_s: List[float] = []
    self.persist_s: List[float] = []
    self.persist_cpu_s: List[float] = []
    self.num_saved = 0
    self.num_persisted = 0
    self.num_skipped_busy = 0
    self.num_busy_waits = 0
    self.busy_wait_s = 0.0
    self.num_failed = 0
    self.errors: List[str] = []
    self.last_saved_step: Optional[int] = None
    self.final_save_s: Optional[float] = None
    self.last_persisted_step: Optional[int] = None
    self.restore_info: Dict[str, Any] = {}
    if is_writer:
      try:
        checkpoint_files.prepare_directory(
            directory, restoring=restoring, overwrite=overwrite,
            resolve=resolve_hint, log=log)
      except checkpoint_files.CheckpointDirectoryInUseError:
        raise  # a usage error, whatever the on_error policy
      except CheckpointError as e:
        self._fail(e)

  def restart_at(self, first_step: int) -> None:
    """Tells the cadence the first step this process runs (after a restore)."""
    self.policy.restart_at(first_step)

  def resumed_from(self, step: int, path: str) -> None:
    """Records a restore of `step` from `path`.

    The cadence restarts after it, and run.json's checkpoint section names
    the restore.
    """
    self.restart_at(step + 1)
    self.restore_info = {"step": step, "path": path}

  @property
  def busy(self) -> bool:
    """Whether a persist is running now."""
    return self._persists.busy

  def is_due(self, step: int) -> bool:
    """Whether to checkpoint after `step`; call once per step, every worker.

    A loop that runs several steps per call asks only after a call's last
    step. Also measures the step for the adaptive cadence: the time since
    the previous call, less the checkpoint stall in it, per step since.
    """
    now = time.perf_counter()
    cpu_now = time.process_time()
    if self._last_mark is not None:
      steps_since = max(1, step - self._last_marked_step)
      wall_s = now - self._last_mark
      self.policy.observe_step(
          (wall_s - self._stall_in_step_s) / steps_since,
          persisting=self.busy, num_steps=steps_since,
          cpu_share=_cpu_share(cpu_now - self._last_cpu_mark, wall_s,
                               self._num_cores))
    self._last_mark = now
    self._last_cpu_mark = cpu_now
    self._last_marked_step = step
    self._stall_in_step_s = 0.0
    self._collect()
    return self.policy.is_due(step, agree=self._agree)

  def save(self, step: int) -> bool:
    """Checkpoints `step`; blocks only for the stall. False if skipped."""
    start = time.perf_counter()
    try:
      return self._save(step)
    finally:
      stall_s = time.perf_counter() - start
      self._stall_in_step_s += stall_s
      if self.is_writer:
        self.stall_s.append(stall_s)
        self.policy.observe_stall(stall_s)

  def _save(self, step: int) -> bool:
    if not self.is_writer:
      return True
    if self._save_inline is not None:
      try:
        self._save_inline(step)
      except (OSError, CheckpointError) as e:
        self._fail(CheckpointError(f"checkpoint of step {step} failed: "
                                   f"{e}"))
        return False
      self.num_saved += 1
      self.last_saved_step = self.last_persisted_step = step
      # Nothing runs after the call returns: all its cost is stall.
      self.policy.observe_persist(0.0)
      return True
    if self.busy:
      if self._persists.timed_out:
        self._fail(CheckpointError(
            f"checkpoint of step {step} skipped: the persist of step "
            f"{self._persists.step} is still running, past its "
            f"{self._persists.timeout_s:g} s limit"))
        return False
      if self.if_busy == "skip":
        self.num_skipped_busy += 1
        return False
      wait_start = time.perf_counter()
      finished = self._wait_for_persist()
      self.num_busy_waits += 1
      self.busy_wait_s += time.perf_counter() - wait_start
      if not finished:
        return False
    self._collect()
    snapshot = self._take_snapshot(step)
    self.num_saved += 1
    self.last_saved_step = step
    self._persists.start(step, lambda: self._persist(snapshot))
    return True

  def _wait_for_persist(self) -> bool:
    """Waits for the running persist until its deadline; False on time-out.

    A time-out is a failure under the `on_error` policy, reported once per
    persist; the persist thread is left running, and saves fail at once
    while it does.
    """
    already_timed_out = self._persists.timed_out
    if self._persists.wait():
      return True
    if not already_timed_out:
      self._fail(CheckpointError(
          f"checkpoint of step {self._persists.step} failed: its persist "
          f"did not finish within {self._persists.timeout_s:g} s "
          "(persist_timeout_s); the filesystem may be hung"))
    return False

  def _persist(self, snapshot: Snapshot) -> "PersistCost":
    """Runs on the persist thread; returns what it cost."""
    start = time.perf_counter()
    start_cpu = time.thread_time()
    write_snapshot(self.directory, snapshot, to_host=self._to_host,
                   keep=self.keep)
    return PersistCost(wall_s=time.perf_counter() - start,
                       cpu_s=time.thread_time() - start_cpu)

  def _collect(self) -> None:
    """Books a finished persist on the training thread (the policy's)."""
    finished = self._persists.take_finished()
    if finished is None:
      return
    step, outcome = finished
    if isinstance(outcome, BaseException):
      self._fail(CheckpointError(
          f"checkpoint of step {step} failed while persisting: {outcome}"))
      return
    self.persist_s.append(outcome.wall_s)
    self.persist_cpu_s.append(outcome.cpu_s)
    self.policy.observe_persist(outcome.wall_s, cpu_s=outcome.cpu_s)
    self.num_persisted += 1
    self.last_persisted_step = step

  def _fail(self, error: CheckpointError) -> None:
    self.num_failed += 1
    self.errors = (self.errors + [str(error)])[-_ERRORS_KEPT:]
    if self.on_error == "raise":
      raise error
    self._log(f"warning: {error}; training goes on "
              "(--checkpoint_on_error=warn)")

  def finish(self, last_step: int) -> None:
    """Saves the final state unless it is on disk already, then closes.

    Runs after the training loop, so its time is not in the ledger; a
    finished run then always resumes as finished. The busy policy does not
    apply: the final state is never skipped. Nothing is saved when
    `last_step` was just saved, is not after the restored step (nothing was
    trained: the state is the restored one, not that of `last_step`), or
    already has a checkpoint that verifies.
    """
    try:
      if self._final_save_needed(last_step):
        self.if_busy, if_busy = "wait", self.if_busy
        num_stalls = len(self.stall_s)
        try:
          self.save(last_step)
        finally:
          self.if_busy = if_busy
          # Not a stall of training: kept apart from the per-checkpoint
          # numbers, which the cadence and the benchmarks read.
          self.final_save_s = sum(self.stall_s[num_stalls:])
          del self.stall_s[num_stalls:]
    finally:
      self.close()

  def _final_save_needed(self, last_step: int) -> bool:
    if last_step <= 0 or last_step == self.last_saved_step:
      return False
    restored_step = self.restore_info.get("step")
    if restored_step is not None and last_step <= restored_step:
      if last_step < restored_step:
        self._log(f"the run ends at step {last_step}, before the restored "
                  f"step {restored_step}: nothing was trained, and the "
                  "checkpoints stay as they are")
      return False
    # Only the files of two-phase checkpoints are read here: a baseline
    # saves on every worker, and all of them must decide alike.
    if self._take_snapshot is not None and self.is_writer:
      return not checkpoint_files.verifies(os.path.join(
          self.directory, checkpoint_files.checkpoint_dir_name(last_step)))
    return True

  def wait_until_finished(self) -> None:
    """Blocks until the running persist, if any, is on disk, or times out.

    Raises:
      CheckpointError: the persist failed or timed out (on_error="raise").
    """
    if self._wait_for_persist():
      self._collect()

  def close(self) -> None:
    """Waits (bounded) for the last persist; its failure follows on_error."""
    self.wait_until_finished()

  def stats(self) -> dict:
    """What run.json reports about checkpoints."""
    return {
        "mode": self.mode,
        "every_steps": ("auto" if self.policy.is_auto
                        else self.policy.fixed_every_steps),
        "final_every_steps": self.policy.every_steps,
        "max_overhead_frac": self.policy.max_overhead_frac,
        "keep": self.keep,
        "on_error": self.on_error,
        "if_busy": self.if_busy,
        "writer": self.is_writer,
        "num_saved": self.num_saved,
        "num_persisted": self.num_persisted,
        "num_skipped_busy": self.num_skipped_busy,
        "num_busy_waits": self.num_busy_waits,
        "busy_wait_s": self.busy_wait_s,
        "num_failed": self.num_failed,
        "errors": list(self.errors),
        "last_persisted_step": self.last_persisted_step,
        "stall_s": _summary(self.stall_s),
        "final_save_s": self.final_save_s,
        "persist_s": _summary(self.persist_s),
        "persist_cpu_s": _summary(self.persist_cpu_s),
        "persist_nice": self._persists.nice,
        "decisions": [d.to_dict() for d in self.policy.decisions],
        "restore": dict(self.restore_info),
    }
