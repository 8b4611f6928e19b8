"""The asynchronous two-phase checkpoint engine, shared by both frameworks.

  cadence      CadencePolicy: every N steps, or the smallest interval under an
               overhead bound (CheckFreq), agreed across workers
  engine       CheckpointEngine: the background persist, busy and error
               policies, the numbers in run.json
  files        a checkpoint on disk: atomic commit, manifest, retention,
               fallback from a corrupt one
  tensor_file  the safetensors format, read and written with NumPy
  checkpointer Checkpointer: the interface the training loops call, which
               each framework subclasses with its snapshot and restore;
               the refusal of another run's checkpoints
  mismatch     whether a checkpoint fits a model: the first tensor that
               differs, named

Each framework side only takes the snapshot (tfoverlap/checkpoint,
torch_parity/checkpoint) and restores it; everything here is framework-free.
"""
