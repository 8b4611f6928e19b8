"""The data: (features, target) pairs made by a tf.data graph.

The target is a fixed smooth function of the features plus a little
noise; each example is drawn by stateless random ops seeded by its index,
so a split is the same on every run.
"""

import tensorflow as tf

NUM_FEATURES = 8
NUM_EXAMPLES = {"train": 4096, "eval": 512}


def load(split):
  """An unbatched `tf.data.Dataset` of (x [NUM_FEATURES], y [1]) floats."""
  seed = 0 if split == "train" else 1

  def example(index):
    x = tf.random.stateless_normal((NUM_FEATURES,),
                                   seed=tf.stack([seed, index]))
    y = (tf.sin(x[0]) + x[1] * x[2] + 0.5 * tf.reduce_sum(x[3:])
         + 0.05 * tf.random.stateless_normal((), seed=tf.stack([seed + 2,
                                                                index])))
    return x, tf.reshape(y, (1,))

  return tf.data.Dataset.range(NUM_EXAMPLES[split]).map(
      example, num_parallel_calls=tf.data.AUTOTUNE)
