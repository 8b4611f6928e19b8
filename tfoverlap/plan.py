"""python -m tfoverlap.plan: plan a pipeline split offline, in TensorFlow.

The mirror of `python -m torch_parity.plan`, with the same flags and the
same report: reads the Keras model's layer graph, times every layer forward
and backward at a few batch sizes in TensorFlow (or reads --plan_profile),
fits the per-layer cost model and splits the model into --pipeline_stages
stages; prints the graph, the profile, the cost model's held-out error, the
chosen split with its predicted stage times, and the even split beside it.

  python -m tfoverlap.plan --model=vgg16 --image_size=32 \\
      --batch_size=32 --strategy=mirrored --num_devices=4 \\
      --pipeline_stages=4 --pipeline_microbatches=4 --plan_output_dir=plan/

Give it the trainer's job flags: they decide the threads and micro-batch
each stage gets, and the trainer refuses a profile made under others.

Pass the cuts it prints to the trainer as --pipeline_split=<layers>, or its
profile as --plan_profile with --pipeline_split=auto. Nothing is trained.
"""

import sys

from flags import entry_point
from overlap_core.planning import command
from overlap_core.runtime import user_code

PROGRAM = "tfoverlap.plan"


# The framework is imported inside the measuring functions: after the
# allocator policy is applied, and not at all for a refused flag.
# pylint: disable=g-import-not-at-top
def _build_graph(config, batch_size):
  import keras
  import tensorflow as tf
  from tfoverlap.models import build_model
  from tfoverlap.planning.graph import build_layer_graph
  # Before any op: layers are timed on the threads each of the trainer's
  # processes gets (one process holds every stage, on logical devices).
  tf.config.threading.set_intra_op_parallelism_threads(
      command.profiling_threads(config, config.distribute.num_workers))
  keras.utils.set_random_seed(config.run.seed)
  if user_code.model_spec(config.model.name) is None:
    # The user's model, built as the trainer builds it (same layer names,
    # so the cuts plug into its run unchanged).
    from tfoverlap import user_model
    model, _ = user_model.load_for_planning(config)
  else:
    model = build_model(config.model.name, image_size=config.data.image_size,
                        num_classes=config.data.num_classes)
  return model, build_layer_graph(model, batch_size=batch_size,
                                  name=config.model.name)


def _profile_layers(model, config, batch_sizes, warmup, repeats):
  from tfoverlap.planning.profiler import profile_layers
  from tfoverlap.steps import build_optimizer
  # Layers are timed where the trainer runs them: the first GPU, else the
  # CPU.
  return profile_layers(model, batch_sizes=batch_sizes, warmup=warmup,
                        repeats=repeats, name=config.model.name,
                        seed=config.run.seed,
                        optimizer_factory=lambda: build_optimizer(
                            config.model),
                        optimizer_name=config.model.optimizer)
# pylint: enable=g-import-not-at-top


MEASURER = command.Measurer("tensorflow", _build_graph, _profile_layers)

main, run_main = entry_point.make_plan_main(command.plan_main, MEASURER)


if __name__ == "__main__":
  sys.exit(run_main())
