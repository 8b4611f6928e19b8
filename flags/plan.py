"""Flags of the planning commands only (python -m tfoverlap.plan,
python -m torch_parity.plan, and both burst_plan commands).

Not a trainer group: these say how to profile and report, not how to
train, so `define_flags()` of the package leaves them out and the trainers
never see them. `--plan_profile`, which both read, is in the pipeline group.
"""

from absl import flags


def define_flags():
  if "plan_batch_sizes" in flags.FLAGS:
    return
  flags.DEFINE_list(
      "plan_batch_sizes", [],
      "Batch sizes to profile every layer at (default: the micro-batch, "
      "half of it but at least 2, and double it).")
  flags.DEFINE_integer("plan_warmup", 2, "Untimed runs per layer and batch.",
                       lower_bound=0)
  flags.DEFINE_integer("plan_repeats", 5,
                       "Timed runs per layer and batch; medians are kept.",
                       lower_bound=1)
  flags.DEFINE_float(
      "plan_bandwidth_gbps", 0.0,
      "Link bandwidth between stages in GB/s for the transfer cost "
      "(0: communication is free).", lower_bound=0.0)
  flags.DEFINE_string(
      "plan_output_dir", "",
      "Write graph.json, graph.dot, profile.json and plan.txt here.")
  flags.DEFINE_enum(
      "plan_profile_format", "shared",
      ["shared", "per_layer_times", "deeppool"],
      "The format of --plan_profile: shared (overlap_core/planning/"
      "profile.py), per_layer_times (this project's interchange table) or "
      "deeppool (DeepPool's layer time table, with --plan_deeppool_job); "
      "the last two are described in overlap_core/planning/"
      "profile_formats.py and read by both burst_plan commands.")
  flags.DEFINE_string(
      "plan_deeppool_job", "",
      "DeepPool's job description JSON (its layers, their params, "
      "prevLayers and dims): the layer graph to plan with "
      "--plan_profile_format=deeppool, in place of --model's.")
