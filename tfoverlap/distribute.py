"""TensorFlow strategies by name, and the host set-up they need first.

`configure_host()` must run before TensorFlow initializes its devices (the
first op or device query): it fixes thread pools and, for `mirrored` on a
host without GPUs, splits the CPU into logical devices so the strategy runs
anywhere. `build_strategy()` then maps the flag names onto tf.distribute:

  default       tf.distribute.get_strategy(): no replicas, no all-reduce
  one_device    OneDeviceStrategy on the first GPU, else the CPU
  mirrored      MirroredStrategy over --num_devices local devices
  multi_worker  MultiWorkerMirroredStrategy over the TF_CONFIG cluster, or
                the srun step's tasks (overlap_core.runtime.cluster)
  horovod       refused (overlap_core.runtime.compat_table): Horovod's
                TensorFlow extension does not build here
"""

import os

import tensorflow as tf

from overlap_core.runtime import cluster, waits
from overlap_core.runtime.config import (ConfigError, DistributeConfig,
                                         RunConfig)

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def configure_host(distribute: DistributeConfig, run: RunConfig) -> None:
  """Thread pools and logical devices; call before any TensorFlow op."""
  if run.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(run.intra_op_threads)
  if run.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(run.inter_op_threads)
  if distribute.strategy == "mirrored" and not _gpus():
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing is None:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] *
          distribute.num_devices)


def _gpus():
  return tf.config.list_physical_devices("GPU")


def mirrored_devices(num_devices: int) -> list:
  """The local devices a mirrored strategy replicates over."""
  gpus = _gpus()
  if gpus:
    if len(gpus) < num_devices:
      raise ConfigError("num_devices", num_devices,
                        f"this host has {len(gpus)} GPU(s)")
    return [f"/gpu:{i}" for i in range(num_devices)]
  cpus = tf.config.list_logical_devices("CPU")
  if len(cpus) < num_devices:
    raise ConfigError(
        "num_devices", num_devices,
        f"only {len(cpus)} logical CPU device(s) exist: configure_host() "
        "must run before TensorFlow initializes")
  return [f"/cpu:{i}" for i in range(num_devices)]


def communication_options(cfg: DistributeConfig):
  """Collective options for multi_worker: implementation, pack size, and
  the timeout that turns a peer that stopped answering into an error
  (PyTorch's collectives use the same one)."""
  return tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=int(cfg.all_reduce_pack_mb * 1024 * 1024),
      timeout_seconds=waits.collective_timeout_s(),
      implementation=_IMPLEMENTATIONS[cfg.all_reduce])


def cluster_from_env():
  """(worker index, number of workers) from TF_CONFIG or the srun step's
  Slurm variables, or (0, 1) outside a multi-worker job."""
  found = cluster.tf_cluster_from_env(os.environ)
  if found is None:
    return 0, 1
  return found.task_index, found.num_workers




def cluster_resolver(found: cluster.Cluster):
  """The resolver MultiWorkerMirroredStrategy gets for `found`.

  None for TF_CONFIG, which TensorFlow reads itself; a Slurm step becomes
  the same worker list TF_CONFIG would hold. TensorFlow's own
  SlurmClusterResolver is not used: it counts GPUs with nvidia-smi and
  fails on nodes without GPUs.
  """
  if found.source == "TF_CONFIG":
    return None
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": list(found.workers)}),
      task_type="worker", task_id=found.task_index, rpc_layer="grpc")


# How far apart the collective keys of two MirroredStrategies of one
# process start. Each strategy numbers its collectives from its class's key
# base; the runtime remembers a collective's shape by its keys, so a second
# strategy starting where the first did is refused with "Shape mismatch in
# the collective instance". TensorFlow's own tests space them the same way.
_COLLECTIVE_KEY_SPACING = 100_000


def mirrored_strategy(devices, *, cross_device_ops=None
                      ) -> tf.distribute.MirroredStrategy:
  """A MirroredStrategy whose collectives cannot collide with those of any
  strategy made before it in this process (a notebook's second run, a
  test session)."""
  # pylint: disable-next=protected-access
  tf.distribute.MirroredStrategy._collective_key_base += (
      _COLLECTIVE_KEY_SPACING)
  return tf.distribute.MirroredStrategy(devices,
                                        cross_device_ops=cross_device_ops)


def build_strategy(cfg: DistributeConfig) -> tf.distribute.Strategy:
  """The tf.distribute strategy named by `cfg.strategy`.

  Which strategies and knobs combine is checked before, by
  `trainer.check_supported` (the compatibility table).

  Raises:
    ConfigError: for a multi_worker run whose TF_CONFIG does not match
      --num_workers, or a strategy TensorFlow has not.
  """
  if cfg.strategy == "default":
    return tf.distribute.get_strategy()
  if cfg.strategy == "one_device":
    return tf.distribute.OneDeviceStrategy(default_device())
  if cfg.strategy == "mirrored":
    devices = mirrored_devices(cfg.num_devices)
    cross_device_ops = (tf.distribute.NcclAllReduce()
                        if cfg.all_reduce == "nccl" else None)
    return mirrored_strategy(devices, cross_device_ops=cross_device_ops)
  if cfg.strategy == "multi_worker":
    found = cluster.tf_cluster_from_env(os.environ)
    if found is None and cfg.num_workers > 1:
      raise ConfigError(
          "strategy", "multi_worker",
          f"--num_workers={cfg.num_workers} needs TF_CONFIG or an srun "
          "step; start the workers with python -m tfoverlap.launch "
          f"--num_workers={cfg.num_workers} -- <trainer flags>, or see "
          "docs/overlaps/several-hosts.md")
    num_workers = found.num_workers if found else 1
    if num_workers != cfg.num_workers:
      raise ConfigError("num_workers", cfg.num_workers,
                        f"{found.source} lists {num_workers} worker(s)")
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=cluster_resolver(found) if found else None,
        communication_options=communication_options(cfg))
  raise ConfigError("strategy", cfg.strategy,
                    "allowed: default, one_device, mirrored, multi_worker")


def is_default_strategy(strategy) -> bool:
  """True for the default (no-op) strategy that exists outside any scope."""
  if strategy is None:
    return True
  if tf.distribute.has_strategy():
    # Inside some strategy's scope the default one cannot be fetched; a
    # scope is only ever entered for a real strategy.
    return False
  return strategy is tf.distribute.get_strategy()


def default_device() -> str:
  """Where the default strategy computes: the first GPU, else the CPU."""
  gpus = tf.config.list_logical_devices("GPU")
  return gpus[0].name if gpus else "/cpu:0"


def replica_devices(strategy: tf.distribute.Strategy) -> list:
  """The local devices the strategy's replicas run on, in replica order."""
  if is_default_strategy(strategy):
    return [default_device()]
  return list(strategy.extended.worker_devices)


def describe_strategy(strategy: tf.distribute.Strategy,
                      cfg: DistributeConfig) -> dict:
  """What run.json records about the strategy actually built."""
  return {
      "name": cfg.strategy,
      "class": type(strategy).__name__,
      "num_replicas": strategy.num_replicas_in_sync,
      "devices": replica_devices(strategy),
      "all_reduce": cfg.all_reduce,
      "all_reduce_pack_mb": cfg.all_reduce_pack_mb,
  }


def make_agree(strategy: tf.distribute.Strategy):
  """An all-reduce maximum over workers, for decisions all must share.

  Returns None when there is one worker: nothing to agree with. Every
  worker must call the returned function at the same point (a collective).
  """
  # Only MultiWorkerMirroredStrategy's extended object counts workers.
  if getattr(strategy.extended, "_num_workers", 1) <= 1:
    return None

  def replica_max(vector):
    # ReduceOp has no MAX: gather every replica's vector, then take it.
    gathered = tf.distribute.get_replica_context().all_gather(
        vector[tf.newaxis], axis=0)
    return tf.reduce_max(gathered, axis=0)

  @tf.function
  def reduce_max(vector):
    return strategy.run(replica_max, args=(vector,))

  def agree(values):
    reduced = reduce_max(tf.constant(values, tf.float64))
    return strategy.experimental_local_results(reduced)[0].numpy().tolist()

  return agree
