"""What `--preprocess_cost_ms` delivers, measured in a fresh process.

  python -m benchmarks.cost_probe --costs=0,0.5,1,2 --result_json=cost.json

Every trainer process calibrates the cost loop once (well under a second)
and keeps that calibration for the whole run, so this probe does the same:
it starts fresh, lets the library calibrate, and then measures, per
requested cost, the time one sample takes through `make_input_fn`'s
training pipeline (synthetic 16x16, batch 64) when the pipeline runs on one
thread: no prefetch, `--map_parallelism=1`, and tf.data's
`map_parallelization` rewrite switched off on the finished dataset, because
that default rewrite turns the library's plain map into a parallel one and
the time per sample would then be shared among threads. The delivered cost
is that time net of the time at cost 0.

It also times the library's own calibration probe loop (`burn`) on one
thread, so the calibrated rate can be compared with the rate a single
thread really runs at.
"""

import json
import os
import sys
import time

from absl import app
from absl import flags

_COSTS = flags.DEFINE_list("costs", ["0", "0.25", "0.5", "1", "2"],
                           "Requested ms per sample; 0 is added if missing.")
_BATCHES = flags.DEFINE_integer("batches", 12, "Batches timed per cost.")
_RESULT_JSON = flags.DEFINE_string("result_json", None, "Where to write.")

BATCH_SIZE = 64
_PROBE_ITERATIONS = 100
_PROBE_S = 0.5


def single_thread_rate(tf, burn) -> float:
  """Loop rounds per ms of the calibration's own loop, map kept sequential."""
  probe = tf.data.Dataset.range(1 << 30).map(
      lambda i: burn(tf.cast(i % 7, tf.float32), _PROBE_ITERATIONS)[1])
  samples = iter(probe.with_options(sequential_options(tf)))
  next(samples)
  count = 0
  start = time.perf_counter()
  while time.perf_counter() - start < _PROBE_S:
    next(samples)
    count += 1
  return count * _PROBE_ITERATIONS / (1e3 * (time.perf_counter() - start))


def sequential_options(tf):
  options = tf.data.Options()
  options.experimental_optimization.map_parallelization = False
  return options


def main(argv):
  del argv
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tfoverlap import data
  from overlap_core.runtime.config import DataConfig
  from tfoverlap.data import preprocess_cost
  # pylint: enable=g-import-not-at-top
  costs = sorted({0.0, *(float(c) for c in _COSTS.value)})
  calibrated_rate = preprocess_cost.iterations_per_ms()
  rate_after = single_thread_rate(tf, preprocess_cost.burn)
  per_sample_ms = {}
  for cost in costs:
    cfg = DataConfig(
        dataset="synthetic", data_dir=None, tfds_name="mnist", image_size=16,
        num_classes=10, batch_size=BATCH_SIZE, synthetic_on_device=False,
        prefetch=0, prefetch_to_device=False, map_parallelism=1, cache=False,
        shuffle_buffer=0, preprocess_cost_ms=cost, data_service="")
    ds = data.make_input_fn(cfg, split="train", task="classification",
                            seed=0)(None)
    batches = iter(ds.with_options(sequential_options(tf)))
    next(batches)
    start = time.perf_counter()
    for _ in range(_BATCHES.value):
      next(batches)
    per_sample_ms[cost] = 1e3 * (time.perf_counter() - start) / (
        _BATCHES.value * BATCH_SIZE)
  rows = [{"requested_ms": c,
           "sequential_ms_per_sample": per_sample_ms[c],
           "delivered_ms": per_sample_ms[c] - per_sample_ms[0.0],
           "delivered_over_requested": ((per_sample_ms[c] - per_sample_ms[0.0])
                                        / c if c else None)}
          for c in costs]
  result = {
      "calibrated_iterations_per_ms": calibrated_rate,
      "single_thread_iterations_per_ms": rate_after,
      "calibration_over_single_thread": calibrated_rate / rate_after,
      "costs": rows,
  }
  text = json.dumps(result, indent=2)
  if _RESULT_JSON.value:
    with open(_RESULT_JSON.value, "w", encoding="utf-8") as f:
      f.write(text)
  print(text)


if __name__ == "__main__":
  app.run(main, argv=sys.argv)
