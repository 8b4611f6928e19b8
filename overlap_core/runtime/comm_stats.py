"""Exposed communication: the all-reduce time that backward did not hide.

A data-parallel step all-reduces its gradients while backward still runs
(DDP's buckets, Horovod's fused tensors). What the ledger reports apart
from compute is only the part the step waited for:

- DDP: from the moment the last gradient bucket was handed to the
  all-reduce (backward's last gradient computed) to backward's return,
  which is where DDP's reducer waits for every bucket's all-reduce to
  finish and copies the results back. On the CPU both ends are read on
  the host clock; on a GPU with CUDA events on the training stream, so the
  span covers the device's wait and not the host's launch.
- Horovod: the `optimizer.synchronize()` call, which waits for every
  outstanding all-reduce before the update.
- TensorFlow: the all-reduce runs inside the compiled step, where no host
  clock reaches; the phase is derived instead, from the same step timed
  without the all-reduce before training (`tfoverlap.exposed_comm`), and
  run.json lists it in `phases_derived`, not in `phases_measured`.

The phase is carved out of the step's compute span (`ledger.carve_compute`)
so the phases still add up to the step.

  timer = ExposedCommTimer()
  timer.add(0.002)  # a step's wait, as measured
  ledger.carve_compute(start_s, end_s, EXPOSED_COMM, timer.take_s())
"""

import threading

EXPOSED_COMM = "exposed_comm"  # the ledger phase of all-reduce not hidden


class ExposedCommTimer:
  """Sums a step's exposed all-reduce waits until the loop takes them.

  Thread-safe: autograd may run a CUDA backward on a thread of its own.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._pending_s = 0.0
    self._total_s = 0.0
    self._num_waits = 0

  def add(self, seconds: float) -> None:
    """Adds one wait (negative clock noise counts as zero)."""
    with self._lock:
      self._pending_s += max(seconds, 0.0)
      self._total_s += max(seconds, 0.0)
      self._num_waits += 1

  def take_s(self) -> float:
    """The waits added since the last call, summed; resets them."""
    with self._lock:
      taken, self._pending_s = self._pending_s, 0.0
      return taken

  def summary(self) -> dict:
    """The waits over the whole run, for tests and notes."""
    with self._lock:
      return {"total_s": self._total_s, "num_waits": self._num_waits}
