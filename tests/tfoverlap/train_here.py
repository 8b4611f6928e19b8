"""The TensorFlow trainer run in the test process.

For tests that compare what the trainer computes and records, not what its
command does: each `python -m tfoverlap.train` spends most of its time
starting Python and TensorFlow. The runs get the two logical CPU devices
tests/conftest.py made, as a mirrored or pipelined command gets its own.

  record = train_here(model_dir=str(tmp_path), model="mlp",
                      train_steps="4")
"""

import keras
from absl.testing import flagsaver
# The public API can turn op determinism on only; the same module turns it
# off.
from tensorflow.python.framework import config as tf_config

import flags as tfo_flags
from overlap_core.runtime import run_record
from tfoverlap import trainer

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()


def train_here(**flags: str) -> dict:
  """Trains with `flags` (flag name: value, as on the command line, with
  `model_dir` among them) in this process; returns its run record."""
  with flagsaver.as_parsed(**flags):
    config = tfo_flags.to_config()
  # Keras numbers the objects it names itself per process, and a checkpoint
  # keys the optimizer's slots by that name ("adam_2"): a fresh session
  # names them as the command's own process does, so that a run here
  # resumes from another run's checkpoint.
  keras.backend.clear_session()
  try:
    trainer.train(config)
  finally:
    undo_process_settings()
  return run_record.load_run_record(flags["model_dir"])


def undo_process_settings() -> None:
  """Undoes what a trainer run sets for the whole process: the next run
  here, or the next test, must not inherit --deterministic or a
  --precision policy (a layer built later would compute in bfloat16)."""
  tf_config.disable_op_determinism()
  keras.mixed_precision.set_global_policy("float32")
