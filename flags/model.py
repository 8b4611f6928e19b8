"""Model flags: which zoo model, how it is optimized, in what precision."""

from absl import flags

from overlap_core.runtime import zoo


def define_flags():
  flags.DEFINE_enum("model", "small_cnn", list(zoo.MODEL_NAMES),
                    "Model from the zoo.")
  flags.DEFINE_enum("optimizer", "adam", ["sgd", "momentum", "adam"],
                    "Optimizer (momentum is SGD with momentum 0.9).")
  flags.DEFINE_float("learning_rate", 1e-3, "Learning rate.", lower_bound=0.0)
  flags.DEFINE_enum(
      "precision", "float32", ["float32", "mixed_float16", "mixed_bfloat16"],
      "Compute precision; mixed_* keep float32 weights (Keras mixed "
      "precision policy; torch.autocast on the PyTorch side).")
