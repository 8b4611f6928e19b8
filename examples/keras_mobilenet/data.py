"""The data: images drawn by a tf.data graph, nothing read from disk.

Each image is noise with one bright square whose position tells its
class, so the model has something to learn. Every example comes from a
stateless random op seeded by its index, so a split is the same on every
run and every worker, and the graph holds no Python (the tf.data service
can ship it).
"""

import tensorflow as tf

NUM_EXAMPLES = {"train": 2048, "eval": 256}


def load(split, image_size, num_classes):
  """An unbatched `tf.data.Dataset` of (image [S, S, 3] float32, label).

  The trainer batches, shards, shuffles and prefetches it.
  """
  seed = 0 if split == "train" else 1
  square = max(2, image_size // 4)
  # Where each class's square sits, along the image's diagonal band.
  stride = max(1, (image_size - square) // max(1, num_classes - 1))

  def example(index):
    label = tf.cast(tf.math.floormod(index, num_classes), tf.int32)
    noise = tf.random.stateless_uniform(
        (image_size, image_size, 3), seed=tf.stack([seed, index]),
        maxval=0.5)
    corner = tf.minimum(label * stride, image_size - square)
    rows = tf.range(image_size)
    inside = ((rows >= corner) & (rows < corner + square))
    mask = tf.cast(inside[:, None] & inside[None, :], tf.float32)
    return noise + 0.5 * mask[:, :, None], label

  return tf.data.Dataset.range(NUM_EXAMPLES[split]).map(
      example, num_parallel_calls=tf.data.AUTOTUNE)
