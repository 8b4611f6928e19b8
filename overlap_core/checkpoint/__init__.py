"""The asynchronous two-phase checkpoint engine, shared by both frameworks.

  cadence      CadencePolicy: every N steps, or the smallest interval under an
               overhead bound (CheckFreq), agreed across workers
  engine       CheckpointEngine: the background persist, busy and error
               policies, the final save, the numbers in run.json
  persist      the persist thread, every wait for it bounded
  files        the checkpoint directory: atomic commit and overwrite, crash
               recovery, retention by trust, fallback from a corrupt one
  layout       one checkpoint's files: manifest, checksums, verified reads
  durable      each filesystem step of a commit, fsynced, with a failpoint
  tensor_file  the safetensors format, read and written with NumPy
  checkpointer Checkpointer: the interface the training loops call, which
               each framework subclasses with its snapshot and restore;
               the refusal of another run's checkpoints
  mismatch     whether a checkpoint fits a model: the first tensor that
               differs, named

Each framework side only takes the snapshot (tfoverlap/checkpoint,
torch_parity/checkpoint) and restores it; everything here is framework-free.
"""
