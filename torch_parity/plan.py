"""python -m torch_parity.plan: plan a pipeline split offline, in PyTorch.

Reads the model's layer graph (torch.fx), profiles every layer forward and
backward at a few batch sizes (or reads --plan_profile), fits the per-layer
cost model and splits the model into --pipeline_stages stages; prints the
graph, the profile, the cost model's held-out error, the chosen split with
its predicted stage times, and the even split beside it.

  python -m torch_parity.plan --model=vgg16 --image_size=32 \\
      --batch_size=32 --strategy=mirrored --num_devices=4 \\
      --pipeline_stages=4 --pipeline_microbatches=4 --plan_output_dir=plan/

Give it the trainer's job flags: they decide the threads and micro-batch
each stage gets, and the trainer refuses a profile made under others.

The micro-batch is the per-replica batch over --pipeline_microbatches.
Pass the cuts it prints to the trainer as --pipeline_split=<layers>, or its
profile as --plan_profile with --pipeline_split=auto. Nothing is trained.
"""

import sys

from absl import app

import flags as tfo_flags
from flags import plan as plan_flags
from overlap_core.runtime import host_allocator

tfo_flags.define_flags()
plan_flags.define_flags()
PROGRAM = "torch_parity.plan"


def main(argv):
  del argv
  values = tfo_flags.FLAGS
  config = tfo_flags.to_config(values)
  # Layers are timed under the allocator policy the trainer runs with.
  host_allocator.apply(config.run.host_allocator)
  # pylint: disable=g-import-not-at-top
  import torch
  from overlap_core.planning import command
  from overlap_core.planning import split
  from overlap_core.planning.dims import ParallelDims
  from overlap_core.runtime.config import ConfigError
  from torch_parity.models import build_model
  from torch_parity.planning.graph import build_layer_graph
  from torch_parity.planning.profiler import profile_layers
  from torch_parity.steps import build_optimizer

  try:
    command.check_plannable(config, "pytorch")
  except ConfigError as e:
    tfo_flags.exit_with_usage_error(str(e))
  microbatch = command.plan_microbatch_size(config)
  try:
    sizes = command.profile_batch_sizes(values.plan_batch_sizes, microbatch)
  except ValueError as e:
    tfo_flags.exit_with_usage_error(str(e))
  torch.manual_seed(config.run.seed)
  model = build_model(config.model.name, image_size=config.data.image_size,
                      num_classes=config.data.num_classes)
  side = config.data.image_size // (2 if config.model.name == "edsr" else 1)

  def make_input(batch):
    return torch.randn(batch, 3, side, side)

  graph = build_layer_graph(model, make_input(microbatch),
                            name=config.model.name)
  try:
    command.check_split(graph, config.pipeline, microbatch)
    profile = split.load_profile(values.plan_profile)
  except (ValueError, ConfigError) as e:
    tfo_flags.exit_with_usage_error(str(e))
  if profile is None:
    # Layers are timed where the trainer would run them: the first GPU,
    # else the CPU.
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    # One process per stage (and replica): each gets that share of the
    # host's cores, and its layers are timed on that share.
    torch.set_num_threads(command.profiling_threads(
        config, ParallelDims.from_config(config, None).world_size))
    profile = profile_layers(model, make_input, device=device,
                             batch_sizes=sizes, warmup=values.plan_warmup,
                             repeats=values.plan_repeats,
                             name=config.model.name,
                             optimizer_factory=lambda params: build_optimizer(
                                 config.model, params),
                             optimizer_name=config.model.optimizer)
  try:
    print(command.run_plan(
        graph, profile, config,
        bandwidth_bytes_per_s=values.plan_bandwidth_gbps * 1e9 or None,
        output_dir=values.plan_output_dir))
  except (ValueError, KeyError) as e:
    tfo_flags.exit_with_usage_error(str(e).strip("'\""))
  return 0


def run_main():
  app.run(main, flags_parser=tfo_flags.parse_or_exit)


if __name__ == "__main__":
  sys.exit(run_main())
