"""BENCHMARKS.md tables of sections 5-11: the compare showcase, frameworks,
all-reduce, offload, scaling.

Registered into `render_tables.TABLES` on import, like the tables there.
"""

import os
from typing import List, Sequence

from benchmarks import harness
from benchmarks import offload_study
from benchmarks.render_tables import DASH, MissingResults, f3, g, interval
from benchmarks.render_tables import judged, load
from benchmarks.render_tables import markdown, pct, spread, table

# The runs of each framework_parity file and how the document names them:
# labels, not measurements.
PARITY_RUNS = (("framework_parity_rerun", "rerun, quiet", "default"),
               ("framework_parity", "first, shared", "default"),
               ("framework_parity_one_thread", "one thread, shared",
                "1 intra-op, 1 inter-op"))
PHASES = ("data_wait", "compute", "other", "step")


def _range(stats: dict) -> str:
  """median [min, max] of per-repeat ratios: with 3 repeats no interval at
  the harness's confidence exists, so the range is shown as what it is."""
  if not stats or not stats.get("per_repeat"):
    return DASH
  values = stats["per_repeat"]
  return (f"{f3(harness.median_interval(values)['median'])} "
          f"[{f3(min(values))}, {f3(max(values))}]")


# ---- 5. compare showcase ---------------------------------------------------

REPORTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "reports")
# The line of report.md that introduces `findings.combining_rows`' table.
COMBINING_INTRO = "Where combining stops paying"


def report_table(report: str) -> str:
  """The combining table of benchmarks/reports/<report>/report.md, as the
  comparison wrote it: its verdicts are `overlap_compare.findings`' own."""
  path = os.path.join(REPORTS_DIR, report, "report.md")
  if not os.path.exists(path):
    raise MissingResults(f"{path} is missing: run the comparison that "
                         "writes it, or remove its block")
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = next(i for i, line in enumerate(lines)
               if line.startswith(COMBINING_INTRO))
  rows = []
  for line in lines[start + 1:]:
    if line.startswith("|"):
      rows.append(line)
    elif rows:
      break
  return "\n".join(rows)


@table("showcase_small_cnn")
def showcase_small_cnn() -> str:
  return report_table("showcase")


@table("showcase_resnet18")
def showcase_resnet18() -> str:
  return report_table("showcase_resnet18")


# ---- 6. framework_parity -----------------------------------------------


@table("framework_parity")
def framework_parity() -> str:
  rows = []
  for name, label, threads in PARITY_RUNS:
    for preset, s in load(name)["summary"].items():
      fw = s["frameworks"]
      rows.append([label, threads, f"`{preset}`",
                   g(fw["tensorflow"]["samples_per_second_median"]),
                   g(fw["pytorch"]["samples_per_second_median"]),
                   f"**{_range(s['torch_over_tf_samples_per_second'])}**"])
  return markdown(["run", "threads", "preset", "TensorFlow samples/s",
                   "PyTorch samples/s",
                   "PyTorch / TensorFlow, per-repeat median [min, max]"],
                  rows)


@table("framework_parity_phases")
def framework_parity_phases() -> str:
  rows = []
  for preset, s in load(PARITY_RUNS[0][0])["summary"].items():
    for phase in PHASES:
      row = [f"`{preset}`", phase]
      for framework in ("tensorflow", "pytorch"):
        stats = s["frameworks"][framework]["phases"][phase]
        row += [g(stats["p50_ms"]), g(stats["mean_ms"]),
                f"{pct(stats['fraction'])}%"]
      rows.append(row)
  return markdown(["preset", "phase", "TF p50 ms", "TF mean ms", "TF share",
                   "PyTorch p50 ms", "PyTorch mean ms", "PyTorch share"], rows)


@table("framework_parity_other_runs")
def framework_parity_other_runs() -> str:
  rows = []
  for name, label, _ in PARITY_RUNS[1:]:
    for preset, s in load(name)["summary"].items():
      fw = s["frameworks"]
      rows.append([label, f"`{preset}`"] + [
          f"{g(fw['tensorflow']['phases'][p]['p50_ms'])} / "
          f"{g(fw['pytorch']['phases'][p]['p50_ms'])}" for p in PHASES])
  return markdown(["run", "preset", *PHASES], rows)


# ---- 7. torch_trainer_overhead ---------------------------------------------


@table("torch_trainer_overhead")
def torch_trainer_overhead() -> str:
  rows = []
  for name, label in (("torch_trainer_overhead_resnet18_long",
                       "5 repeats, 200 steps, second VM"),
                      ("torch_trainer_overhead_r5_steal",
                       "5 repeats, second VM"),
                      ("torch_trainer_overhead_r5", "5 repeats, quiet"),
                      ("torch_trainer_overhead", "3 repeats, shared")):
    for preset, s in load(name)["summary"].items():
      p50, mean = s["time_ratio"]["p50"], s["time_ratio"]["mean"]
      target = 1.0 + s["target"]["max_overhead_frac"]
      rows.append([
          label, f"`{preset}`",
          g(s["sides"]["plain_loop"]["step_p50_ms_median"]),
          g(s["sides"]["torch_parity"]["step_p50_ms_median"]),
          f3(p50["time_ratio_of_medians"]), interval(p50["per_repeat"]),
          f3(p50["time_ratio_of_best_repeats"]),
          f3(mean["time_ratio_of_medians"]),
          judged(p50["per_repeat"], target)])
  return markdown(
      ["run", "preset", "plain step p50 ms", "trainer step p50 ms",
       "time ratio of medians (p50)",
       "per-repeat ratio: median [interval] (coverage)",
       "best-of-repeats ratio", "time ratio of medians (mean step)",
       "target ≤ 1.02"], rows)


# ---- 8. all_reduce_pack -------------------------------------------------


def _all_reduce(name: str) -> str:
  data = load(name)
  reference = f"{data['reference_pack_mb']:g}"
  rows: List[Sequence[str]] = []
  for side, by_pack in data["summary"].items():
    # Results files keep keys sorted as text ("1", "100", "25").
    for pack, e in sorted(by_pack.items(), key=lambda kv: float(kv[0])):
      rows.append([
          {"ddp": "DDP", "horovod": "Horovod", "mwms": "MWMS"}.get(side, side),
          pack, g(e["samples_per_second_median"]),
          g(e["step_p50_ms_median"]),
          "1" if pack == reference else _range(e["vs_reference_pack"]),
          _range(e.get("vs_ddp_same_pack")) if side != "ddp" else DASH])
  return markdown(["side", "X (MB)", "samples/s", "step p50 ms",
                   f"vs {reference} MB, same side", "vs DDP, same X"], rows)


@table("all_reduce_pack_rerun")
def all_reduce_pack_rerun() -> str:
  return _all_reduce("all_reduce_pack_rerun")


@table("all_reduce_pack")
def all_reduce_pack() -> str:
  return _all_reduce("all_reduce_pack")


# ---- 9. offload -------------------------------------------------------------

# The results file of the `offload_h200` table: the quick run until the
# full one (`python -m benchmarks.offload`) has run on a GPU.
OFFLOAD_RUN = "offload_h200_quick_r3"
# The results files of the batch search, in the order the document lists
# them; one with an empty `largest_batch` shows as not searched.
OFFLOAD_BATCH_RUNS = (OFFLOAD_RUN, "offload_h200_resnet50_batch")


def _copy_ms(stats: dict) -> str:
  """mean / max / min / median of one copy, each the median over repeats."""
  if not stats or stats.get("median") is None:
    return DASH
  return " / ".join(f"{stats[k]:.3f}" for k in ("mean", "max", "min",
                                                  "median"))


def _copied(stats: dict) -> str:
  if not stats:
    return DASH
  return f"{stats['tensors_per_step']:.0f} · {stats['mb_per_step']:.0f}"


def _prefetched_per_step(s: dict, num_steps: int) -> str:
  """Per step, as `tensors_per_step`; older files kept only the count over
  all measured steps."""
  if "to_host" not in s:
    return DASH
  per_step = s.get("prefetched_tensors_per_step",
                   s["prefetched_tensors"] / num_steps)
  return f"{per_step:.0f}"


def offload_rows(data: dict) -> list:
  """One row per model and variant, in the study's order."""
  rows = []
  results, num_steps = data["results"], data["settings"]["steps"]
  for model in offload_study.model_order(results):
    variants = results[model]
    base = variants["baseline"]["total_s_per_repeat"]
    for variant in offload_study.variant_order(variants):
      s = variants[variant]
      ratios = harness.paired_ratios(s["total_s_per_repeat"], base)
      rows.append([
          model, variant, f"{s['total_s']:.3f}",
          f"{harness.median_interval(ratios)['median']:.2f} "
          f"({min(ratios):.2f}–{max(ratios):.2f})",
          f"{s['peak_device_mb']:.0f}",
          _copied(s.get("to_host")), _copy_ms(s.get("to_host")),
          _copied(s.get("to_device")), _copy_ms(s.get("to_device")),
          _prefetched_per_step(s, num_steps)])
  return rows


def offload_table(name: str) -> str:
  data = load(name)
  settings = data["settings"]
  return markdown(
      ["model", "variant",
       f"total s of {settings['steps']} steps, median of "
       f"{settings['repeats']} repeats",
       "step time ratio to baseline, median (min–max of paired repeats)",
       "peak GPU MB", "to host: tensors · MB per step",
       "one copy to host, ms: mean / max / min / median",
       "to device: tensors · MB per step",
       "one copy to device, ms: mean / max / min / median",
       "tensors prefetched per step"], offload_rows(data))


@table("offload_h200")
def offload_h200() -> str:
  return offload_table(OFFLOAD_RUN)


def offload_batch_rows(name: str) -> list:
  """The largest-batch search of one results file: a row per model, or
  one row saying it was not searched."""
  data = load(name)
  settings = data["settings"]
  found = data["largest_batch"]
  where = f"`{name}.json` ({settings['image_size']}×{settings['image_size']})"
  if not found:
    return [[where, DASH, f"not searched (--max_batch="
             f"{settings['max_batch']})", DASH, DASH, DASH]]
  rows = []
  for model in offload_study.model_order(found):
    searches = found[model]
    # Files from before the search ran `both` searched with `prefetch`.
    with_offload = next(v for v in (offload_study.WITH_OFFLOAD, "prefetch")
                        if v in searches)
    rows.append([
        where, model,
        offload_study.describe_largest_batch(
            searches[offload_study.WITHOUT_OFFLOAD]),
        f"`{with_offload}`",
        offload_study.describe_largest_batch(searches[with_offload]),
        str(searches.get("host_memory_cap", DASH))])
  return rows


@table("offload_h200_batch")
def offload_h200_batch() -> str:
  rows = [row for name in OFFLOAD_BATCH_RUNS
          for row in offload_batch_rows(name)]
  return markdown(["results file (image side)", "model",
                   "largest batch without offload (`baseline`)",
                   "offload variant searched",
                   "largest batch with offload",
                   "host-memory cap of the offload search"], rows)


# ---- 10. all_reduce_sizes -------------------------------------------------

SIDE_NAMES = {"tf_ring": "TensorFlow ring", "torch_gloo": "torch gloo",
              "horovod_gloo": "Horovod gloo", "torch_nccl": "torch NCCL"}


def _bytes(size: int) -> str:
  for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
    if size >= scale:
      return f"{size // scale} {unit}"
  return f"{size} B"


@table("all_reduce_sizes")
def all_reduce_sizes() -> str:
  data = load("all_reduce_sizes")
  sides, reference = data["sides"], data["reference_side"]
  others = [s for s in sides if s != reference]
  rows = []
  for size in data["sizes_bytes"]:
    entries = {s: data["summary"][s][str(size)] for s in sides}
    rows.append(
        [_bytes(size)]
        + [spread([1e6 * t for t in e["time_s_per_repeat"]])
           for e in entries.values()]
        + [g(entries[s]["busbw_gb_s"]) for s in sides]
        + [spread(entries[s]["time_over_reference"]["per_repeat"], f3)
           for s in others])
  return markdown(
      ["message"] + [f"{SIDE_NAMES[s]} µs" for s in sides]
      + [f"{SIDE_NAMES[s]} bus GB/s" for s in sides]
      + [f"{SIDE_NAMES[s]} / {SIDE_NAMES[reference]} time" for s in others],
      rows)


# ---- 11. scaling -----------------------------------------------------------


@table("scaling")
def scaling() -> str:
  rows = []
  for name, entry in load("scaling")["summary"].items():
    model, stack = name.split("/")
    throughput = entry["samples_per_second"]
    efficiency = entry.get("efficiency")
    rows.append([f"`{model}`", stack,
                 spread(throughput.get("1", {}).get("per_repeat", [])),
                 spread(throughput.get("2", {}).get("per_repeat", [])),
                 spread(efficiency["per_repeat"], f3) if efficiency
                 else DASH])
  return markdown(["model", "stack", "samples/s, 1 worker",
                   "samples/s, 2 workers",
                   "efficiency: throughput(2) / (2 × throughput(1)), "
                   "per-repeat"], rows)
