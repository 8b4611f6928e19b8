"""Run flags: where outputs go, how long to train, what to record."""

from absl import flags

from overlap_core.runtime import contention, paired_removal


def define_flags():
  flags.DEFINE_string(
      "model_dir", "",
      "Directory for run.json, the step trace, TensorBoard scalars and "
      "checkpoints. Empty: runs/<framework>-<model>-<timestamp>.")
  flags.DEFINE_integer("train_steps", 300, "Optimizer steps to train.",
                       lower_bound=1)
  flags.DEFINE_integer("log_every_steps", 50,
                       "Steps between progress lines and TensorBoard scalars.",
                       lower_bound=1)
  flags.DEFINE_integer("seed", 0, "Seed for weights, data order and dropout.")
  flags.DEFINE_boolean(
      "deterministic", False,
      "Enable the framework's deterministic ops, for bit-identical reruns.")
  flags.DEFINE_enum(
      "loop", "ctl", ["ctl", "fit"],
      "ctl: tfoverlap's measured custom training loop (strategy.run). "
      "fit: Keras model.fit with the same callbacks.")
  flags.DEFINE_integer(
      "steps_per_execution", 1,
      "Optimizer steps per traced call, with the input iterator inside it, "
      "as Keras' steps_per_execution: fewer Python round trips per step. "
      "The ledger then times spans of K steps and records each step as the "
      "span / K, data wait inside. Checkpoints fall between calls, so a "
      "fixed --checkpoint_every must be a multiple of K. TensorFlow only: "
      "the PyTorch trainer refuses K > 1, and so does --loop=fit under a "
      "replicated strategy (a Keras 3 bug).",
      lower_bound=1)
  flags.DEFINE_boolean("progress", True, "Show progress lines while training.")
  flags.DEFINE_boolean("trace", True,
                       "Write a Chrome-trace/Perfetto JSON of the step spans.")
  flags.DEFINE_boolean("tensorboard", True, "Write TensorBoard scalars.")
  flags.DEFINE_boolean("evaluate", True,
                       "Evaluate on the held-out split after training.")
  flags.DEFINE_integer("intra_op_threads", 0,
                       "Threads inside one op; 0 = the framework's default.",
                       lower_bound=0)
  flags.DEFINE_integer("inter_op_threads", 0,
                       "Ops run concurrently; 0 = the framework's default.",
                       lower_bound=0)
  flags.DEFINE_enum(
      "host_allocator", "retain", ["retain", "system"],
      "retain: glibc keeps large freed host blocks for reuse, so a step's "
      "temporaries do not come back as fresh, page-faulting memory every "
      "step (the process keeps its high-water mark). system: the C "
      "library's defaults. Both frameworks; a no-op off glibc.")
  flags.DEFINE_integer(
      "reference_steps", contention.DEFAULT_REFERENCE_STEPS,
      "Steps timed before training on a resident copy of the run's first "
      "batch, before its input pipeline starts, so nothing is read beside "
      "them, and again after the loop: the step alone, the lower of the "
      "two medians. The ledger's "
      "contention phase is each step's compute beyond it, the cost of the "
      "work running beside the step (input pipeline, checkpoint persist). "
      "Weights, optimizer state and random streams are put back after. "
      "0: no calibration and no contention phase. Derived for the custom "
      "loop at one step per call, and for a pipeline whose stages are "
      "processes, a PyTorch one with one stage per rank and TensorFlow's "
      "--pipeline_runtime=processes (each stage timed alone on stand-ins "
      "for its neighbours' tensors, one stage at a time); not for "
      "TensorFlow's devices runtime, a burst plan, PyTorch's parameters "
      "offload or TensorFlow's multi_worker jobs.",
      lower_bound=0)
  flags.DEFINE_enum(
      "paired_removal", paired_removal.NONE, list(paired_removal.CAUSES),
      "Measures what removing a cause saves within this one run: blocks "
      "of --paired_block_steps steps alternate, with, without, without, "
      "with, ..., between the job as configured and the job without the "
      "cause. input: a step without it takes one of the run's own "
      "batches, read before training and held resident, instead of "
      "asking the pipeline. checkpoint: a step without it takes no "
      "checkpoint. offload: a step without it "
      "runs with offload paused, split against the step timed alone "
      "without offload. all_reduce: a step without it all-reduces no "
      "gradient (DDP's no_sync; TensorFlow's step that applies each "
      "replica's own gradients), so the replicas' weights part, as under "
      "--all_reduce=off: no checkpoint, no evaluation. pipeline_waits: "
      "every stage runs a step without it apart, on stand-ins for its "
      "neighbours' tensors, as --pipeline_stages_apart runs every step, "
      "so it neither waits nor transfers: no checkpoint, no evaluation. "
      "run.json's "
      "paired_removal "
      "gives both halves' phases and the saving; the first half of each "
      "block, where the previous block's work still ends, counts in "
      "neither. The run's own phases then mix both halves. input, offload "
      "and all_reduce: the custom loop at one step per call only.")
  flags.DEFINE_integer(
      "paired_block_steps", paired_removal.DEFAULT_BLOCK_STEPS,
      "Steps per block of --paired_removal.", lower_bound=2)
