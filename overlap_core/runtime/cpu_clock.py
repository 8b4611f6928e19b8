"""CPU clocks for the ledger: what a step's work cost, beside what it took.

A step's wall time says how long it took; its CPU time says how much work
the host did meanwhile. Together they tell a machine that is full (the
work, spread over the cores, fills the step) from one where overlapped
phases only get in each other's way.

Three clocks, from cheapest to widest:

- `time.thread_time()`: the training thread alone;
- `time.process_time()`: every thread of this process, which includes
  TensorFlow's op and tf.data threads and PyTorch's intra-op pool;
- `ProcessTreeClock`: this process plus its worker processes, those that
  `multiprocessing` started from any thread, such as PyTorch's DataLoader
  workers: live ones read from /proc, exited ones from the kernel's
  account of reaped children. Helper processes started otherwise (the
  background job of --background_job, which only borrows idle cores) are
  left out while they live. /proc counts in clock ticks (10 ms), so it is
  read once per step, not per phase, and is meaningful over many steps, as
  a mean. The children's part is read at most every
  `CHILDREN_READ_INTERVAL_S`: in a profile of 5 ms PyTorch steps with two
  DataLoader workers, reading their /proc files every step was most of
  the ledger's own time per step, for a precision the ticks do not have.
  A step that reads carries the children's CPU of the steps since the
  last read.

Nothing here imports a framework.
"""

import multiprocessing
import os
import resource
import time

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Ten of /proc's 10 ms ticks: a finer read gains no precision.
CHILDREN_READ_INTERVAL_S = 0.1


def usable_cores() -> int:
  """The cores this process may run on (its affinity), else all of them."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def _proc_cpu_s(pid: int) -> float:
  """User + system CPU of one live process, from /proc/<pid>/stat."""
  with open(f"/proc/{pid}/stat", "rb") as f:
    stat = f.read()
  # The command name (field 2) may hold spaces; fields resume after ')'.
  fields = stat[stat.rindex(b")") + 2:].split()
  return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


class ProcessTreeClock:
  """CPU seconds of this process and its children, never going backwards.

  A child that exits moves from the live reading to the reaped account,
  and one that has exited but is not yet reaped can vanish from both for a
  moment; the clock then holds its previous value rather than step back.
  """

  def __init__(self, *, read_interval_s: float = CHILDREN_READ_INTERVAL_S,
               monotonic=time.monotonic):
    self._last_s = 0.0
    self._read_interval_s = read_interval_s
    self._monotonic = monotonic
    self._children_s = 0.0
    self._children_read_at = None

  def children_s(self) -> float:
    """CPU of live worker processes and of every reaped child since this
    process started."""
    live = 0.0
    # active_children() also reaps the workers that have exited, whose CPU
    # then moves to the reaped account.
    for child in multiprocessing.active_children():
      try:
        live += _proc_cpu_s(child.pid)
      except (OSError, ValueError, IndexError):
        continue  # exited between the listing and the read
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return live + reaped.ru_utime + reaped.ru_stime

  def __call__(self) -> float:
    at = self._monotonic()
    if (self._children_read_at is None
        or at - self._children_read_at >= self._read_interval_s):
      self._children_s = self.children_s()
      self._children_read_at = at
    now = time.process_time() + self._children_s
    self._last_s = max(self._last_s, now)
    return self._last_s
