"""Calibrating the per-sample preprocessing cost, framework-neutral.

`--preprocess_cost_ms=N` asks for N ms of real CPU work per sample. Each
side burns it with a loop of its own (`tfoverlap.data.preprocess_cost`: a
`tf.while_loop` inside the tf.data graph; `torch_parity.data.preprocess_cost`:
NumPy ufuncs where the loader prepares samples), measures once per process
how many rounds of that loop one thread runs per millisecond, and then runs
N times that many. How the rate is measured from a probe, how it is kept,
and how a cost becomes a round count are the same on both sides and live
here; the loop and the clock are each side's.

  def _calibrate():
    run_probe(0)  # the first run pays for warming up
    return measure_iterations_per_ms(run_probe, probe_iterations=100)

  calibration = CostCalibration(_calibrate)
  calibration.iterations_for_cost(5.0)  # calibrates on first use
"""

import threading
import time
from typing import Callable, Optional

PROBE_MIN_S = 0.25  # calibration time; the process pays it once
PROBE_MIN_SAMPLES = 5


def measure_iterations_per_ms(run_probe: Callable[[int], object], *,
                              probe_iterations: int,
                              clock: Callable[[], float] = time.perf_counter,
                              min_s: float = PROBE_MIN_S,
                              min_samples: int = PROBE_MIN_SAMPLES) -> float:
  """Loop rounds per millisecond, from repeated runs of a fixed-size probe.

  Args:
    run_probe: (sample index) -> anything; runs `probe_iterations` rounds
      of the loop. Warm it up before: every run here is timed.
    probe_iterations: the rounds one probe run does; a few ms of work, so
      each run is long against the clock's resolution.
    clock: seconds; wall time by default, or a thread's CPU time where the
      probe shares the cores with other work.
    min_s: probe at least this long...
    min_samples: ...and at least this many runs.

  Returns:
    Rounds per millisecond of `clock`.
  """
  num_samples = 0
  start = clock()
  while True:
    run_probe(num_samples)
    num_samples += 1
    elapsed_s = clock() - start
    if elapsed_s >= min_s and num_samples >= min_samples:
      return num_samples * probe_iterations / (elapsed_s * 1e3)


class CostCalibration:
  """A loop's rounds per millisecond, measured once, on first use.

  The first caller measures under a lock: callers on other threads wait
  for that one measurement rather than each probe while the others load
  the cores, and every caller gets the same rate.

  Usage:
    calibration = CostCalibration(_calibrate)
    calibration.iterations_for_cost(5.0)
  """

  def __init__(self, calibrate: Callable[[], float]):
    """Args: calibrate: () -> rounds per ms; called at most once."""
    self._calibrate = calibrate
    self._lock = threading.Lock()
    self._iterations_per_ms: Optional[float] = None

  def iterations_per_ms(self) -> float:
    """Loop rounds one thread runs per millisecond, measured once."""
    with self._lock:
      if self._iterations_per_ms is None:
        self._iterations_per_ms = self._calibrate()
      return self._iterations_per_ms

  def iterations_for_cost(self, cost_ms: float) -> int:
    """Loop rounds that take `cost_ms` milliseconds of one CPU thread.

    Raises:
      ValueError: cost_ms is negative.
    """
    if cost_ms < 0:
      raise ValueError(f"cost_ms={cost_ms}: must be >= 0")
    if cost_ms == 0:
      return 0
    return max(1, round(cost_ms * self.iterations_per_ms()))
