"""Pipeline stages in PyTorch: is the cost model right, and what does it buy?

  python -m benchmarks.pipeline --quick      # smoke: small_cnn, a minute
  python -m benchmarks.pipeline              # vgg16, resnet50, inception_v3

Four questions, one result file (benchmarks/results/pipeline.json):

  1. cost model, per layer: fitted on one profile (`python -m
     torch_parity.plan`), its prediction of every layer's forward +
     backward at the micro-batch against a second, independent profile:
     the median absolute relative error, of the fits alone and of what
     the planner sums (the first profile's timings, the fits only where
     it has none: the two profiles' repeatability).
  2. cost model, per stage: each stage's predicted time per step (the
     plan's: M micro-batches, M - 1 gradient sums and the optimizer's
     update) against the stage_compute a real pipelined run measured
     (run.json's pipeline section): the median absolute relative error. The update's share of
     both is kept beside them, so that a miss can be told apart: the
     layers' forward and backward, or the update.
  3. auto against even: for both splits, slowest stage over mean stage
     (measured stage_compute) and throughput, measured side by side.
  4. the bubble: GPipe at M = S, 2S, 4S, 8S micro-batches, the measured
     bubble fraction against (S - 1) / (M + S - 1).

and a table in the spirit of the large-image study: per model, the chosen
cuts and every stage's predicted against measured time.

Every trainer run is its own process (`python -m torch_parity.train`, S
stage processes under --strategy=mirrored). The variants run through
`benchmarks.harness`: interleaved, each repeat starting at a different one,
with the host's load recorded; auto against even is the median of the
per-repeat throughput ratios with its interval. Each model is profiled
twice, once per question 1's side.
"""

import argparse
import os
import statistics
import tempfile
import time
from typing import Sequence

from benchmarks import common
from benchmarks import harness
from overlap_core.planning.cost_model import fit_cost_model
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile

NAME = "pipeline"
FULL_MODELS = {"vgg16": 32, "resnet50": 32, "inception_v3": 75}
QUICK_MODELS = {"small_cnn": 8}
# (stages, micro-batch size, measured steps, repeats)
# Five repeats: the fewest whose order-statistics interval of a median
# reaches the harness's 90% (see benchmarks.harness.median_interval).
FULL = (2, 2, 20, 5)
QUICK = (2, 2, 3, 1)
# The cost model's goal on CPU: each stage's predicted time within 15% of
# the measured one (median absolute relative error).
STAGE_ERROR_GOAL = 0.15
BUBBLE_FACTORS_FULL = (1, 2, 4, 8)  # M = factor x S
BUBBLE_FACTORS_QUICK = (1, 2)


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  common.add_common_args(parser, repeats=FULL[3])
  parser.add_argument("--models", default=None,
                      help="model=image_size,... (default: vgg16=32, "
                      "resnet50=32, inception_v3=75; --quick: small_cnn=8)")
  parser.add_argument("--stages", type=int, default=None,
                      help="pipeline stages S (default 2)")
  return parser.parse_args()


def _models(args) -> dict:
  if not args.models:
    return dict(QUICK_MODELS if args.quick else FULL_MODELS)
  return parse_models(args.models)


def parse_models(text: str) -> dict:
  """--models' value, "name=image_size,...", as {name: image_size}."""
  models = {}
  for item in text.split(","):
    name, _, size = item.partition("=")
    if not size.isdigit():
      raise SystemExit(f"--models: {item!r}: allowed: name=image_size")
    models[name] = int(size)
  return models


def plan_model(model: str, image_size: int, *, stages: int, batch: int,
               microbatches: int, out_dir: str, quick: bool,
               planner: str = "torch_parity.plan",
               extra_flags: Sequence[str] = ()) -> dict:
  """Profiles the model with a planning command (`torch_parity.plan` or
  `tfoverlap.plan`, which take the same flags); returns its files.

  `extra_flags` go to the planner as to the trainer that will use the
  profile (a profile records the runtime and threads it was timed on, and
  the trainer refuses it under others)."""
  common.run_process([
      "-m", planner, *extra_flags, f"--model={model}",
      f"--image_size={image_size}", f"--batch_size={batch}",
      # The trainer's own job flags: the plan then times every layer on
      # the threads one stage process gets.
      "--strategy=mirrored", f"--num_devices={stages}",
      f"--pipeline_stages={stages}",
      f"--pipeline_microbatches={microbatches}", "--pipeline_split=auto",
      # The micro-batch and up, never below it: ResNet-50 at 32 px and
      # Inception-V3 at 75 end in 1x1 maps, where BatchNorm cannot train on
      # a batch of one, and the micro-batch here may be 2.
      "--plan_batch_sizes=" + ",".join(
          str(n * (batch // microbatches)) for n in (1, 2, 4)),
      f"--plan_repeats={2 if quick else 5}", f"--plan_output_dir={out_dir}"])
  with open(os.path.join(out_dir, "graph.json"), encoding="utf-8") as f:
    graph = LayerGraph.from_json(f.read())
  with open(os.path.join(out_dir, "profile.json"), encoding="utf-8") as f:
    profile = Profile.from_json(f.read())
  return {"graph": graph, "profile": profile,
          "profile_path": os.path.join(out_dir, "profile.json")}


def layer_errors(fit_on: dict, measured: Profile, microbatch: int, *,
                 planned: bool) -> list:
  """|predicted - measured| / measured per layer, at the micro-batch: the
  model fitted on one profile, checked against another measurement.

  planned=False checks the fits alone (`CostModel.fitted`); True checks
  what the planner sums (`CostModel.predict`: the first profile's own
  timing where it has one), which is the profiles' repeatability.
  """
  model = fit_cost_model([(fit_on["graph"], fit_on["profile"])])
  predict = model.predict if planned else model.fitted
  predicted = {n.name: sum(predict(n, microbatch))
               for n in fit_on["graph"].nodes}
  errors = []
  for name, pred_s in predicted.items():
    timing = measured.timing(name, microbatch)
    if timing and timing.total_s > 0:
      errors.append(abs(pred_s - timing.total_s) / timing.total_s)
  return errors


def run_pipeline(model: str, image_size: int, *, stages: int, batch: int,
                 microbatches: int, split: str, profile_path: str,
                 steps: int, model_dir: str) -> dict:
  """One pipelined trainer run; its throughput and pipeline section."""
  record, stats = common.run_trainer_record(
      [f"--model={model}", "--dataset=synthetic",
       f"--image_size={image_size}", f"--batch_size={batch}",
       f"--train_steps={steps}", "--strategy=mirrored",
       f"--num_devices={stages}", f"--pipeline_stages={stages}",
       f"--pipeline_microbatches={microbatches}",
       "--pipeline_schedule=gpipe", f"--pipeline_split={split}",
       f"--plan_profile={profile_path}"],
      model_dir, module=common.TRAINER_MODULES["pytorch"])
  return {"samples_per_second": record["samples_per_second"],
          "pipeline": record["pipeline"], **stats}


def stage_errors(section: dict) -> list:
  return [abs(r["predicted_ms"] - r["compute_ms"]) / r["compute_ms"]
          for r in section["per_stage"]
          if r["predicted_ms"] is not None and r["compute_ms"]]


def _median_or_none(values: list):
  return None if None in values or not values else common.median(values)


def imbalance(section: dict) -> float:
  """Slowest stage over mean stage, of the measured stage_compute."""
  times = [r["compute_ms"] for r in section["per_stage"]]
  return max(times) / statistics.mean(times)


def variants(models: dict, stages: int, factors) -> list:
  """The sides run in every repeat, (model, split, micro-batches): both
  splits at M = S for every model, and GPipe's bubble at every other M on
  the first model."""
  out = [(m, split, stages) for m in models for split in ("auto", "even")]
  first = next(iter(models))
  out += [(first, "even", f * stages) for f in factors if f != 1]
  return out


def summarize(runs: list, models: dict, stages: int, factors,
              plans: dict, microbatch: int) -> dict:
  """Per model: the cost model's errors and both splits side by side (auto
  over even throughput paired within each repeat); and the bubble."""
  by_side = {}
  for run in runs:
    by_side.setdefault(tuple(run["side"]), []).append(run)
  results = {"models": {}, "bubble": []}
  for model in models:
    fit, other = plans[model]
    row = {"image_size": models[model],
           "layer_error_median": common.median(layer_errors(
               fit, other["profile"], microbatch, planned=False)),
           "layer_error_planned_median": common.median(layer_errors(
               fit, other["profile"], microbatch, planned=True))}
    throughput = {}
    for split in ("auto", "even"):
      done = by_side[(model, split, stages)]
      throughput[split] = harness.values_by_side(
          done, "samples_per_second")[(model, split, stages)]
      row[split] = {
          "samples_per_second": common.median(throughput[split]),
          "slowest_over_mean": harness.median_interval(
              [imbalance(r["pipeline"]) for r in done]),
          "stage_error_median": common.median(
              [e for r in done for e in stage_errors(r["pipeline"])]),
          # One value per repeat (its stages' median error), so that the
          # interval is over independent runs, judged against the goal.
          "stage_error": harness.judge(harness.median_interval(
              [common.median(stage_errors(r["pipeline"])) for r in done]),
              STAGE_ERROR_GOAL),
          "cuts": done[0]["pipeline"]["cut_layers"],
          "per_stage": [{"stage": s["stage"],
                         "predicted_ms": s["predicted_ms"],
                         "measured_ms": common.median(
                             [r["pipeline"]["per_stage"][s["stage"]]
                              ["compute_ms"] for r in done]),
                         "predicted_update_ms": s.get("predicted_update_ms"),
                         "measured_update_ms": _median_or_none(
                             [r["pipeline"]["per_stage"][s["stage"]]
                              .get("update_ms") for r in done])}
                        for s in done[0]["pipeline"]["per_stage"]],
      }
    row["auto_over_even_throughput"] = harness.summarize_ratios(
        throughput["auto"], throughput["even"])
    results["models"][model] = row
  first = next(iter(models))
  for f in factors:
    done = by_side[(first, "even", f * stages)]
    results["bubble"].append({
        "model": first, "stages": stages, "micro_batches": f * stages,
        "theory": done[0]["pipeline"]["bubble_fraction_theory"],
        "measured": harness.median_interval(
            [r["pipeline"]["bubble_fraction"] for r in done])})
  return results


def main():
  args = parse_args()
  models = _models(args)
  stages, microbatch, steps, _ = QUICK if args.quick else FULL
  stages = args.stages or stages
  repeats = common.resolve_repeats(args, FULL[3])
  factors = BUBBLE_FACTORS_QUICK if args.quick else BUBBLE_FACTORS_FULL
  machine = common.describe_machine()  # the load average before the runs
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as work:
    plans = {}
    # Profiling is part of the measurement (question 1 compares two
    # profiles), so the host's load over it is recorded like the runs'.
    before = harness.host_snapshot()
    for model, size in models.items():
      common.log(f"profiling {model} twice")
      plans[model] = [plan_model(model, size, stages=stages,
                                 batch=microbatch * stages,
                                 microbatches=stages, quick=args.quick,
                                 out_dir=os.path.join(work, model, f"p{i}"))
                      for i in (0, 1)]
    profiling_host = harness.host_load(before, harness.host_snapshot())

    def run_side(side, repeat):
      model, split, m = side
      common.log(f"repeat {repeat + 1}/{repeats}: {model} {split} M={m}")
      return {"side": list(side), "repeat": repeat, **run_pipeline(
          model, models[model], stages=stages, batch=microbatch * m,
          microbatches=m, split=split,
          profile_path=plans[model][0]["profile_path"],
          steps=steps + 2,  # the ledger leaves out the first as warm-up
          model_dir=os.path.join(work, "runs", model, split, str(m),
                                 f"r{repeat}"))}

    record = harness.run_interleaved(variants(models, stages, factors),
                                     repeats, run_side,
                                     redo_busy=args.redo_busy)
    results = summarize(record["runs"], models, stages, factors, plans,
                        microbatch)
  payload = {"benchmark": NAME, "machine": machine,
             "command": common.command_line(), "quick": args.quick,
             "repeats": repeats, "stages": stages,
             "microbatch_size": microbatch, "measured_steps": steps,
             "results": results, "runs": record["runs"],
             "total_wall_s": time.perf_counter() - start,
             **harness.payload_fields({"profiling": profiling_host,
                                       "runs": record["host"]})}
  path = common.result_path(NAME, args)
  common.write_results(path, payload)
  print(_tables(results))
  print(f"wrote {path}")


def _tables(results: dict) -> str:
  rows = []
  for model, row in results["models"].items():
    for split in ("auto", "even"):
      side = row[split]
      stage_text = "; ".join(
          f"{s['predicted_ms']:.1f}/{s['measured_ms']:.1f}"
          for s in side["per_stage"] if s["predicted_ms"] is not None)
      rows.append([model, split, ",".join(side["cuts"]), stage_text,
                   harness.format_interval(side["slowest_over_mean"]),
                   side["samples_per_second"], side["stage_error_median"],
                   row["layer_error_median"],
                   row["layer_error_planned_median"]])
    rows.append([model, "auto/even", "", "", "", harness.format_interval(
        row["auto_over_even_throughput"]), "", "", ""])
  table = common.format_table(
      ["model", "split", "cuts", "stage ms pred/meas", "slowest/mean",
       "samples/s", "stage err", "layer err fit", "layer err planned"],
      rows)
  bubble = common.format_table(
      ["model", "S", "M", "theory", "measured"],
      [[b["model"], b["stages"], b["micro_batches"], b["theory"],
        harness.format_interval(b["measured"])]
       for b in results["bubble"]])
  return table + "\n\n" + bubble


if __name__ == "__main__":
  main()
