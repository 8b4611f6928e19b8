"""A plain Keras `model.fit` with AsyncCheckpoint, as a job a test kills.

  python -m tests.tfoverlap.keras_fit_job DIRECTORY [--unknown_length]
      [--no_restore]

It prints its progress, one line each, so that a test can kill it at any
of these points:

  start <step> <epoch>   after the restore (0 0 when none)
  batch <step>           after each batch, and after its checkpoint's stall
  train end              when fit ends, before the final checkpoint
  done <weights> <state> after fit: digests of the model's weights, and
                         of all model and optimizer state in the order a
                         checkpoint stores it (seed states and the
                         optimizer's iteration count included)
"""

import argparse
import hashlib

import keras
import numpy as np
import tensorflow as tf

from tfoverlap.checkpoint import AsyncCheckpoint

EPOCHS = 3
BATCH_SIZE = 16
NUM_EXAMPLES = 96
BATCHES_PER_EPOCH = NUM_EXAMPLES // BATCH_SIZE
EVERY = 2


def build_model() -> keras.Model:
  # Named layers: variable paths then match in every process.
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((8,)),
                            keras.layers.Dense(16, "relu", name="hidden"),
                            keras.layers.Dropout(0.2, name="drop"),
                            keras.layers.Dense(3, name="logits")],
                           name="net")
  model.compile(optimizer=keras.optimizers.Adam(1e-2),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def build_dataset(unknown_length: bool) -> tf.data.Dataset:
  rng = np.random.default_rng(0)
  x = rng.normal(size=(NUM_EXAMPLES, 8)).astype(np.float32)
  y = rng.integers(0, 3, size=NUM_EXAMPLES)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)
  if unknown_length:
    # A filter hides the cardinality: Keras then runs with steps=None.
    dataset = dataset.filter(lambda features, label: True)
  return dataset


def state_digest(arrays) -> str:
  digest = hashlib.sha256()
  for array in arrays:
    digest.update(np.ascontiguousarray(np.asarray(array)).tobytes())
  return digest.hexdigest()


def checkpoint_digest(loaded) -> str:
  """The digest `main` prints for the state a checkpoint holds."""
  return state_digest([*loaded.groups["model"].values(),
                       *loaded.groups["optimizer"].values()])


class _Progress(keras.callbacks.Callback):
  """Prints the lines a test triggers kills on."""

  def __init__(self, checkpoint: AsyncCheckpoint):
    super().__init__()
    self._checkpoint = checkpoint
    self._step = 0

  def on_train_begin(self, logs=None):
    restored = self._checkpoint.restored_from
    self._step = restored.step if restored else 0
    print(f"start {self._step} {restored.epoch if restored else 0}",
          flush=True)

  def on_train_batch_end(self, batch, logs=None):
    self._step += 1
    print(f"batch {self._step}", flush=True)


class _EndMarker(keras.callbacks.Callback):
  """Listed before the checkpoint: prints before its final save."""

  def on_train_end(self, logs=None):
    print("train end", flush=True)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("directory")
  parser.add_argument("--unknown_length", action="store_true")
  parser.add_argument("--no_restore", action="store_true")
  args = parser.parse_args()
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  model = build_model()
  checkpoint = AsyncCheckpoint(args.directory, every=EVERY, keep=2,
                               restore=not args.no_restore)
  model.fit(build_dataset(args.unknown_length), epochs=EPOCHS, verbose=0,
            callbacks=[_EndMarker(), checkpoint, _Progress(checkpoint)])
  print(f"done {state_digest(model.weights)} "
        f"{state_digest(model.variables + model.optimizer.variables)}",
        flush=True)


if __name__ == "__main__":
  main()
