"""Offload copy statistics, per direction: the run.json `offload` section.

Both trainers count every offload copy here: tensors, bytes and, where the
framework can time one copy, its duration.

Where a run cannot time its step alone with and without offload
(`overlap_core.runtime.offload_cost`, which holds everything offload
costs), the copies the training stream runs in series with compute become
the ledger phase `offload`, carved out of each step's compute span as a
pipelined step's is carved into stage_compute, bubble and transfer
(`ledger.carve_compute`): per step, the copies' summed time, capped at the
span, is `offload`, the rest `compute`, so the phases still add up to
the step. Which copies count:

- PyTorch on a GPU: those on the main stream (forward saves, backward
  restores, weight fetches and gradients leaving), timed with CUDA events
  on the device. Prefetches run on a side stream, overlapping compute:
  they are in this section only. Without a GPU every copy, the prefetches
  included, runs on the training thread at once and is timed with the host
  clock, so all of them count.
- TensorFlow: each Conv/Dense input's copy to the host and its restore,
  timed in the compiled step with `tf.timestamp` (the host clock) around
  the copy. These are host-side spans around ops the executor may run
  beside others (and, on a GPU, a copy to the host also waits for its
  input to be computed), so read the phase as an upper bound of what the
  copies cost in series; with several replicas it is the copies' time
  divided by the replicas, which run side by side. Under op determinism
  TensorFlow refuses its clock: the copies are counted only and stay
  inside compute.

  stats = CopyStats()
  stats.add(TO_HOST, num_bytes=4096, duration_s=1e-5)
  stats.summary(num_steps=10)["to_host"]["bytes"]  # 4096
"""

import statistics
import threading
from typing import Dict, List, Optional

OFFLOAD = "offload"  # the ledger phase: what offload adds to the step
TO_HOST = "to_host"  # device -> host: forward saves, a layer's weights leave
TO_DEVICE = "to_device"  # host -> device: backward restores, weights return
DIRECTIONS = (TO_HOST, TO_DEVICE)


def describe_copy_ms(durations_s: List[float]) -> Optional[Dict[str, float]]:
  """mean, max, min, median and total of the copies, in ms (the study's
  columns); None when no copy was timed."""
  if not durations_s:
    return None
  ms = [1e3 * d for d in durations_s]
  return {"mean": sum(ms) / len(ms), "max": max(ms), "min": min(ms),
          "median": statistics.median(ms), "total": sum(ms)}


class CopyStats:
  """Counts (and times) offload copies per direction; thread-safe.

  Autograd runs a CUDA backward on a thread of its own, so the restores
  are counted there while the saves were counted on the main thread.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self.reset()

  def reset(self) -> None:
    """Forgets every copy so far (a benchmark's warm-up steps)."""
    self._tensors = {d: 0 for d in DIRECTIONS}
    self._bytes = {d: 0 for d in DIRECTIONS}
    self._durations_s = {d: [] for d in DIRECTIONS}
    self._prefetched = 0

  def add(self, direction: str, *, num_bytes: int,
          duration_s: Optional[float] = None, tensors: int = 1) -> None:
    """One copy of `num_bytes`; `duration_s` None when it cannot be timed."""
    if direction not in DIRECTIONS:
      raise ValueError(f"direction={direction!r}: allowed: "
                       f"{', '.join(DIRECTIONS)}")
    with self._lock:
      self._tensors[direction] += tensors
      self._bytes[direction] += int(num_bytes)
      if duration_s is not None:
        self._durations_s[direction].append(duration_s)

  def add_duration(self, direction: str, duration_s: float) -> None:
    """The time of a copy counted earlier, once it is known (CUDA events)."""
    with self._lock:
      self._durations_s[direction].append(duration_s)

  def count_prefetched(self, tensors: int = 1) -> None:
    """Restores that were issued early, on the side stream."""
    with self._lock:
      self._prefetched += tensors

  def summary(self, *, num_steps: int) -> dict:
    """{direction: {tensors, bytes, tensors_per_step, mb_per_step, copy_ms,
    timed_copies}, "prefetched_tensors"}."""
    with self._lock:
      result = {}
      for d in DIRECTIONS:
        per_step = 1.0 / num_steps if num_steps else 0.0
        result[d] = {
            "tensors": self._tensors[d],
            "bytes": self._bytes[d],
            "tensors_per_step": self._tensors[d] * per_step,
            "mb_per_step": self._bytes[d] * per_step / 2**20,
            "timed_copies": len(self._durations_s[d]),
            "copy_ms": describe_copy_ms(self._durations_s[d]),
        }
      result["prefetched_tensors"] = self._prefetched
      return result
