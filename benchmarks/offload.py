"""What CPU offload costs in PyTorch: the large-image study's table, in kind.

  python -m benchmarks.offload --quick           # GPU: about 8 min on one H200
  python -m benchmarks.offload                   # GPU: the full table
  python -m benchmarks.offload --device=cpu --quick   # CPU smoke (mechanics)

For each model, the rows of the OSU large-image study plus its future work,
all offloading saved activations (`--targets` to change):

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
Then the largest batch that fits without and with offload (the `prefetch`
variant), by doubling the batch until CUDA runs out of memory and bisecting
between the last fit and the first failure, one training step each.

The models are the study's where the zoo has them: VGG-16 stands in for
VGG-19 (the zoo has no VGG-19; same shape of network, three convolutions
fewer), ResNet-50, Inception-V3, and Wide-ResNet-50-2 in place of AlexNet
(a model of many wide layers, where the study saw the optimizations help).

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

import argparse
import gc
import os
import statistics
import time

import torch
from torch import nn

from benchmarks import common
from benchmarks import harness
from overlap_core.runtime.config import OffloadConfig
from torch_parity import models, offload

NAME = "offload"
VARIANTS = {
    "baseline": None,
    "naive": {},
    "pinned": {"pin_memory": True},
    "non_blocking": {"non_blocking": True},
    "both": {"pin_memory": True, "non_blocking": True},
    "prefetch": {"pin_memory": True, "non_blocking": True, "prefetch": True},
}
GPU_MODELS = "vgg16,resnet50,inception_v3,wide_resnet50_2"
CPU_MODELS = "small_cnn,resnet18"
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


def parse_args():
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  common.add_common_args(parser, repeats=3)
  parser.add_argument("--device", choices=("auto", "cuda", "cpu"),
                      default="auto")
  parser.add_argument("--models", default=None,
                      help=f"Comma-separated zoo models (GPU default "
                      f"{GPU_MODELS}; CPU default {CPU_MODELS}).")
  parser.add_argument("--targets", default="activations",
                      help="What the offload rows offload: activations, "
                      "parameters, or both comma-separated.")
  parser.add_argument("--image_size", type=int, default=None)
  parser.add_argument("--batch_size", type=int, default=None)
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--max_batch", type=int, default=None,
                      help="Upper bound of the batch search (0 = skip it).")
  return parser.parse_args()


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
  if VARIANTS[variant] is not None:
    knobs = dict(VARIANTS[variant])
    if device.type == "cpu":
      knobs.pop("pin_memory", None)  # the CPU smoke's prefetch row
    offloader = offload.apply_offload(
        model, optimizer, OffloadConfig(targets, **knobs), device)
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


def largest_batch(name, variant, settings, device, targets,
                  cap: int) -> dict:
  """Doubling, then bisection between the last fit and the first OOM."""
  low, high = 0, None
  size = 1
  while size <= cap:
    if _fits(name, variant, size, settings, device, targets):
      low, size = size, size * 2
    else:
      high = size
      break
  if high is None:
    return {"largest_batch": low, "capped_at": cap}
  # To within a sixteenth: each trial is a whole step at a large batch,
  # and the quick run must stay within minutes.
  while high - low > max(1, low // 16):
    middle = (low + high) // 2
    if _fits(name, variant, middle, settings, device, targets):
      low = middle
    else:
      high = middle
  return {"largest_batch": low, "first_oom": high}


def _stat(values):
  return statistics.median(values) if values else None


def summarize(rows: list) -> dict:
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
    result["prefetched_tensors"] = rows[0]["copies"]["prefetched_tensors"]
  return result


def _table(results: dict) -> str:
  headers = ["model", "variant", "total_s", "x_base", "peak_mb",
             "h_MB/step", "h_mean_ms", "h_max", "h_min", "h_median",
             "d_mean_ms", "d_max", "d_min", "d_median"]
  rows = []
  for name, variants in results.items():
    base = variants["baseline"]["total_s"]
    for variant, stats in variants.items():
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


def main():
  args = parse_args()
  device_name = args.device
  if device_name == "auto":
    device_name = "cuda" if torch.cuda.is_available() else "cpu"
  device = torch.device(device_name)
  settings = _settings(args, device_name)
  names = (args.models or (GPU_MODELS if device_name == "cuda"
                           else CPU_MODELS)).split(",")
  targets = tuple(t for t in ("activations", "parameters")
                  if t in args.targets.split(","))
  # Without CUDA there is no pinning: those rows would repeat naive and
  # non_blocking; prefetch runs unpinned.
  variants = [v for v in VARIANTS
              if device_name == "cuda" or v not in ("pinned", "both")]
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

  record = harness.run_interleaved(order, settings["repeats"], run_one)
  for run in record["runs"]:  # in run order, so each list is by repeat
    runs[run["name"]][run["variant"]].append(run["result"])
  results = {n: {v: summarize(runs[n][v]) for v in variants} for n in names}
  for name in names:
    base = results[name]["baseline"]["total_s_per_repeat"]
    for stats in results[name].values():
      stats["ratio_to_baseline"] = harness.summarize_ratios(
          stats["total_s_per_repeat"], base)
  batches = {}
  if device_name == "cuda" and settings["max_batch"]:
    for name in names:
      host_cap = host_batch_cap(results[name]["prefetch"],
                                settings["batch_size"])
      batches[name] = {
          "baseline": largest_batch(name, "baseline", settings, device,
                                    targets, settings["max_batch"]),
          "prefetch": largest_batch(name, "prefetch", settings, device,
                                    targets,
                                    min(settings["max_batch"], host_cap)),
          "host_memory_cap": host_cap}
      common.log(f"largest batch {name}: {batches[name]}")
  payload = {
      "benchmark": NAME, "command": common.command_line(),
      "machine": machine, "device": device_name, "targets": list(targets),
      "settings": settings,
      "skipped": ([] if device_name == "cuda" else
                  ["pinned and both: pinning needs CUDA (prefetch runs "
                   "unpinned)",
                   "largest batch: no device memory to run out of"]),
      "results": results, "largest_batch": batches, "runs": runs,
      "load_average_at_end": list(os.getloadavg()),
  }
  payload.update(harness.payload_fields({"all": record["host"]}))
  path = common.result_path(f"{NAME}_{device_name}", args)
  common.write_results(path, payload)
  print(_table(results))
  if batches:
    for name, found in batches.items():
      print(f"{name}: largest batch {found}")
  print(f"results: {path}")


if __name__ == "__main__":
  main()
