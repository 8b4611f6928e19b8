"""Checkpoint flags: mode, cadence, retention and failure policy.

`CheckpointConfig` validates their values (see `flags.to_config`); these
are the names its errors give them.
"""

from absl import flags

CONFIG_NAMES = {
    "mode": "--checkpoint",
    "every_steps": "--checkpoint_every",
    "keep": "--checkpoint_keep",
    "max_overhead_frac": "--checkpoint_max_overhead",
    "on_error": "--checkpoint_on_error",
    "if_busy": "--checkpoint_if_busy",
}


def define_flags():
  flags.DEFINE_enum(
      "checkpoint", "none", ["none", "sync", "tf_async", "async"],
      "none: no checkpoints. sync: a blocking save. tf_async: TensorFlow's "
      "CheckpointOptions(enable_async=True) (copy on the step, write in the "
      "background; the next save waits for the last write). async: "
      "two-phase, a snapshot between steps and a background persist with "
      "checksums (the PyTorch trainer has the same).")
  flags.DEFINE_string(
      "checkpoint_every", "100",
      "Steps between checkpoints, or 'auto': measure step, snapshot and "
      "persist costs and checkpoint as often as "
      "--checkpoint_max_overhead allows.")
  flags.DEFINE_float(
      "checkpoint_max_overhead", 0.03,
      "With --checkpoint_every=auto: the largest fraction of training time "
      "checkpoints may cost (0.03 = 3%).")
  flags.DEFINE_integer("checkpoint_keep", 3,
                       "Newest checkpoints kept (1 or more).")
  flags.DEFINE_enum(
      "checkpoint_on_error", "raise", ["raise", "warn"],
      "When a save fails (an unwritable directory, a full disk): raise "
      "ends the run with the error; warn logs it and trains on.")
  flags.DEFINE_enum(
      "checkpoint_if_busy", "wait", ["wait", "skip"],
      "When a background persist is still running at the next checkpoint: "
      "wait for it (counted as stall), or skip this checkpoint.")
