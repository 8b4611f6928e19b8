"""python -m torch_parity.plan: plan a pipeline split offline, in PyTorch.

Reads the model's layer graph (torch.fx), profiles every layer forward and
backward at a few batch sizes (or reads --plan_profile), fits the per-layer
cost model and splits the model into --pipeline_stages stages; prints the
graph, the profile, the cost model's held-out error, the chosen split with
its predicted stage times, and the even split beside it.

  python -m torch_parity.plan --model=vgg16 --image_size=32 \\
      --batch_size=32 --strategy=default --pipeline_stages=4 \\
      --pipeline_microbatches=4 --plan_output_dir=plan/

The micro-batch is the per-replica batch over --pipeline_microbatches.
Nothing is trained; the pipeline runtime is not built yet.
"""

import sys

from absl import app

import flags as tfo_flags
from flags import plan as plan_flags

tfo_flags.define_flags()
plan_flags.define_flags()
PROGRAM = "torch_parity.plan"


def _batch_sizes(values, microbatch: int):
  if values.plan_batch_sizes:
    try:
      sizes = sorted({int(b) for b in values.plan_batch_sizes})
    except ValueError:
      sizes = [0]
    if sizes[0] < 1:
      tfo_flags.exit_with_usage_error(
          f"--plan_batch_sizes={','.join(values.plan_batch_sizes)}: allowed:"
          " positive integers")
    return sizes
  return sorted({max(1, microbatch // 2), microbatch, 2 * microbatch})


def main(argv):
  del argv
  values = tfo_flags.FLAGS
  config = tfo_flags.to_config(values)
  # pylint: disable=g-import-not-at-top
  import torch
  from overlap_core.planning import partition
  from overlap_core.planning import profile as profile_lib
  from overlap_core.planning import report
  from torch_parity.models import build_model
  from torch_parity.planning.graph import build_layer_graph
  from torch_parity.planning.profiler import profile_layers

  dist = config.distribute
  replicas = dist.num_workers * (dist.num_devices
                                 if dist.strategy == "mirrored" else 1)
  pipe = config.pipeline
  microbatch = config.data.batch_size // replicas // pipe.microbatches
  torch.manual_seed(config.run.seed)
  model = build_model(config.model.name, image_size=config.data.image_size,
                      num_classes=config.data.num_classes)
  side = config.data.image_size // (2 if config.model.name == "edsr" else 1)

  def make_input(batch):
    return torch.randn(batch, 3, side, side)

  graph = build_layer_graph(model, make_input(microbatch),
                            name=config.model.name)
  bandwidth = values.plan_bandwidth_gbps * 1e9 or None
  plan_args = dict(num_stages=pipe.stages, microbatch_size=microbatch,
                   num_microbatches=pipe.microbatches, split=pipe.split,
                   cut_layers=pipe.cut_layers,
                   bandwidth_bytes_per_s=bandwidth)
  try:
    # Refuse an impossible split before spending minutes on profiling.
    partition.partition(graph, {n.name: 0.0 for n in graph.nodes},
                        num_stages=pipe.stages, batch_size=microbatch,
                        mode=pipe.split, cut_layers=pipe.cut_layers)
  except ValueError as e:
    tfo_flags.exit_with_usage_error(str(e))
  if values.plan_profile:
    with open(values.plan_profile, encoding="utf-8") as f:
      profile = profile_lib.Profile.from_json(f.read())
  else:
    # Layers are timed where the trainer would run them: the first GPU,
    # else the CPU.
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    profile = profile_layers(model, make_input, device=device,
                             batch_sizes=_batch_sizes(values, microbatch),
                             warmup=values.plan_warmup,
                             repeats=values.plan_repeats,
                             name=config.model.name)
  try:
    result = report.make_plan(graph, profile, **plan_args)
  except (ValueError, KeyError) as e:
    tfo_flags.exit_with_usage_error(str(e).strip("'\""))
  print(report.format_report(result))
  if values.plan_output_dir:
    for path in report.write_plan_files(result, values.plan_output_dir):
      print(f"wrote {path}")
  return 0


def run_main():
  app.run(main, flags_parser=tfo_flags.parse_or_exit)


if __name__ == "__main__":
  sys.exit(run_main())
