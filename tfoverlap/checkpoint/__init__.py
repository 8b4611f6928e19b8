"""Checkpoints for TensorFlow/Keras training: two-phase async and baselines.

Modules, one job each:
  checkpointer  Checkpointer: the one interface the training loops call
  snapshot      the copy of model (seed states included) and optimizer state
  baseline      TensorFlow's own checkpoint (sync, tf_async)
  callback      AsyncCheckpoint, the Keras callback for any model.fit

The framework-neutral parts (the Checkpointer interface, cadence,
background persist, file format, retention, failure policies, the "does not
fit" check) are in overlap_core/checkpoint.
"""

from overlap_core.checkpoint.checkpointer import CheckpointsExistError
from overlap_core.checkpoint.engine import ResumePoint, checkpoint_dir
from overlap_core.checkpoint.files import (CheckpointError,
                                           CheckpointMismatchError,
                                           CorruptCheckpointError)
from overlap_core.runtime.dir_lock import DirectoryInUseError
from tfoverlap.checkpoint.callback import AsyncCheckpoint, ResumePosition
from tfoverlap.checkpoint.checkpointer import (Checkpointer,
                                               build_checkpointer)

__all__ = [
    "AsyncCheckpoint",
    "CheckpointError",
    "CheckpointMismatchError",
    "Checkpointer",
    "CheckpointsExistError",
    "CorruptCheckpointError",
    "DirectoryInUseError",
    "ResumePoint",
    "ResumePosition",
    "build_checkpointer",
    "checkpoint_dir",
]
