"""python -m tfoverlap.train: the measured TensorFlow/Keras trainer.

With no flags it trains the small CNN on the embedded digits set, with
prefetch on, under MirroredStrategy over two devices, and prints where each
step's time went. `--helpfull` lists every flag; `--flagfile` reads them.
"""

import flags as tfo_flags
from flags import entry_point

tfo_flags.define_flags()
PROGRAM = "tfoverlap.train"


def _train(config):
  from tfoverlap import trainer  # pylint: disable=g-import-not-at-top
  return trainer.train(config)


def _runtime_errors():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from overlap_core.checkpoint.files import CheckpointError  # pylint: disable=g-import-not-at-top
  # A lost peer, an exhausted device, a full disk or a checkpoint that
  # cannot be saved or restored.
  return (tf.errors.OpError, OSError, CheckpointError)


main, run_main = entry_point.make_trainer_main(
    PROGRAM, "tensorflow", _train, _runtime_errors)

if __name__ == "__main__":
  run_main()
