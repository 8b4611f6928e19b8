"""Checkpoint flags: the mode and cadence of checkpoints during training."""

from absl import flags


def define_flags():
  flags.DEFINE_enum(
      "checkpoint", "none", ["none", "sync", "tf_async"],
      "none: no checkpoints. sync: a blocking save. tf_async: TensorFlow's "
      "CheckpointOptions(enable_async=True) (copy on the step, write in the "
      "background).")
  flags.DEFINE_integer("checkpoint_every", 100, "Steps between checkpoints.",
                       lower_bound=1)
  flags.DEFINE_integer("checkpoint_keep", 3, "Newest checkpoints kept.",
                       lower_bound=1)
