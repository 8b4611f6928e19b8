"""python -m tfoverlap.burst_plan: plan burst-parallel layers offline, in
TensorFlow.

The mirror of `python -m torch_parity.burst_plan`, with the same flags and
the same report (`overlap_core.planning.burst_report`): reads the Keras
model's layer graph, times every layer forward and backward in TensorFlow
at the per-device batches the candidate widths give (or reads
--plan_profile, or DeepPool's files with --plan_profile_format=deeppool),
and gives every layer its own number of devices within
--amplification_limit. Nothing is trained.

  python -m tfoverlap.burst_plan --model=vgg16 --image_size=32 \\
      --batch_size=32 --strategy=mirrored --num_devices=4 \\
      --amplification_limit=2 --plan_bandwidth_gbps=10 \\
      --plan_output_dir=plan/

With --plan_output_dir it writes burst_plan.json, what --burst_parallel
reads (layers go by their neutral names, so either trainer runs it).
"""

import sys

from absl import app

import flags as tfo_flags
from flags import plan as plan_flags
from overlap_core.runtime import host_allocator

tfo_flags.define_flags()
plan_flags.define_flags()
PROGRAM = "tfoverlap.burst_plan"


def _measure(config):
  """The model's graph and layer timer, in TensorFlow: build_graph(batch),
  measure(batches)."""
  # pylint: disable=g-import-not-at-top
  import keras
  import tensorflow as tf
  from overlap_core.planning import command
  from tfoverlap.models import build_model
  from tfoverlap.planning.graph import build_layer_graph
  from tfoverlap.planning.profiler import profile_layers

  values = tfo_flags.FLAGS
  # Before any op: one TensorFlow process runs every part of a burst run,
  # on the threads each of the trainer's processes gets.
  tf.config.threading.set_intra_op_parallelism_threads(
      command.profiling_threads(config, config.distribute.num_workers))
  keras.utils.set_random_seed(config.run.seed)
  model = build_model(config.model.name, image_size=config.data.image_size,
                      num_classes=config.data.num_classes)

  def build_graph(batch):
    return build_layer_graph(model, batch_size=batch, name=config.model.name)

  def measure(batches):
    return profile_layers(model, batch_sizes=batches,
                          warmup=values.plan_warmup,
                          repeats=values.plan_repeats,
                          name=config.model.name, seed=config.run.seed)

  return build_graph, measure


def main(argv):
  del argv
  values = tfo_flags.FLAGS
  config = tfo_flags.to_config(values)
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import burst_report, command
  from overlap_core.runtime.config import ConfigError
  try:
    command.check_plannable(config, "tensorflow", burst=True)
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
