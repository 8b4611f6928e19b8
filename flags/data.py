"""Data flags: the source and every input-pipeline overlap knob."""

from absl import flags


def define_flags():
  flags.DEFINE_string(
      "dataset", "digits",
      "digits, synthetic, tfds, image_folder, or package.module:callable: "
      "your callable(split, ...) returning an unbatched tf.data.Dataset / "
      "torch Dataset of (x, y), or None for a split it lacks; the trainer "
      "batches, shards, shuffles and prefetches it. "
      "digits: the UCI 8x8 handwritten digits (1797), shipped with the package. "
      "synthetic: random images of --image_size. tfds: --tfds_name read from "
      "--data_dir, never downloaded. image_folder: "
      "<data_dir>/<split>/<label>/<image>.")
  flags.DEFINE_string("data_dir", None,
                      "Local directory for --dataset=tfds or image_folder.")
  flags.DEFINE_string("tfds_name", "mnist",
                      "TFDS dataset name (with optional :version).")
  flags.DEFINE_integer("image_size", 16,
                       "Side of the square images fed to the model.",
                       lower_bound=1)
  flags.DEFINE_integer("num_classes", 10, "Classes of --dataset=synthetic.",
                       lower_bound=2)
  flags.DEFINE_integer("batch_size", 64,
                       "Global batch size, summed over replicas and workers.",
                       lower_bound=1)
  flags.DEFINE_boolean(
      "synthetic_on_device", False,
      "Keep synthetic batches resident on the device (no input pipeline).")
  flags.DEFINE_string("prefetch", "autotune",
                      "Prefetch depth in batches: 0 (off), N, or autotune.")
  flags.DEFINE_boolean(
      "prefetch_to_device", False,
      "Stage batches on the training device ahead of the step.")
  flags.DEFINE_string(
      "map_parallelism", "autotune",
      "Parallel preprocessing calls: 1 (sequential), N, or autotune.")
  flags.DEFINE_boolean("cache", False,
                       "Cache decoded samples in memory after the first epoch.")
  flags.DEFINE_integer("shuffle_buffer", 1024,
                       "Shuffle buffer in samples; 0 = no shuffling.",
                       lower_bound=0)
  flags.DEFINE_float(
      "preprocess_cost_ms", 0.0,
      "Real CPU work added to each sample's preprocessing, in milliseconds, "
      "to study input-bound training on any machine.", lower_bound=0.0)
  flags.DEFINE_string(
      "data_service", "",
      "tf.data service: empty (off), 'local' (start one in the trainer, "
      "addressed as localhost, but its dispatcher and worker listen on ALL "
      "interfaces without authentication, and a dispatcher runs any dataset "
      "graph it is sent: TensorFlow offers no bind address), or a "
      "dispatcher address such as grpc://localhost:5050.")
