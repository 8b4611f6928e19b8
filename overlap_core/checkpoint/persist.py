"""The background persist: one at a time, on a daemon thread, with a deadline.

Every wait for a persist ends by its deadline (its start plus the limit),
so a hung filesystem costs the training loop a bounded wait and an error,
never a freeze. The thread is a daemon, not an executor's worker: a write
hung in the kernel must not keep the process from exiting once its wait
has given up on it.

The persist thread lowers its own scheduling priority (Linux keeps a nice
value per thread): its serialization and checksums then take the cores
when training leaves them idle, rather than slowing the steps they
overlap. When training blocks on it (a busy wait, the final save), the
persist has the cores to itself, priority or not.

Usage:
  persists = PersistThread(timeout_s=600)
  persists.start(step, lambda: write(...))  # returns what it cost
  ...
  if not persists.wait():          # False: past the deadline
    ...                            # report; the thread is left running
  finished = persists.take_finished()  # (step, its result or exception)
"""

import concurrent.futures
import os
import threading
import time
from typing import Any, Callable, Optional, Tuple

# How much the persist thread raises its nice value (0 = unchanged). Nice
# 10 weighs about a tenth of a nice-0 thread on a busy core: training keeps
# its pace, and the persist still progresses, so a persist does not starve
# on a host whose cores training fills (19 weighs a seventieth).
PERSIST_NICE_INCREMENT = 10


def lower_this_threads_priority(increment: int) -> Optional[int]:
  """Raises the calling thread's nice value; returns it, None if refused.

  Linux schedules threads as tasks, each with its own nice value, so this
  leaves the rest of the process as it was. Elsewhere it is a no-op.
  """
  if increment <= 0 or not hasattr(os, "setpriority"):
    return None
  try:
    tid = threading.get_native_id()
    current = os.getpriority(os.PRIO_PROCESS, tid)
    os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    return os.getpriority(os.PRIO_PROCESS, tid)
  except OSError:
    return None


class PersistThread:
  """Runs one persist at a time; waits end at the persist's deadline.

  Args:
    timeout_s: the longest a persist may run, from its start.
    nice_increment: how much each persist thread lowers its priority.
  """

  def __init__(self, *, timeout_s: float,
               nice_increment: int = PERSIST_NICE_INCREMENT):
    if not timeout_s > 0:
      raise ValueError(f"persist_timeout_s={timeout_s}: allowed: a number "
                       "of seconds > 0")
    self.timeout_s = timeout_s
    self.nice_increment = nice_increment
    self.nice: Optional[int] = None  # the last persist thread's nice value
    self._future: Optional[concurrent.futures.Future] = None
    self._deadline = 0.0
    self.step = 0  # the step of the current (or last) persist
    self.timed_out = False  # whether a wait gave up on the current one

  @property
  def busy(self) -> bool:
    """Whether a persist is running now."""
    return self._future is not None and not self._future.done()

  def start(self, step: int, persist: Callable[[], Any]) -> None:
    """Runs `persist` (which returns what it cost) on a new daemon thread."""
    future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
      self.nice = lower_this_threads_priority(self.nice_increment)
      try:
        result = persist()
      except BaseException as e:  # pylint: disable=broad-except
        future.set_exception(e)
      else:
        future.set_result(result)

    self._future = future
    self._deadline = time.monotonic() + self.timeout_s
    self.step = step
    self.timed_out = False
    threading.Thread(target=run, name="checkpoint-persist",
                     daemon=True).start()

  def wait(self) -> bool:
    """Waits until the persist ends or its deadline; False if it passed.

    Returns at once after a wait has already given up on this persist.
    """
    if self._future is None:
      return True
    remaining_s = max(0.0, self._deadline - time.monotonic())
    done, _ = concurrent.futures.wait([self._future], timeout=remaining_s)
    if not done:
      self.timed_out = True
    return bool(done)

  def take_finished(self) -> Optional[Tuple[int, Any]]:
    """(step, what it returned or its exception) of a finished persist, once.

    None while one runs, or when there is nothing to collect.
    """
    if self._future is None or not self._future.done():
      return None
    future, self._future = self._future, None
    self.timed_out = False
    error = future.exception()
    return self.step, (future.result() if error is None else error)
