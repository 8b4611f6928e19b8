"""Checkpoints for PyTorch training: two-phase async, and its sync baseline.

Modules, one job each:
  checkpointer  Checkpointer: the one interface the training loop calls
  snapshot      the copy of model, optimizer and RNG state, and its restore
  state_layout  tensors as arrays; an optimizer state_dict as names + JSON

The files are the TensorFlow side's (safetensors groups, state.json, a
checksummed manifest, atomic commits, the newest K kept), and so is
everything framework-neutral: cadence, background persist, failure and busy
policies, in overlap_core/checkpoint.
"""

from overlap_core.checkpoint.files import (CheckpointError,
                                             CheckpointMismatchError,
                                             CorruptCheckpointError)
from overlap_core.checkpoint.engine import ResumePoint, checkpoint_dir
from overlap_core.runtime.dir_lock import DirectoryInUseError
from torch_parity.checkpoint.checkpointer import (Checkpointer,
                                                  build_checkpointer)

__all__ = [
    "CheckpointError",
    "CheckpointMismatchError",
    "Checkpointer",
    "CorruptCheckpointError",
    "DirectoryInUseError",
    "ResumePoint",
    "build_checkpointer",
    "checkpoint_dir",
]
