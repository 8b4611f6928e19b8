"""python -m torch_parity.burst_plan: plan burst-parallel layers offline.

Reads the model's layer graph (torch.fx), profiles every layer forward and
backward at the per-device batches the candidate widths give (or reads
--plan_profile, in the shared schema or, with
--plan_profile_format=per_layer_times, this project's interchange table),
and gives every layer its own number of devices within
--amplification_limit (see overlap_core/planning/burst.py). Prints the
plan's table with its predicted iteration time and GPU-seconds against data
parallelism.

  python -m torch_parity.burst_plan --model=vgg16 --image_size=32 \\
      --batch_size=32 --strategy=mirrored --num_devices=4 \\
      --amplification_limit=2 --plan_bandwidth_gbps=10 \\
      --plan_output_dir=plan/

The devices are the run's replicas (--num_workers, times --num_devices
under mirrored); the global batch is --batch_size. With --plan_output_dir it
writes graph.json, profile.json, burst_plan.json (what --burst_parallel
reads) and burst_plan.txt, and prints the command that draws
burst_scaling.png (each layer's time against its device count; needs
matplotlib). Nothing is trained.

With --plan_profile_format=deeppool the graph and the times are DeepPool's
(overlap_core/planning/profile_formats.py): --plan_deeppool_job is its job
description, --plan_profile its layer time table, and no model is built or
timed, so the plan can be set beside DeepPool's own for the same numbers:

  python -m torch_parity.burst_plan --plan_profile_format=deeppool \\
      --plan_deeppool_job=vgg16.json --plan_profile=A100_vgg.prof \\
      --batch_size=64 --strategy=mirrored --num_devices=8 \\
      --amplification_limit=2 --plan_bandwidth_gbps=10
"""

import os
import sys

from absl import app

import flags as tfo_flags
from flags import plan as plan_flags
from overlap_core.runtime import host_allocator

tfo_flags.define_flags()
plan_flags.define_flags()
PROGRAM = "torch_parity.burst_plan"


def _read_profile(path: str, fmt: str):
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import profile as profile_lib
  from overlap_core.planning import profile_formats
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    if fmt == "per_layer_times":
      return profile_formats.read_per_layer_times(text)
    return profile_lib.Profile.from_json(text)
  except (OSError, ValueError, KeyError, TypeError) as e:
    tfo_flags.exit_with_usage_error(f"--plan_profile={path}: {e}")


def _read_text(flag: str, path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    tfo_flags.exit_with_usage_error(f"--{flag}={path}: {e}")


def _read_deeppool(values):
  """DeepPool's graph and times; no model is built, nothing is timed."""
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import deeppool_format
  job, table = values.plan_deeppool_job, values.plan_profile
  if not job or not table:
    tfo_flags.exit_with_usage_error(
        f"--plan_profile_format=deeppool with --plan_deeppool_job={job!r} "
        f"and --plan_profile={table!r}: needs both, DeepPool's job "
        "description JSON and its layer time table")
  try:
    return deeppool_format.read_deeppool(
        _read_text("plan_deeppool_job", job),
        _read_text("plan_profile", table),
        model=os.path.splitext(os.path.basename(job))[0])
  except ValueError as e:
    tfo_flags.exit_with_usage_error(
        f"--plan_deeppool_job={job} --plan_profile={table}: {e}")


def _measure(config, values, batches):
  """The model's graph, and its profile (measured, or --plan_profile)."""
  # pylint: disable=g-import-not-at-top
  import torch
  from torch_parity.models import build_model
  from torch_parity.planning.graph import build_layer_graph
  from torch_parity.planning.profiler import profile_layers

  torch.manual_seed(config.run.seed)
  model = build_model(config.model.name, image_size=config.data.image_size,
                      num_classes=config.data.num_classes)
  side = config.data.image_size // (2 if config.model.name == "edsr" else 1)

  def make_input(b):
    return torch.randn(b, 3, side, side)

  graph = build_layer_graph(model, make_input(batches[0]),
                            name=config.model.name)
  if values.plan_profile:
    return graph, _read_profile(values.plan_profile,
                                values.plan_profile_format)
  device = "cuda:0" if torch.cuda.is_available() else "cpu"
  return graph, profile_layers(model, make_input, device=device,
                               batch_sizes=batches,
                               warmup=values.plan_warmup,
                               repeats=values.plan_repeats,
                               name=config.model.name)


def main(argv):
  del argv
  values = tfo_flags.FLAGS
  config = tfo_flags.to_config(values)
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import command
  from overlap_core.runtime.config import ConfigError
  try:
    command.check_plannable(config, "pytorch", burst=True)
  except ConfigError as e:
    tfo_flags.exit_with_usage_error(str(e))
  # Layers are timed under the allocator policy the trainer runs with.
  host_allocator.apply(config.run.host_allocator)
  if values.plan_batch_sizes:
    tfo_flags.exit_with_usage_error(
        f"--plan_batch_sizes={','.join(values.plan_batch_sizes)}: the burst "
        "planner profiles the per-device batches of its widths itself; "
        "allowed: empty")
  deeppool = values.plan_profile_format == "deeppool"
  if values.plan_deeppool_job and not deeppool:
    tfo_flags.exit_with_usage_error(
        f"--plan_deeppool_job={values.plan_deeppool_job}: applies only "
        "with --plan_profile_format=deeppool")
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import burst_report
  from overlap_core.planning.burst_costs import CommModel

  dist = config.distribute
  num_devices = dist.num_workers * (dist.num_devices
                                    if dist.strategy == "mirrored" else 1)
  batch = config.data.batch_size
  batches = burst_report.batches_to_profile(global_batch=batch,
                                            num_devices=num_devices)
  if deeppool:
    graph, profile = _read_deeppool(values)
  else:
    graph, profile = _measure(config, values, batches)
  comm = CommModel(bandwidth_bytes_per_s=values.plan_bandwidth_gbps * 1e9
                   or None)
  try:
    plan = burst_report.make_burst_plan(
        graph, profile, global_batch=batch, num_devices=num_devices,
        amplification_limit=values.amplification_limit, comm=comm)
  except (ValueError, KeyError) as e:
    tfo_flags.exit_with_usage_error(str(e).strip("'\""))
  print(profile.summary())
  print()
  print(plan.table())
  if values.plan_output_dir:
    for path in burst_report.write_burst_files(graph, profile, plan,
                                               values.plan_output_dir):
      print(f"wrote {path}")
  return 0


def run_main():
  app.run(main, flags_parser=tfo_flags.parse_or_exit)


if __name__ == "__main__":
  sys.exit(run_main())
