"""Checkpoints for TensorFlow/Keras training: two-phase async and baselines.

Modules, one job each:
  checkpointer  Checkpointer: the one interface the training loops call
  snapshot      the copy of model (seed states included) and optimizer state
  baseline      TensorFlow's own checkpoint (sync, tf_async)
  callback      AsyncCheckpoint, the Keras callback for any model.fit

The framework-neutral parts (cadence, background persist, file format,
retention, failure policies) are in overlap_core/checkpoint.
"""

from tfoverlap.checkpoint.callback import AsyncCheckpoint, ResumePosition
from tfoverlap.checkpoint.checkpointer import (Checkpointer, ResumePoint,
                                               build_checkpointer,
                                               checkpoint_dir)
from tfoverlap.checkpoint.snapshot import CheckpointMismatchError
from overlap_core.checkpoint.files import (CheckpointError,
                                             CorruptCheckpointError)

__all__ = [
    "AsyncCheckpoint",
    "CheckpointError",
    "CheckpointMismatchError",
    "Checkpointer",
    "CorruptCheckpointError",
    "ResumePoint",
    "ResumePosition",
    "build_checkpointer",
    "checkpoint_dir",
]
