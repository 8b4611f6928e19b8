"""What CPU offload costs in PyTorch: the large-image study's table, in kind.

  python -m benchmarks.offload --quick           # GPU: about 8 min on one H200
  python -m benchmarks.offload                   # GPU: the full table
  python -m benchmarks.offload --device=cpu --quick   # CPU smoke (mechanics)

For each model, the rows of the OSU large-image study plus its future work,
in the study's order, all offloading saved activations (`--targets` to
change; `--modes` runs fewer rows, the baseline always among them):

  baseline       everything on the device
  naive          offload, pageable host memory, blocking copies
  pinned         --offload_pin_memory
  non_blocking   --offload_non_blocking (into pageable memory)
  both           pinned and non-blocking
  prefetch       both, plus the next layer's tensors fetched back on a
                 side stream while the current layer computes

Columns: total time of the measured steps, its ratio to the baseline, peak
device memory, and per direction (to_host, to_device) the tensors, MB and
the mean, max, min and median time of one copy (CUDA events on a GPU).
Then the largest batch that fits without offload (baseline) and with it
(`both`: pinned and non-blocking; not `prefetch`, which holds restored
tensors ahead of use), by doubling the batch until CUDA runs out of memory
and bisecting between the last fit and the first failure, one training
step each. A search that reaches its cap (`--max_batch`, or what the
host's memory holds) records that the limit was not found.

The models are the study's: VGG-19, ResNet-50, Inception-V3, and
Wide-ResNet-50-2 in place of AlexNet (a model of few, wide layers, where
the study saw the optimizations help); see `benchmarks.offload_study`.

It runs in one process, the offload hooks applied exactly as the trainer's
`parallelize` applies them (`torch_parity.offload.apply_offload`), on
resident synthetic batches, so the table holds the offload's cost and no
input pipeline. Repeats are interleaved: every variant of every model runs
once per repeat, through `benchmarks.harness` (the first one rotating
between repeats; ratios to the baseline with their interval). On the CPU the
copies are CPU to CPU: the smoke run checks that every row runs, its
numbers say nothing about a GPU; pinned rows are skipped there (pinning
needs CUDA) and the batch search too (there is no device memory to run
out of).
"""

import gc
import os
import statistics
import time

import torch
from torch import nn

from benchmarks import common
from benchmarks import harness
from benchmarks import offload_study
from benchmarks.offload_study import VARIANTS, WITH_OFFLOAD, WITHOUT_OFFLOAD
from overlap_core.runtime import zoo
from overlap_core.runtime.config import OffloadConfig
from torch_parity import models, offload

NAME = "offload"
TARGETS = ("activations", "parameters")
NUM_CLASSES = 10
# Offloaded activations all sit in host memory at once (end of forward).
# Past the host's memory the kernel kills the process, which no except
# clause catches, so the offload search stays under this share of it.
HOST_MEMORY_SHARE = 0.5
# (image size, batch, measured steps, warm-up steps, repeats, batch cap)
SETTINGS = {
    ("cuda", False): (224, 32, 20, 3, 3, 4096),
    ("cuda", True): (96, 32, 6, 2, 1, 4096),
    ("cpu", False): (32, 8, 4, 1, 2, 0),
    ("cpu", True): (32, 4, 2, 1, 1, 0),
}


def parse_args(argv=None):
  parser = common.make_parser(__doc__, repeats=3)
  parser.add_argument("--device", choices=("auto", "cuda", "cpu"),
                      default="auto",
                      help="Where the models train: auto takes CUDA when "
                      "there is a GPU (default auto).")
  parser.add_argument("--models", default=None,
                      help="Comma-separated zoo models (GPU default "
                      f"{','.join(offload_study.GPU_MODELS)}; CPU default "
                      f"{','.join(offload_study.CPU_MODELS)}).")
  parser.add_argument("--modes", default=",".join(VARIANTS),
                      help="Comma-separated rows to run, baseline among "
                      "them (every ratio is to it); allowed: "
                      f"{', '.join(VARIANTS)} (default all).")
  parser.add_argument("--targets", default="activations",
                      help="What the offload rows offload: activations, "
                      "parameters, or both comma-separated (default "
                      "activations).")
  parser.add_argument("--image_size", type=int, default=None,
                      help="Input side in pixels (default 224 on a GPU, 96 "
                      "with --quick, 32 on the CPU).")
  parser.add_argument("--batch_size", type=int, default=None,
                      help="Batch of the timed steps (default 32 on a GPU, "
                      "8 or 4 on the CPU).")
  parser.add_argument("--steps", type=int, default=None,
                      help="Measured steps per variant and repeat, after "
                      "the warm-up (default 20 on a GPU, 6 with --quick).")
  parser.add_argument("--max_batch", type=int, default=None,
                      help="Cap of the largest-batch search; a search that "
                      "reaches it records the limit as not found (default "
                      "4096 on a GPU; 0 skips the search).")
  args = parser.parse_args(argv)
  if args.models is not None:
    unknown = [m for m in args.models.split(",") if m not in zoo.MODEL_NAMES]
    if unknown:
      parser.error(f"--models={args.models}: unknown {unknown}; allowed: "
                   f"{', '.join(zoo.MODEL_NAMES)}")
  modes = args.modes.split(",")
  if not set(modes) <= set(VARIANTS) or WITHOUT_OFFLOAD not in modes:
    parser.error(f"--modes={args.modes}: allowed: {', '.join(VARIANTS)}, "
                 f"comma-separated, {WITHOUT_OFFLOAD} among them")
  if args.device == "auto":
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
  if (args.device == "cuda" and args.max_batch != 0
      and WITH_OFFLOAD not in modes):
    # Its host-memory cap comes from the bytes that row offloaded.
    parser.error(f"--modes={args.modes}: the largest-batch search needs "
                 f"{WITH_OFFLOAD}; add it, or pass --max_batch=0")
  args.modes = [v for v in VARIANTS if v in modes]  # the study's order
  targets = args.targets.split(",")
  if not targets or not set(targets) <= set(TARGETS):
    parser.error(f"--targets={args.targets}: allowed: "
                 f"{', '.join(TARGETS)}, comma-separated")
  for name in ("image_size", "batch_size", "steps"):
    value = getattr(args, name)
    if value is not None and value < 1:
      parser.error(f"--{name}={value}: allowed: at least 1")
  if args.max_batch is not None and args.max_batch < 0:
    parser.error(f"--max_batch={args.max_batch}: allowed: 0 (no search) "
                 "or more")
  return args


def offload_settings(variant: str, targets, device_type: str):
  """The `OffloadConfig` of one row, None for the baseline.

  On the CPU there is no pinned memory; only the CPU smoke's prefetch row
  asks for it there, and runs unpinned.
  """
  if VARIANTS[variant] is None:
    return None
  knobs = dict(VARIANTS[variant])
  if device_type == "cpu":
    knobs.pop("pin_memory", None)
  return OffloadConfig(tuple(targets), **knobs)


def _settings(args, device: str) -> dict:
  image, batch, steps, warmup, repeats, cap = SETTINGS[(device, args.quick)]
  return {"image_size": args.image_size or image,
          "batch_size": args.batch_size or batch,
          "steps": args.steps or steps, "warmup_steps": warmup,
          "repeats": common.resolve_repeats(args, repeats),
          "max_batch": cap if args.max_batch is None else args.max_batch}


def _sync(device):
  if device.type == "cuda":
    torch.cuda.synchronize(device)


def _build(name, image_size, device, variant, targets):
  torch.manual_seed(0)
  model = models.build_model(name, image_size=image_size,
                             num_classes=NUM_CLASSES).to(device)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
  offloader = None
  config = offload_settings(variant, targets, device.type)
  if config is not None:
    offloader = offload.apply_offload(model, optimizer, config, device)
  return model, optimizer, offloader


def _step(model, optimizer, images, labels):
  optimizer.zero_grad()
  loss = nn.functional.cross_entropy(model(images), labels)
  loss.backward()
  optimizer.step()


def _batch(batch_size, image_size, device):
  generator = torch.Generator().manual_seed(1)
  images = torch.randn(batch_size, 3, image_size, image_size,
                       generator=generator).to(device)
  labels = torch.randint(0, NUM_CLASSES, (batch_size,),
                         generator=generator).to(device)
  return images, labels


def _free(device):
  gc.collect()
  if device.type == "cuda":
    torch.cuda.empty_cache()


def run_variant(name, variant, settings, device, targets) -> dict:
  """Trains warm-up + measured steps; the row's numbers."""
  model, optimizer, offloader = _build(name, settings["image_size"], device,
                                       variant, targets)
  images, labels = _batch(settings["batch_size"], settings["image_size"],
                          device)
  for _ in range(settings["warmup_steps"]):
    _step(model, optimizer, images, labels)
  _sync(device)
  if offloader is not None:
    offloader.copier.resolve_timings()
    offloader.stats.reset()  # count the measured steps only
  if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats(device)
  start = time.perf_counter()
  for _ in range(settings["steps"]):
    _step(model, optimizer, images, labels)
  _sync(device)
  row = {"total_s": time.perf_counter() - start,
         "peak_device_mb": (torch.cuda.max_memory_allocated(device) / 2**20
                            if device.type == "cuda" else None)}
  if offloader is not None:
    row["copies"] = offloader.summary(num_steps=settings["steps"])
    offloader.remove()
  del model, optimizer, offloader, images, labels
  _free(device)
  return row


def _fits(name, variant, batch_size, settings, device, targets) -> bool:
  try:
    model, optimizer, offloader = _build(name, settings["image_size"],
                                         device, variant, targets)
    images, labels = _batch(batch_size, settings["image_size"], device)
    _step(model, optimizer, images, labels)
    _sync(device)
    if offloader is not None:
      offloader.remove()
    return True
  except torch.cuda.OutOfMemoryError:
    return False
  except RuntimeError as error:  # a failed pinned host allocation
    if "out of memory" not in str(error):
      raise
    return False
  finally:
    model = optimizer = offloader = images = labels = None
    _free(device)


def _host_available_bytes() -> float:
  try:
    with open("/proc/meminfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return float("inf")


def host_batch_cap(stats: dict, batch_size: int) -> int:
  """The largest batch whose offloaded bytes fit HOST_MEMORY_SHARE of the
  host's available memory, from one measured step's bytes to the host."""
  bytes_per_sample = stats["to_host"]["mb_per_step"] * 2**20 / batch_size
  if not bytes_per_sample:
    return 2**31
  return int(HOST_MEMORY_SHARE * _host_available_bytes() / bytes_per_sample)


def largest_batch(name, variant, settings, device, targets, cap: int,
                  cap_reason: str) -> dict:
  """`offload_study.search_largest_batch` with one training step a trial."""
  return offload_study.search_largest_batch(
      lambda size: _fits(name, variant, size, settings, device, targets),
      cap, cap_reason)


def search_batches(name, stats, settings, device, targets) -> dict:
  """The largest batch without offload and with it, for one model.

  The offload search is capped as well by what the host's memory holds at
  the offloaded bytes `stats` (the model's WITH_OFFLOAD row) measured.
  """
  host_cap = host_batch_cap(stats[WITH_OFFLOAD], settings["batch_size"])
  cap = settings["max_batch"]
  offload_cap, reason = ((cap, "max_batch") if cap <= host_cap
                         else (host_cap, "host_memory"))
  return {
      WITHOUT_OFFLOAD: largest_batch(name, WITHOUT_OFFLOAD, settings,
                                     device, targets, cap, "max_batch"),
      WITH_OFFLOAD: largest_batch(name, WITH_OFFLOAD, settings, device,
                                  targets, offload_cap, reason),
      "host_memory_cap": host_cap}


def _stat(values):
  return statistics.median(values) if values else None


def summarize(rows: list, num_steps: int) -> dict:
  """Median over repeats of the total, and of each copy statistic."""
  result = {"total_s": _stat([r["total_s"] for r in rows]),
            "total_s_per_repeat": [r["total_s"] for r in rows],
            "peak_device_mb": rows[0]["peak_device_mb"]}
  if "copies" in rows[0]:
    for direction in ("to_host", "to_device"):
      first = rows[0]["copies"][direction]
      timed = [r["copies"][direction]["copy_ms"] for r in rows
               if r["copies"][direction]["copy_ms"]]
      result[direction] = {
          "tensors_per_step": first["tensors_per_step"],
          "mb_per_step": first["mb_per_step"],
          **{k: _stat([t[k] for t in timed])
             for k in ("mean", "max", "min", "median")}}
    # The count is over all measured steps; per step it compares with
    # tensors_per_step.
    prefetched = rows[0]["copies"]["prefetched_tensors"]
    result["prefetched_tensors"] = prefetched
    result["prefetched_tensors_per_step"] = prefetched / num_steps
  return result


def _table(results: dict) -> str:
  headers = ["model", "variant", "total_s", "x_base", "peak_mb",
             "h_MB/step", "h_mean_ms", "h_max", "h_min", "h_median",
             "d_mean_ms", "d_max", "d_min", "d_median"]
  rows = []
  for name in offload_study.model_order(results):
    variants = results[name]
    base = variants["baseline"]["total_s"]
    for variant in offload_study.variant_order(variants):
      stats = variants[variant]
      host, dev = stats.get("to_host", {}), stats.get("to_device", {})
      rows.append([name, variant, stats["total_s"],
                   stats["total_s"] / base if base else "",
                   stats["peak_device_mb"] or "-",
                   host.get("mb_per_step", "-"),
                   *(host.get(k) or "-" for k in
                     ("mean", "max", "min", "median")),
                   *(dev.get(k) or "-" for k in
                     ("mean", "max", "min", "median"))])
  return common.format_table(headers, rows)


def skipped(device_name: str, variants: list, needs_pinning: list,
            max_batch: int) -> list:
  """What a run leaves out of the table, and why."""
  if device_name == "cuda":
    return [] if max_batch else ["largest batch: --max_batch=0"]
  lines = []
  if needs_pinning:
    unpinned = (" (prefetch runs unpinned)" if "prefetch" in variants
                else "")
    lines.append(f"{' and '.join(needs_pinning)}: pinning needs "
                 f"CUDA{unpinned}")
  return lines + ["largest batch: no device memory to run out of"]


def main():
  args = parse_args()
  device_name = args.device  # auto resolved by parse_args
  device = torch.device(device_name)
  settings = _settings(args, device_name)
  names = (args.models.split(",") if args.models else list(
      offload_study.GPU_MODELS if device_name == "cuda"
      else offload_study.CPU_MODELS))
  targets = tuple(t for t in TARGETS if t in args.targets.split(","))
  # Without CUDA there is no pinning: those rows would repeat naive and
  # non_blocking; prefetch runs unpinned.
  variants = [v for v in args.modes
              if device_name == "cuda" or v not in ("pinned", "both")]
  needs_pinning = [v for v in args.modes if v not in variants]
  machine = common.describe_machine()
  if device_name == "cuda":
    machine["gpu"] = torch.cuda.get_device_name(device)
  runs = {n: {v: [] for v in variants} for n in names}
  order = [(n, v) for n in names for v in variants]
  def run_one(cell, repeat):
    name, variant = cell
    common.log(f"repeat {repeat + 1}: {name} {variant}")
    return {"name": name, "variant": variant, "repeat": repeat,
            "result": run_variant(name, variant, settings, device, targets)}

  record = harness.run_interleaved(order, settings["repeats"], run_one,
                                  redo_busy=args.redo_busy)
  for run in record["runs"]:  # in run order, so each list is by repeat
    runs[run["name"]][run["variant"]].append(run["result"])
  results = {n: {v: summarize(runs[n][v], settings["steps"])
                 for v in variants} for n in names}
  for name in names:
    base = results[name]["baseline"]["total_s_per_repeat"]
    for stats in results[name].values():
      stats["ratio_to_baseline"] = harness.summarize_ratios(
          stats["total_s_per_repeat"], base)
  batches = {}
  if device_name == "cuda" and settings["max_batch"]:
    for name in names:
      batches[name] = search_batches(name, results[name], settings, device,
                                     targets)
      common.log(f"largest batch {name}: {batches[name]}")
  payload = {
      "benchmark": NAME, "command": common.command_line(),
      "machine": machine, "device": device_name, "targets": list(targets),
      "settings": settings, "models": names, "variants": variants,
      "batch_search_variants": [WITHOUT_OFFLOAD, WITH_OFFLOAD],
      "skipped": skipped(device_name, variants, needs_pinning,
                         settings["max_batch"]),
      "results": results, "largest_batch": batches, "runs": runs,
      "load_average_at_end": list(os.getloadavg()),
  }
  payload.update(harness.payload_fields({"all": record["host"]}))
  path = common.result_path(f"{NAME}_{device_name}", args)
  common.write_results(path, payload)
  print(_table(results))
  for name, found in batches.items():
    print(f"{name}: largest batch without offload "
          f"{offload_study.describe_largest_batch(found[WITHOUT_OFFLOAD])}; "
          f"with offload ({WITH_OFFLOAD}) "
          f"{offload_study.describe_largest_batch(found[WITH_OFFLOAD])}")
  print(f"results: {path}")


if __name__ == "__main__":
  main()
