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

import sys

from absl import app

import flags as tfo_flags
from flags import plan as plan_flags
from overlap_core.runtime import host_allocator

tfo_flags.define_flags()
plan_flags.define_flags()
PROGRAM = "torch_parity.burst_plan"


def _measure(config):
  """The model's graph and layer timer, in PyTorch: build_graph(batch),
  measure(batches)."""
  # pylint: disable=g-import-not-at-top
  import torch
  from torch_parity.models import build_model
  from torch_parity.planning.graph import build_layer_graph
  from torch_parity.planning.profiler import profile_layers

  values = tfo_flags.FLAGS
  torch.manual_seed(config.run.seed)
  model = build_model(config.model.name, image_size=config.data.image_size,
                      num_classes=config.data.num_classes)
  side = config.data.image_size // (2 if config.model.name == "edsr" else 1)

  def make_input(b):
    return torch.randn(b, 3, side, side)

  def build_graph(batch):
    return build_layer_graph(model, make_input(batch), name=config.model.name)

  def measure(batches):
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    return profile_layers(model, make_input, device=device,
                          batch_sizes=batches, warmup=values.plan_warmup,
                          repeats=values.plan_repeats, name=config.model.name)

  return build_graph, measure


def main(argv):
  del argv
  values = tfo_flags.FLAGS
  config = tfo_flags.to_config(values)
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import burst_report, command
  from overlap_core.runtime.config import ConfigError
  try:
    command.check_plannable(config, "pytorch", burst=True)
  except ConfigError as e:
    tfo_flags.exit_with_usage_error(str(e))
  # Layers are timed under the allocator policy the trainer runs with.
  host_allocator.apply(config.run.host_allocator)
  request = plan_flags.burst_request(values)
  if request.profile_format == "deeppool":
    build_graph = measure = None  # DeepPool's files: no model is built
  else:
    build_graph, measure = _measure(config)
  try:
    graph, profile, plan = burst_report.plan_burst_command(
        config, request, build_graph=build_graph, measure=measure)
  except (ValueError, KeyError) as e:
    tfo_flags.exit_with_usage_error(str(e).strip("'\""))
  burst_report.print_burst_plan(graph, profile, plan, request.output_dir)
  return 0


def run_main():
  app.run(main, flags_parser=tfo_flags.parse_or_exit)


if __name__ == "__main__":
  sys.exit(run_main())
