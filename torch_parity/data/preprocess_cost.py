"""Real CPU work added to each sample, to make any machine input-bound.

The PyTorch twin of `tfoverlap.data.preprocess_cost`: `--preprocess_cost_ms`
stands in for expensive augmentation. The work is a loop of elementwise NumPy
math on a small vector, run where the sample is prepared: in a DataLoader
worker process when there are workers, so `--map_parallelism` workers run it
side by side, or on the loader's sample threads when the data is loaded
inline. NumPy releases the GIL while a ufunc computes, so those threads run
it in parallel too. Torch ops would not do: they split even a 4096-float
vector over the intra-op threads, so one sample's work would already use
several cores (and, on a busy host, was seen to cost 100 times more CPU
waiting at the ops' barriers).

The loop's iteration count per millisecond of CPU time is measured once per
process, on this machine, and then fixed: a cost of N ms is N times that
count. It is measured in the training process and handed to the workers, so
every worker runs the same number of rounds.

Usage:

  iterations = iterations_for_cost(5.0)  # calibrates on first use (< 1 s)
  image = apply_cost(image, iterations)  # same values, 5 ms later
"""

import time
from typing import Tuple

import numpy as np
import torch

from overlap_core.runtime.cost_calibration import (CostCalibration,
                                             measure_iterations_per_ms)

# Floats the loop updates each iteration: enough that the arithmetic, during
# which the GIL is released, outweighs the Python call of each ufunc (about
# 25 us a round against a few us of calls), while the vector stays in cache.
WORK_WIDTH = 16384
_HALF, _QUARTER = np.float32(0.5), np.float32(0.25)
_PROBE_ITERATIONS = 50  # per probe sample: a few ms, so timing is precise


def burn(seed_value: float, iterations: int) -> Tuple[int, float]:
  """Runs `iterations` rounds of elementwise math on a small vector.

  Args:
    seed_value: the value the vector starts from; tie it to the sample so the
      work differs per sample.
    iterations: how many rounds.

  Returns:
    (rounds actually run, a finite checksum of the result).
  """
  x = np.full(WORK_WIDTH, seed_value, dtype=np.float32)
  rounds = 0
  for rounds in range(1, iterations + 1):
    # Bounded in [-0.25, 0.75]: the checksum never overflows to inf or NaN.
    np.sin(x, out=x)
    np.multiply(x, _HALF, out=x)
    np.add(x, _QUARTER, out=x)
  return rounds, float(x.sum())


def iterations_per_ms() -> float:
  """Loop rounds one thread runs per millisecond, measured once per process."""
  return _CALIBRATION.iterations_per_ms()


def iterations_for_cost(cost_ms: float) -> int:
  """Loop rounds that take `cost_ms` milliseconds of one CPU thread.

  Raises:
    ValueError: cost_ms is negative.
  """
  return _CALIBRATION.iterations_for_cost(cost_ms)


def apply_cost(image: torch.Tensor, iterations: int) -> torch.Tensor:
  """Spends `iterations` rounds of CPU work on `image`'s behalf.

  Eager code runs every op it is given, so, unlike in a tf.data graph,
  nothing can optimize the loop away and the image is returned as it came.

  Args:
    image: one decoded sample.
    iterations: from `iterations_for_cost`.

  Returns:
    `image`, unchanged.
  """
  if iterations:
    burn(float(image.mean()), iterations)
  return image


def _calibrate() -> float:
  burn(0.0, _PROBE_ITERATIONS)  # the first call pays for warming up
  # This thread's CPU time, not wall time: on a busy host the probe shares
  # the cores, and wall time would understate the loop's speed and make
  # every later "N ms" cost less CPU than N ms.
  return measure_iterations_per_ms(
      lambda sample: burn(float(sample % 7), _PROBE_ITERATIONS),
      probe_iterations=_PROBE_ITERATIONS, clock=time.thread_time)


_CALIBRATION = CostCalibration(_calibrate)
