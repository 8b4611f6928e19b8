"""Each input-pipeline knob, shown to act: one measurement per knob.

  python -m benchmarks.data_knobs            # full run (under ten minutes)
  python -m benchmarks.data_knobs --quick    # smoke run

Two kinds of measurement, each variant interleaved with its rivals inside
every repeat (`benchmarks.harness`: the first variant rotates between repeats):

Through the trainer (small_cnn, synthetic 16x16, batch 64, default strategy,
custom loop; one process per run; the ledger's data-wait share):
  device_resident  --synthetic_on_device against host synthetic batches at no
                   added cost, prefetch off and on: resident batches never
                   wait. The first resident run's compute p50 is C.
  prefetch_depth   --prefetch 0 / 1 / 4 / autotune, and autotune with
                   --prefetch_to_device, at a requested preprocessing cost of
                   C per batch (k = 1 in benchmarks.data_wait).

On the input pipeline alone (the dataset of `make_input_fn`, iterated in
this process, no model):
  map_parallelism  1 / 2 / autotune at 1 ms per sample, prefetch off; and 1
                   with tf.data's map_parallelization rewrite switched off,
                   which is what "1 = sequential" promises.
  prefetch_idle_consumer
                   the wait for a batch after the consumer idled 150 ms (a
                   step running elsewhere): prefetch 0 / 1 / 4 / autotune at
                   1 ms per sample, 0 without a cost map, and 0 with tf.data's
                   map_and_batch_fusion switched off. A short wait means the
                   pipeline worked ahead.
  preprocess_cost  requested ms per sample against the one-thread time it
                   delivers (benchmarks.cost_probe in fresh processes).
  cache            --cache on / off on an image_folder of JPEG files written
                   to a temporary directory (decode dominates): batches
                   after the first epoch.
  shuffle_buffer   0 / 1024: time to the first batch (filling the buffer) and
                   how much of the first batch is the source's first 64
                   samples.
  data_service     off / local (dispatcher and worker in this process), at
                   no cost and at 0.25 ms per sample: the per-batch price of
                   the service's RPCs.

The trainer runs come first so that this process imports TensorFlow only
after them, and never competes with a trainer for the two cores.
"""

import functools
import os
import time

import numpy as np

from benchmarks import common
from benchmarks import harness

NAME = "data_knobs"
DEFAULT_REPEATS = 2
# The host load of each interleaved section, by label, for the results file:
# the sections run one after another, each through `harness`.
HOST_LOAD = {}
TRAINER_FLAGS = ["--model=small_cnn", "--dataset=synthetic",
                 "--image_size=16", "--batch_size=64", "--strategy=default"]
BATCH_SIZE = 64

# Trainer cells: (section, variant, flags; cost given in multiples of C).
RESIDENT_CELLS = {
    "synthetic_on_device": (["--synthetic_on_device"], 0.0),
    "host_prefetch_0": (["--prefetch=0"], 0.0),
    "host_prefetch_autotune": (["--prefetch=autotune"], 0.0),
}
DEPTH_CELLS = {
    "prefetch_0": (["--prefetch=0"], 1.0),
    "prefetch_1": (["--prefetch=1"], 1.0),
    "prefetch_4": (["--prefetch=4"], 1.0),
    "prefetch_autotune": (["--prefetch=autotune"], 1.0),
    "prefetch_autotune_to_device": (["--prefetch=autotune",
                                     "--prefetch_to_device"], 1.0),
}

IMAGE_FOLDER_IMAGES = 256  # 4 batches per epoch
IMAGE_FOLDER_SIDE = 256  # pixels of the stored JPEGs, decoded then resized
IMAGE_FOLDER_CLASSES = 4


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS)
  parser.add_argument("--train_steps", type=int, default=150)
  parser.add_argument("--parts", default="trainer,pipeline",
                      help="Which measurements: trainer, pipeline or both.")
  args = parser.parse_args()
  args.parts = set(p for p in args.parts.split(",") if p)
  if not args.parts or args.parts - {"trainer", "pipeline"}:
    parser.error(f"--parts={','.join(sorted(args.parts))}: allowed: "
                 "trainer, pipeline or both, comma-separated")
  return args


# ---- through the trainer ---------------------------------------------------


def run_trainer_sections(steps: int, repeats: int, scratch: str) -> dict:
  # C first, alone: the depth cells' cost is set from it.
  first = common.run_trainer(
      TRAINER_FLAGS + RESIDENT_CELLS["synthetic_on_device"][0] +
      [f"--train_steps={steps}"], os.path.join(scratch, "calibrate"))
  compute_ms = first["compute"]["p50_ms"]
  common.log(f"C = {compute_ms:.2f} ms compute per step")
  cells = ([("device_resident", v, f, k) for v, (f, k) in
            RESIDENT_CELLS.items()] +
           [("prefetch_depth", v, f, k) for v, (f, k) in DEPTH_CELLS.items()])
  by_variant = {cell[1]: cell for cell in cells}

  def run_one(variant, repeat):
    section, _, flags, k = by_variant[variant]
    cost_ms = k * compute_ms / BATCH_SIZE
    result = common.run_trainer(
        TRAINER_FLAGS + flags + [f"--preprocess_cost_ms={cost_ms:.6f}",
                                 f"--train_steps={steps}"],
        os.path.join(scratch, f"{variant}-{repeat}"))
    common.log(f"trainer repeat {repeat + 1}/{repeats} {variant}: data_wait "
               f"{100 * result['data_wait']['fraction']:.1f}% "
               f"(p50 {result['data_wait']['p50_ms']:.3f} ms), "
               f"{result['samples_per_second']:.0f} samples/s")
    return {"section": section, "variant": variant, "repeat": repeat,
            "preprocess_cost_ms": cost_ms, "result": result}

  record = harness.run_interleaved(list(by_variant), repeats, run_one)
  HOST_LOAD["trainer"] = record["host"]
  runs = record["runs"]
  sections = {}
  for section, variant, _, k in cells:
    results = [r["result"] for r in runs if r["variant"] == variant]
    sections.setdefault(section, []).append({
        "variant": variant,
        "cost_multiple_of_compute": k,
        "preprocess_cost_ms": k * compute_ms / BATCH_SIZE,
        "data_wait_fraction": common.median(
            [r["data_wait"]["fraction"] for r in results]),
        "data_wait_p50_ms": common.median(
            [r["data_wait"]["p50_ms"] for r in results]),
        "compute_p50_ms": common.median(
            [r["compute"]["p50_ms"] for r in results]),
        "step_mean_ms": common.median([r["step"]["mean_ms"]
                                       for r in results]),
        "samples_per_second": common.median(
            [r["samples_per_second"] for r in results]),
    })
  return {"compute_ms": compute_ms, "calibration_run": first,
          "sections": sections, "runs": runs}


# ---- on the pipeline alone -------------------------------------------------


def data_config(**overrides):
  from overlap_core.runtime.config import AUTOTUNE, DataConfig  # pylint: disable=g-import-not-at-top
  defaults = dict(dataset="synthetic", data_dir=None, tfds_name="mnist",
                  image_size=16, num_classes=10, batch_size=BATCH_SIZE,
                  synthetic_on_device=False, prefetch=AUTOTUNE,
                  prefetch_to_device=False, map_parallelism=AUTOTUNE,
                  cache=False, shuffle_buffer=1024, preprocess_cost_ms=0.0,
                  data_service="")
  defaults.update(overrides)
  return DataConfig(**defaults)


def time_pipeline(cfg, *, warmup_batches: int, num_batches: int,
                  sequential_rewrite: bool = True) -> dict:
  """Iterates the training dataset; times the first batch and a stretch.

  Args:
    sequential_rewrite: leave tf.data's default `map_parallelization` on;
      False switches it off on the finished dataset, so that a map built
      without `num_parallel_calls` really runs on one thread.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfoverlap import data  # pylint: disable=g-import-not-at-top
  input_fn = data.make_input_fn(cfg, split="train", task="classification",
                                seed=0)
  start = time.perf_counter()
  ds = input_fn(None)
  if not sequential_rewrite:
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    ds = ds.with_options(options)
  iterator = iter(ds)
  first_batch = next(iterator)
  first_batch_s = time.perf_counter() - start
  for _ in range(warmup_batches):
    next(iterator)
  start = time.perf_counter()
  cpu_start = time.process_time()
  for _ in range(num_batches):
    next(iterator)
  elapsed_s = time.perf_counter() - start
  return {
      "first_batch_s": first_batch_s,
      "ms_per_batch": 1e3 * elapsed_s / num_batches,
      "ms_per_sample": 1e3 * elapsed_s / (num_batches * cfg.batch_size),
      "samples_per_second": num_batches * cfg.batch_size / elapsed_s,
      # CPU of every thread of this process over wall time. TensorFlow's
      # pools spin while they wait, so this counts spinning too: it says how
      # busy the cores looked, not how much work was done.
      "cores_busy": (time.process_time() - cpu_start) / elapsed_s,
      "first_batch": first_batch,
  }


def interleave(variants: dict, repeats: int, measure, label: str) -> dict:
  """Runs measure(variant_value) for every variant in every repeat.

  Returns:
    {variant: [result per repeat]}, without the batches themselves.
  """
  def run_one(name, repeat):
    result = measure(variants[name])
    result.pop("first_batch", None)
    common.log(f"{label} repeat {repeat + 1}/{repeats} {name}: "
               f"{result['ms_per_batch']:.2f} ms/batch")
    return {"name": name, "result": result}

  record = harness.run_interleaved(list(variants), repeats, run_one)
  HOST_LOAD[label] = record["host"]
  results = {name: [] for name in variants}
  for run in record["runs"]:  # in run order, so each list is by repeat
    results[run["name"]].append(run["result"])
  return results


def med(results: list, key: str) -> float:
  return common.median([r[key] for r in results])


def map_parallelism_section(repeats: int, num_batches: int) -> list:
  from overlap_core.runtime.config import AUTOTUNE  # pylint: disable=g-import-not-at-top
  cost_ms = 1.0
  # "1, rewrite off" is what --map_parallelism=1 promises (one thread); the
  # library's "1" leaves tf.data's map_parallelization rewrite on.
  variants = {"1": (1, True), "1, rewrite off": (1, False), "2": (2, True),
              "autotune": (AUTOTUNE, True)}
  results = interleave(
      variants, repeats,
      lambda v: time_pipeline(
          data_config(map_parallelism=v[0], prefetch=0,
                      preprocess_cost_ms=cost_ms),
          warmup_batches=2, num_batches=num_batches,
          sequential_rewrite=v[1]),
      "map_parallelism")
  sequential = med(results["1, rewrite off"], "ms_per_batch")
  return [{"map_parallelism": name, "preprocess_cost_ms": cost_ms,
           "ms_per_batch": med(r, "ms_per_batch"),
           "samples_per_second": med(r, "samples_per_second"),
           "cores_busy": med(r, "cores_busy"),
           "speedup_vs_one_thread": sequential / med(r, "ms_per_batch"),
           "ms_per_batch_all": [x["ms_per_batch"] for x in r]}
          for name, r in results.items()]


def preprocess_cost_section(repeats: int, num_batches: int,
                            scratch: str) -> dict:
  """benchmarks.cost_probe in fresh processes: one calibration each, as
  every trainer process has."""
  probes = []
  for repeat in range(repeats):
    path = os.path.join(scratch, f"cost_probe-{repeat}.json")
    probe, _ = common.run_process_json(
        ["-m", "benchmarks.cost_probe", f"--batches={num_batches}",
         f"--result_json={path}"], path)
    probes.append(probe)
    common.log(f"cost probe {repeat + 1}/{repeats}: calibration "
               f"{probes[-1]['calibration_over_single_thread']:.2f}x the "
               "single-thread rate")
  rows = []
  for index, row in enumerate(probes[0]["costs"]):
    ratios = [p["costs"][index]["delivered_over_requested"] for p in probes]
    rows.append({
        "requested_ms_per_sample": row["requested_ms"],
        "one_thread_ms_per_sample": common.median(
            [p["costs"][index]["sequential_ms_per_sample"] for p in probes]),
        "delivered_ms_per_sample": common.median(
            [p["costs"][index]["delivered_ms"] for p in probes]),
        "delivered_over_requested": (common.median(ratios)
                                     if row["requested_ms"] else None),
        "delivered_over_requested_all": ratios,
    })
  return {
      "rows": rows,
      "calibration_over_single_thread": common.median(
          [p["calibration_over_single_thread"] for p in probes]),
      "calibration_over_single_thread_all": [
          p["calibration_over_single_thread"] for p in probes],
      "probes": probes,
  }


def wait_after_idle(cfg, *, gap_s: float, num_batches: int,
                    fusion: bool = True) -> dict:
  """next() time after the consumer spent gap_s not using the CPU.

  A consumer that sleeps stands for a step running elsewhere: any batch
  work the pipeline does ahead of the request happens during the gap, so
  the wait is short exactly when the pipeline overlaps its consumer.

  Args:
    fusion: leave tf.data's default `map_and_batch_fusion` on; False turns
      it off on the finished dataset.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfoverlap import data  # pylint: disable=g-import-not-at-top
  ds = data.make_input_fn(cfg, split="train", task="classification",
                          seed=0)(None)
  if not fusion:
    options = tf.data.Options()
    options.experimental_optimization.map_and_batch_fusion = False
    ds = ds.with_options(options)
  iterator = iter(ds)
  for _ in range(3):
    next(iterator)
  waits_ms = []
  for _ in range(num_batches):
    time.sleep(gap_s)
    start = time.perf_counter()
    next(iterator)
    waits_ms.append(1e3 * (time.perf_counter() - start))
  return {"ms_per_batch": common.median(waits_ms), "waits_ms": waits_ms}


def prefetch_idle_section(repeats: int, num_batches: int) -> list:
  """Prefetch depth on the pipeline alone, and what --prefetch=0 leaves on."""
  from overlap_core.runtime.config import AUTOTUNE  # pylint: disable=g-import-not-at-top
  cost_ms = 1.0
  gap_s = 0.15  # longer than one batch's cost on 2 threads (about 40 ms)
  variants = {
      "0, no cost map": (0, 0.0, True),
      "0": (0, cost_ms, True),
      "0, map_and_batch_fusion off": (0, cost_ms, False),
      "1": (1, cost_ms, True),
      "4": (4, cost_ms, True),
      "autotune": (AUTOTUNE, cost_ms, True),
  }
  results = interleave(
      variants, repeats,
      lambda v: wait_after_idle(
          data_config(prefetch=v[0], preprocess_cost_ms=v[1]),
          gap_s=gap_s, num_batches=num_batches, fusion=v[2]),
      "prefetch (idle consumer)")
  return [{"prefetch": name, "preprocess_cost_ms": variants[name][1],
           "idle_gap_ms": 1e3 * gap_s,
           "wait_p50_ms": med(r, "ms_per_batch")}
          for name, r in results.items()]


def write_image_folder(root: str) -> None:
  """train/<label>/<n>.jpg: smooth gradients plus noise, so JPEG decoding
  does real work and no two files are alike."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  side = IMAGE_FOLDER_SIDE
  ramp = np.linspace(0, 255, side, dtype=np.float32)
  for index in range(IMAGE_FOLDER_IMAGES):
    label = index % IMAGE_FOLDER_CLASSES
    folder = os.path.join(root, "train", f"class{label}")
    os.makedirs(folder, exist_ok=True)
    base = np.stack([ramp[None, :].repeat(side, 0),
                     ramp[:, None].repeat(side, 1),
                     np.full((side, side), 40.0 * label)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255)
    Image.fromarray(pixels.astype(np.uint8)).save(
        os.path.join(folder, f"{index:04d}.jpg"), quality=90)


def cache_section(repeats: int, later_batches: int, scratch: str) -> list:
  root = os.path.join(scratch, "image_folder")
  write_image_folder(root)
  epoch_batches = IMAGE_FOLDER_IMAGES // BATCH_SIZE

  def measure(cache: bool) -> dict:
    cfg = data_config(dataset="image_folder", data_dir=root, image_size=32,
                      cache=cache)
    from tfoverlap import data  # pylint: disable=g-import-not-at-top
    input_fn = data.make_input_fn(cfg, split="train", task="classification",
                                  seed=0)
    iterator = iter(input_fn(None))
    start = time.perf_counter()
    # The first epoch decodes every file either way (and fills the cache).
    for _ in range(epoch_batches):
      next(iterator)
    first_epoch_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(later_batches):
      next(iterator)
    later_s = time.perf_counter() - start
    return {"first_epoch_ms_per_batch": 1e3 * first_epoch_s / epoch_batches,
            "ms_per_batch": 1e3 * later_s / later_batches}

  results = interleave({"off": False, "on": True}, repeats, measure, "cache")
  off = med(results["off"], "ms_per_batch")
  return [{"cache": name,
           "first_epoch_ms_per_batch": med(r, "first_epoch_ms_per_batch"),
           "later_epochs_ms_per_batch": med(r, "ms_per_batch"),
           "speedup_vs_off": off / med(r, "ms_per_batch"),
           "images": IMAGE_FOLDER_IMAGES,
           "stored_side": IMAGE_FOLDER_SIDE, "image_size": 32}
          for name, r in results.items()]


def shuffle_section(repeats: int, num_batches: int) -> list:
  from tfoverlap import data  # pylint: disable=g-import-not-at-top
  # The source's first batch in file order: fingerprints to recognize.
  plain = data.make_input_fn(data_config(shuffle_buffer=0), split="train",
                             task="classification", seed=0)(None)
  reference = next(iter(plain))[0].numpy()
  fingerprints = {round(float(x), 3) for x in reference.sum(axis=(1, 2, 3))}

  def measure(buffer: int) -> dict:
    result = time_pipeline(data_config(shuffle_buffer=buffer),
                           warmup_batches=2, num_batches=num_batches)
    images = result["first_batch"][0].numpy()
    sums = images.sum(axis=(1, 2, 3))
    result["first_batch_from_first_64"] = float(np.mean(
        [round(float(s), 3) in fingerprints for s in sums]))
    return result

  results = interleave({"0": 0, "1024": 1024}, repeats, measure, "shuffle")
  return [{"shuffle_buffer": int(name),
           "first_batch_ms": 1e3 * med(r, "first_batch_s"),
           "ms_per_batch": med(r, "ms_per_batch"),
           "first_batch_from_first_64": med(r, "first_batch_from_first_64")}
          for name, r in results.items()]


def data_service_section(repeats: int, num_batches: int) -> list:
  from tfoverlap import data  # pylint: disable=g-import-not-at-top
  rows = []
  with data.start_data_service() as service:
    for cost_ms in (0.0, 0.25):
      variants = {"off": "", "local": service.address}
      results = interleave(
          variants, repeats,
          lambda address, c=cost_ms: time_pipeline(
              data_config(data_service=address, preprocess_cost_ms=c),
              warmup_batches=5, num_batches=num_batches),
          f"data_service cost {cost_ms}")
      off = med(results["off"], "ms_per_batch")
      for name, r in results.items():
        rows.append({"data_service": name, "preprocess_cost_ms": cost_ms,
                     "ms_per_batch": med(r, "ms_per_batch"),
                     "overhead_ms_per_batch": med(r, "ms_per_batch") - off,
                     "first_batch_ms": 1e3 * med(r, "first_batch_s")})
  return rows


def run_pipeline_sections(repeats: int, quick: bool, scratch: str) -> dict:
  scale = 4 if quick else 1
  return {
      "map_parallelism": map_parallelism_section(repeats, 24 // scale),
      "prefetch_idle_consumer": prefetch_idle_section(repeats, 16 // scale),
      # Three probes at least: the spread between calibrations is the point.
      "preprocess_cost": preprocess_cost_section(max(3, repeats),
                                                 16 // scale, scratch),
      "cache": cache_section(repeats, 32 // scale, scratch),
      "shuffle_buffer": shuffle_section(repeats, 100 // scale),
      "data_service": data_service_section(repeats, 200 // scale),
  }


# ---- report ----------------------------------------------------------------


def format_report(trainer: dict, pipeline: dict) -> str:
  parts = []
  if trainer:
    parts.append(f"C = {trainer['compute_ms']:.2f} ms compute per step")
  for section, rows in (trainer or {}).get("sections", {}).items():
    parts.append(f"\n{section} (trainer)")
    parts.append(common.format_table(
        ["variant", "cost ms/sample", "data_wait %", "data_wait p50 ms",
         "compute p50 ms", "step ms", "samples/s"],
        [[r["variant"], r["preprocess_cost_ms"],
          100 * r["data_wait_fraction"], r["data_wait_p50_ms"],
          r["compute_p50_ms"], r["step_mean_ms"], r["samples_per_second"]]
         for r in rows]))
  for section, rows in pipeline.items():
    parts.append(f"\n{section} (pipeline alone)")
    if isinstance(rows, dict):  # preprocess_cost: rows plus calibration
      parts.append("calibrated rate / single-thread rate: "
                   f"{rows['calibration_over_single_thread']:.2f} (median)")
      rows = rows["rows"]
    headers = [k for k in rows[0] if not k.endswith("_all")]
    parts.append(common.format_table(
        headers, [["-" if r[h] is None else r[h] for h in headers]
                  for r in rows]))
  return "\n".join(parts)


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  steps = 40 if args.quick else args.train_steps
  start = time.perf_counter()
  trainer = (run_trainer_sections(steps, repeats, scratch)
             if "trainer" in args.parts else None)
  trainer_wall_s = time.perf_counter() - start
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  pipeline = (run_pipeline_sections(repeats, args.quick, scratch)
              if "pipeline" in args.parts else {})
  return harness.Measured(
      fields={"train_steps": steps, "trainer_flags": TRAINER_FLAGS,
              "trainer": trainer, "pipeline": pipeline,
              "trainer_wall_s": trainer_wall_s},
      hosts=HOST_LOAD, num_runs=None)


def main():
  args = parse_args()
  harness.main(
      NAME, args, functools.partial(measure, args),
      default_repeats=DEFAULT_REPEATS,
      table=lambda payload: format_report(payload["trainer"],
                                          payload["pipeline"]))


if __name__ == "__main__":
  main()
