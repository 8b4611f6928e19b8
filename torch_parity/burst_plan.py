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

from flags import entry_point
from overlap_core.planning import command
from torch_parity import plan

PROGRAM = "torch_parity.burst_plan"


def _profile_layers(model, config, batch_sizes, warmup, repeats):
  # pylint: disable=g-import-not-at-top
  import torch
  from torch_parity.planning.profiler import profile_layers
  device = "cuda:0" if torch.cuda.is_available() else "cpu"
  return profile_layers(model, lambda b: plan.make_input(config, b),
                        device=device, batch_sizes=batch_sizes,
                        warmup=warmup, repeats=repeats,
                        name=config.model.name)


MEASURER = command.Measurer("pytorch", plan.build_graph, _profile_layers)

main, run_main = entry_point.make_plan_main(command.burst_plan_main, MEASURER)


if __name__ == "__main__":
  sys.exit(run_main())
