"""Distribution flags: strategy, replicas, workers, all-reduce."""

from absl import flags

STRATEGIES = ["default", "one_device", "mirrored", "multi_worker", "horovod"]


def define_flags():
  flags.DEFINE_enum(
      "strategy", "mirrored", STRATEGIES,
      "default: no distribution. one_device: one device (GPU if any). "
      "mirrored: --num_devices local replicas (CPU split into logical "
      "devices when there is no GPU). multi_worker: --num_workers processes "
      "started by the launcher. horovod: Horovod (PyTorch side only).")
  flags.DEFINE_integer("num_devices", 2,
                       "Local replicas for --strategy=mirrored.",
                       lower_bound=1)
  flags.DEFINE_integer("num_workers", 1,
                       "Worker processes for --strategy=multi_worker.",
                       lower_bound=1)
  flags.DEFINE_enum(
      "all_reduce", "auto", ["auto", "ring", "nccl", "off"],
      "Gradient all-reduce implementation. off is a diagnostic, not a way "
      "to train: no gradient is all-reduced (PyTorch DDP runs every step "
      "under no_sync), so the replicas train apart and end with different "
      "weights; it exists only to measure what the all-reduce costs "
      "(benchmarks.ledger_fidelity), and only PyTorch's mirrored and "
      "multi_worker take it. --paired_removal=all_reduce measures the "
      "same in one run, in both frameworks.")
  flags.DEFINE_float(
      "all_reduce_pack_mb", 0.0,
      "Gradients are packed into all-reduce messages of about this many MB "
      "(tensor fusion); 0 = the framework's default.", lower_bound=0.0)
