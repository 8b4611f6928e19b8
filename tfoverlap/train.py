"""python -m tfoverlap.train: the measured TensorFlow/Keras trainer.

With no flags it trains the small CNN on the embedded digits set, with
prefetch on, under MirroredStrategy over two devices, and prints where each
step's time went. `--helpfull` lists every flag; `--flagfile` reads them.
"""

import sys

from absl import app
from absl import logging

import flags as tfo_flags
from overlap_core.checkpoint.files import CheckpointError
from overlap_core.runtime.config import ConfigError

tfo_flags.define_flags()
PROGRAM = "tfoverlap.train"


def main(argv):
  del argv  # parse_or_exit refuses positional arguments
  config = tfo_flags.to_config(tfo_flags.FLAGS)
  if not tfo_flags.FLAGS["verbosity"].present:
    # TensorFlow logs every collective it sets up at INFO; --verbosity=0
    # brings that back.
    logging.set_verbosity(logging.WARNING)
  # TensorFlow is imported only now, after flags parsed, so --helpfull and a
  # bad flag answer at once.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfoverlap import trainer  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import failure, summary as report, waits
  try:
    record = trainer.train(config)
  except ConfigError as e:
    tfo_flags.exit_with_usage_error(str(e))
  except (tf.errors.OpError, OSError, CheckpointError) as e:
    # A lost peer, an exhausted device, a full disk or a checkpoint that
    # cannot be saved or restored: one line for the user; the traceback
    # stays available with --verbosity=1.
    logging.debug("training failed", exc_info=True)
    failure.record_failure(config, e, framework="tensorflow")
    tfo_flags.exit_with_runtime_error(PROGRAM, waits.explain(e))
  if record["worker"]["index"] == 0:
    print(report.format_breakdown(record,
                                  phases_measured=record["phases_measured"]))
    print(report.format_final(record))


def run_main():
  app.run(main, argv=sys.argv, flags_parser=tfo_flags.parse_or_exit)


if __name__ == "__main__":
  run_main()
