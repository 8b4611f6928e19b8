"""BENCHMARKS.md tables of the stage-parallel runtimes: pipelines and bursts.

Registered into `render_tables.TABLES` on import, like the tables there.
The results files are written by `benchmarks.pipeline`,
`benchmarks.tf_pipeline` and `benchmarks.burst`. Every figure is the
median over the repeats, from the recorded runs, with its spread: the
harness's interval where the repeats allow one, else [min, max].
"""

from benchmarks import common
from benchmarks import harness
from benchmarks import pipeline
from benchmarks.render_tables import DASH, g, load, markdown, pct, spread
from benchmarks.render_tables import table


def _percent(fraction: float) -> str:
  return f"{100 * fraction:.1f}%"


def _points(fraction: float) -> str:
  return f"{100 * fraction:+.1f}"


def _runs(data: dict, side: list) -> list:
  return [r for r in data["runs"] if r["side"] == side]


# ---- PyTorch pipeline stages (benchmarks.pipeline) -------------------------


@table("pipeline_splits")
def pipeline_splits() -> str:
  data = load("pipeline")
  stages = data["stages"]
  rows = []
  for model, row in data["results"]["models"].items():
    for split in ("auto", "even"):
      side = row[split]
      runs = _runs(data, [model, split, stages])
      error = side["stage_error"]
      stage_times = "; ".join(
          f"{g(s['predicted_ms'])} / {g(s['measured_ms'])}"
          for s in side["per_stage"])
      # Files written before the update was timed apart lack the keys.
      update_times = "; ".join(
          f"{g(s.get('predicted_update_ms'))} / "
          f"{g(s.get('measured_update_ms'))}" for s in side["per_stage"])
      rows.append([
          f"`{model}` ({row['image_size']} px)", split,
          ", ".join(f"`{c}`" for c in side["cuts"]), stage_times,
          update_times,
          spread([pipeline.imbalance(r["pipeline"]) for r in runs]),
          spread([r["samples_per_second"] for r in runs]),
          # Per run, the median over its stages, as the benchmark judges it.
          spread([common.median(pipeline.stage_errors(r["pipeline"]))
                  for r in runs], _percent)
          + f": {harness.verdict(error, error['target'])}",
          pct(row["layer_error_median"]),
          # Files written before the planner read profiled times lack it.
          pct(row.get("layer_error_planned_median"))])
  return markdown(
      ["model", "split", "cuts after", "stage ms, predicted / measured",
       "of it the optimizer update, ms", "slowest / mean stage", "samples/s",
       "stage error (goal at most 15%)", "layer error % (median), fit",
       "layer error % (median), as planned"], rows)


@table("pipeline_auto_vs_even")
def pipeline_auto_vs_even() -> str:
  rows = [[f"`{model}`",
           spread(row["auto_over_even_throughput"]["per_repeat"])]
          for model, row in load("pipeline")["results"]["models"].items()]
  return markdown(["model", "auto / even throughput, per-repeat ratio"],
                  rows)


@table("pipeline_bubble")
def pipeline_bubble() -> str:
  data = load("pipeline")
  rows = []
  for b in data["results"]["bubble"]:
    runs = _runs(data, [b["model"], "even", b["micro_batches"]])
    rows.append([f"`{b['model']}`", g(b["stages"]), g(b["micro_batches"]),
                 _percent(b["theory"]),
                 spread([r["pipeline"]["bubble_fraction"] for r in runs],
                         _percent)])
  return markdown(["model", "S", "M", "(S-1)/(M+S-1)", "measured bubble"],
                  rows)


# ---- TensorFlow against PyTorch pipelines (benchmarks.tf_pipeline) ---------


@table("tf_pipeline")
def tf_pipeline() -> str:
  data = load("tf_pipeline")
  rows = []
  # The file's keys are sorted as text ("M=16" before "M=2").
  by_m = sorted((int(key.split("=")[1]), entry)
                for key, entry in data["results"].items())
  # A results file from before the processes runtime has two sides.
  sides = [s for s in ("tensorflow", "tensorflow_processes", "pytorch")
           if s in by_m[0][1]]
  for m, entry in by_m:
    runs = {side: _runs(data, [side, m]) for side in sides}
    row = [g(m)]
    row += [spread([r["samples_per_second"] for r in runs[side]])
            for side in sides]
    row += [spread(entry[f"{side}_over_pytorch"]["per_repeat"])
            if f"{side}_over_pytorch" in entry else DASH
            for side in sides if side != "pytorch"]
    row.append(_percent(entry[sides[0]]["bubble_fraction_theory"]))
    row += [spread([r["bubble_fraction"] for r in runs[side]], _percent)
            for side in sides]
    rows.append(row)
  names = {"tensorflow": "TensorFlow (devices)",
           "tensorflow_processes": "TensorFlow (processes)",
           "pytorch": "PyTorch"}
  return markdown(
      ["micro-batches M"] + [f"{names[s]} samples/s" for s in sides]
      + [f"{names[s]} / PyTorch, per-repeat ratio"
         for s in sides if s != "pytorch"]
      + ["(S-1)/(M+S-1)"] + [f"bubble, {names[s]}" for s in sides], rows)


# ---- a balanced pipeline's bubble (benchmarks.pipeline_bubble) -------------


@table("balanced_bubble")
def balanced_bubble() -> str:
  return _balanced_bubble("pipeline_bubble")


@table("balanced_bubble_tensorflow")
def balanced_bubble_tensorflow() -> str:
  return _balanced_bubble("pipeline_bubble_tensorflow_processes")


@table("balanced_bubble_tensorflow_chained_stamps")
def balanced_bubble_tensorflow_chained_stamps() -> str:
  return _balanced_bubble(
      "pipeline_bubble_tensorflow_processes_chained_stamps")


@table("balanced_bubble_tensorflow_inter_default")
def balanced_bubble_tensorflow_inter_default() -> str:
  return _balanced_bubble(
      "pipeline_bubble_tensorflow_processes_inter_default")


@table("balanced_bubble_larger_microbatch")
def balanced_bubble_larger_microbatch() -> str:
  return _balanced_bubble("pipeline_bubble_resnet50_microbatch8")


def _balanced_bubble(results_name: str) -> str:
  data = load(results_name)
  rows = []
  for row in data["summary"]:
    piped = [r for r in data["runs"]
             if r["cell"] == [row["model"], "pipeline", row["micro_batches"]]]
    sections = [r["result"]["pipeline"] for r in piped]
    parts = row["parts"]
    rows.append([
        f"`{row['model']}`", g(row["micro_batches"]),
        _percent(row["theory"]),
        spread(row["measured_all"], _percent),
        spread(row["points_over_theory_all"], _points),
        harness.format_interval(row["points_from_theory"]),
        row["points_from_theory"]["verdict"],
        " / ".join(_percent(parts[name]) if parts[name] is not None
                   else DASH for name in ("fill_drain", "imbalance",
                                          "transfer", "loss_and_update",
                                          "residual")),
        g(row["slowest_over_mean"]),
        spread([r["result"]["samples_per_second"] for r in piped]),
        g(row["unsplit_samples_per_second"]),
        harness.format_interval(row["pipeline_over_unsplit"]),
        ", ".join(sections[0]["cut_layers"])])
  return markdown(
      ["model", "M", "(S-1)/(M+S-1)", "bubble measured",
       "bubble − theory, points", "|bubble − theory|, per-repeat median "
       "[interval]", "within 5 points",
       "idle parts: fill+drain / imbalance / posting / loss+update / "
       "residual (share of the step)", "slowest / mean stage",
       "pipeline samples/s", "unsplit samples/s",
       "pipeline / unsplit samples/s", "cut after"], rows)


@table("pipeline_memory")
def pipeline_memory_table() -> str:
  data = load("pipeline_memory_overlap")
  rows = [[g(m["stage"]), f"{m['gpipe_bytes'] / 2**20:.2f}",
           f"{m['one_f_one_b_bytes'] / 2**20:.2f}", f"{m['ratio']:.4f}",
           f"{m['bound']:.3f}", m["verdict"]]
          for m in data["summary"]["memory"]]
  return markdown(
      ["stage", "GPipe saved MiB", "1F1B saved MiB", "1F1B / GPipe",
       "goal: at most S/M", "verdict"], rows)


@table("pipeline_overlap")
def pipeline_overlap_table() -> str:
  data = load("pipeline_memory_overlap")
  rows = []
  for variant, entry in data["summary"]["overlap"].items():
    for stage, exposed in enumerate(entry["exposed_comm_ms"]):
      rows.append([f"`--pipeline_overlap_all_reduce={variant}`", g(stage),
                   harness.format_interval(exposed),
                   harness.format_interval(entry["samples_per_second"])])
  ratio = harness.format_interval(
      data["summary"]["overlapped_over_after_step"])
  return markdown(
      ["all-reduce", "stage", "exposed all-reduce ms per step",
       "samples/s"], rows) + (
           f"\n\nOverlapped over after the step, samples/s, per-repeat "
           f"ratio: {ratio}.")


# ---- burst parallelism (benchmarks.burst) ----------------------------------


@table("burst_plans")
def burst_plans() -> str:
  rows = []
  for p in load("burst")["plans"]:
    widths = ", ".join(f"{n} on {w}"
                       for w, n in p["layers_by_width"].items())
    rows.append([f"`{p['model']}`", g(p["limit"]), g(p["iteration_ms"]),
                 g(p["dp_iteration_ms"]), g(p["iteration_vs_dp"]),
                 g(p["gpu_s"]), g(p["dp_gpu_s"]), g(p["gpu_s_vs_dp"]),
                 g(p["amplification"]), widths])
  return markdown(
      ["model", "amplification limit", "iteration ms", "data parallel ms",
       "iteration / DP", "GPU-s", "DP GPU-s", "GPU-s / DP",
       "amplification", "layers on each device count"], rows)


@table("burst_runtime")
def burst_runtime() -> str:
  data = load("burst")
  rows = []
  for name, bg in (("burst", "none"), ("data_parallel", "none"),
                   ("burst", "small_mlp"), ("data_parallel", "small_mlp")):
    runs = _runs(data, [name, bg])
    background = bg != "none"
    rows.append([
        f"`{name}`", f"`{bg}`",
        spread([r["samples_per_second"] for r in runs]),
        spread([r["foreground_slowdown_frac"] for r in runs], _percent)
        if background else DASH,
        spread([r["background_samples_per_second"] for r in runs])
        if background else DASH,
        runs[0]["background_policy"] if background else DASH])
  for bg in ("none", "small_mlp"):
    ratio = data["runtime"][f"burst_over_data_parallel/{bg}"]
    rows.append(["burst / data parallel", f"`{bg}`",
                 spread(ratio["per_repeat"]), DASH, DASH, DASH])
  return markdown(
      ["plan", "background job", "foreground samples/s",
       "foreground slowdown", "background samples/s", "background policy"],
      rows)
