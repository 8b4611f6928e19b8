"""Real CPU work added to each sample, to make any machine input-bound.

`--preprocess_cost_ms` stands in for expensive augmentation. The work is a
busy loop of elementwise math that runs inside the tf.data graph, so it is
real CPU time that `--map_parallelism` spreads over threads exactly as it
would spread real augmentation. `tf.py_function` would not do: it holds the
Python GIL, so parallel calls would queue behind each other.

The loop's iteration count per millisecond is measured once per process, on
this machine, and then fixed: a cost of N ms is N times that count.

Usage:

  cost_fn = make_cost_fn(5.0)  # calibrates on first use (well under 1 s)
  ds = ds.map(cost_fn, num_parallel_calls=tf.data.AUTOTUNE)
"""

from typing import Callable, Tuple

import tensorflow as tf

from overlap_core.runtime.cost_calibration import (CostCalibration,
                                             measure_iterations_per_ms)

# Floats the loop updates each iteration. At 256 the executor's bookkeeping
# dominated and two parallel map calls were no faster than one on 2 cores; at
# 4096 the arithmetic dominates and they were nearly twice as fast. Still
# small enough to stay in cache and below the size at which TensorFlow splits
# one elementwise op over threads, which would blur the parallelism knob.
WORK_WIDTH = 4096
_PROBE_ITERATIONS = 100  # per probe sample: a few ms, so timing is precise


def burn(seed_value, iterations) -> Tuple[tf.Tensor, tf.Tensor]:
  """Runs `iterations` rounds of elementwise math on a small vector.

  Args:
    seed_value: scalar the vector starts from; tie it to the sample so the
      work cannot be computed once and reused.
    iterations: how many rounds (Python int or scalar int32 tensor).

  Returns:
    (rounds actually run, int32; a finite float32 checksum of the result).
  """
  start = tf.fill([WORK_WIDTH], tf.cast(seed_value, tf.float32))

  def body(i, x):
    # Bounded in [-0.25, 0.75]: the checksum never overflows to inf or NaN.
    return i + 1, tf.sin(x) * 0.5 + 0.25

  rounds, result = tf.while_loop(lambda i, _: i < iterations, body,
                                 (tf.constant(0), start),
                                 parallel_iterations=1)
  return rounds, tf.reduce_sum(result)


def iterations_per_ms() -> float:
  """Loop rounds one thread runs per millisecond, measured once per process.

  Measured inside a sequential tf.data map, the same place the cost runs,
  so function-call and iterator overheads are priced in.
  """
  return _CALIBRATION.iterations_per_ms()


def iterations_for_cost(cost_ms: float) -> int:
  """Loop rounds that take `cost_ms` milliseconds of one CPU thread.

  Raises:
    ValueError: cost_ms is negative.
  """
  return _CALIBRATION.iterations_for_cost(cost_ms)


def make_cost_fn(cost_ms: float) -> Callable:
  """A map function `(image, label) -> (image, label)` that costs `cost_ms`.

  The image comes back unchanged in value, yet depends on the work, so no
  graph optimization can drop the loop. Calibration happens here, eagerly,
  not while tf.data traces the function.

  Raises:
    ValueError: cost_ms is negative.
  """
  iterations = iterations_for_cost(cost_ms)

  def apply_cost(image, label):
    _, checksum = burn(tf.reduce_mean(image), iterations)
    # min(|checksum|, 0) is always 0, but no optimizer can prove it (unlike
    # 0 * checksum, which constant folding may turn into 0 and drop the loop).
    return image + tf.minimum(tf.abs(checksum), 0.0), label

  return apply_cost


def _calibrate() -> float:
  # Without this, tf.data's map_parallelization runs the probe on several
  # threads and the calibration overstates one thread's speed.
  sequential = tf.data.Options()
  sequential.experimental_optimization.map_parallelization = False
  sequential.experimental_optimization.inject_prefetch = False
  probe = tf.data.Dataset.range(1 << 30).map(
      lambda i: burn(tf.cast(i % 7, tf.float32), _PROBE_ITERATIONS)[1]
  ).with_options(sequential)
  samples = iter(probe)
  next(samples)  # the first element pays for building the function
  return measure_iterations_per_ms(lambda _: next(samples),
                                   probe_iterations=_PROBE_ITERATIONS)


_CALIBRATION = CostCalibration(_calibrate)
