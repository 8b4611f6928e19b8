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

from flags import entry_point
from overlap_core.planning import command
from overlap_core.planning.dims import ParallelDims
from overlap_core.runtime import user_code

PROGRAM = "torch_parity.plan"


# The framework is imported inside the measuring functions: after the
# allocator policy is applied, and not at all for a refused flag.
# pylint: disable=g-import-not-at-top
# The user's model's example input shape, once build_graph has read it
# from its data: {model name: shape}.
_USER_EXAMPLE_SHAPES = {}


def make_input(config, batch_size):
  """A random batch of the model's inputs (EDSR's are half the size; a
  user's model's are its data's)."""
  import torch
  if config.model.name in _USER_EXAMPLE_SHAPES:
    return torch.randn(batch_size, *_USER_EXAMPLE_SHAPES[config.model.name])
  side = config.data.image_size // (2 if config.model.name == "edsr" else 1)
  return torch.randn(batch_size, 3, side, side)


def build_graph(config, batch_size):
  """The seeded model and its torch.fx layer graph at `batch_size`."""
  import torch
  from torch_parity.models import build_model
  from torch_parity.planning.graph import build_layer_graph
  torch.manual_seed(config.run.seed)
  if user_code.model_spec(config.model.name) is None:
    from torch_parity import user_model
    model, shape = user_model.load_for_planning(config)
    _USER_EXAMPLE_SHAPES[config.model.name] = shape
  else:
    model = build_model(config.model.name, image_size=config.data.image_size,
                        num_classes=config.data.num_classes)
  return model, build_layer_graph(model, make_input(config, batch_size),
                                  name=config.model.name)


def _profile_layers(model, config, batch_sizes, warmup, repeats):
  import torch
  from torch_parity.planning.profiler import profile_layers
  from torch_parity.steps import build_optimizer
  # Layers are timed where the trainer would run them: the first GPU, else
  # the CPU.
  device = "cuda:0" if torch.cuda.is_available() else "cpu"
  # One process per stage (and replica): each gets that share of the
  # host's cores, and its layers are timed on that share.
  torch.set_num_threads(command.profiling_threads(
      config, ParallelDims.from_config(config, None).world_size))
  return profile_layers(model, lambda b: make_input(config, b),
                        device=device, batch_sizes=batch_sizes,
                        warmup=warmup, repeats=repeats,
                        name=config.model.name,
                        optimizer_factory=lambda params: build_optimizer(
                            config.model, params),
                        optimizer_name=config.model.optimizer)
# pylint: enable=g-import-not-at-top


MEASURER = command.Measurer("pytorch", build_graph, _profile_layers)

main, run_main = entry_point.make_plan_main(command.plan_main, MEASURER)


if __name__ == "__main__":
  sys.exit(run_main())
