"""Model flags: which model (the zoo's or the user's), how it is optimized,
in what precision."""

from absl import flags

from overlap_core.runtime import zoo


def define_flags():
  flags.DEFINE_string(
      "model", "small_cnn",
      f"A zoo model ({', '.join(zoo.MODEL_NAMES)}); or your own, as "
      "package.module:callable (importable from the working directory or "
      "PYTHONPATH) returning a Keras model / torch nn.Module, or (model, "
      "overlap_core.runtime.user_code.Task); or a saved .keras file "
      "(TensorFlow). The builder gets any of image_size, num_classes, "
      "channels, batch_size, seed, precision its signature names.")
  flags.DEFINE_enum("optimizer", "adam", ["sgd", "momentum", "adam"],
                    "Optimizer (momentum is SGD with momentum 0.9).")
  flags.DEFINE_float("learning_rate", 1e-3, "Learning rate.", lower_bound=0.0)
  flags.DEFINE_enum(
      "precision", "float32", ["float32", "mixed_float16", "mixed_bfloat16"],
      "Compute precision; mixed_* keep float32 weights (Keras mixed "
      "precision policy; torch.autocast on the PyTorch side).")
