"""PyTorch data parallelism by strategy name, and the host set-up it needs.

The flag names mean what they mean on the TensorFlow side, mapped onto what
PyTorch offers:

  default       one process, one device (the first GPU, else the CPU); no
                all-reduce
  one_device    the same single device, named explicitly; no all-reduce
  mirrored      DistributedDataParallel over --num_devices local processes,
                one per GPU (or, without GPUs, one per equal share of the
                CPU cores). PyTorch has no single-process multi-device data
                parallelism any more (DataParallel is deprecated in favour
                of DDP), so `python -m torch_parity.train` starts the
                processes itself, the way one TensorFlow process drives all
                its MirroredStrategy replicas.
  multi_worker  DistributedDataParallel over the torchrun world
                (--num_workers processes: torch_parity.launch or torchrun)
  horovod       Horovod's DistributedOptimizer over the horovodrun world
                (--num_workers processes)

All-reduce knobs, for the strategies that have an all-reduce:

  --all_reduce=auto   the backend PyTorch picks: NCCL on GPUs, else gloo
                      (Horovod: its own choice, gloo on the CPU)
  --all_reduce=ring   gloo, whose allreduce is a ring (on GPU tensors too,
                      staged through the host), as TensorFlow's RING is its
                      non-NCCL ring
  --all_reduce=nccl   NCCL; needs GPUs
  --all_reduce=off    a diagnostic: the whole run inside DDP's no_sync, so
                      no gradient is all-reduced and the replicas train
                      apart; it measures what the all-reduce costs (DDP
                      only: `compat_table` refuses it elsewhere)
  --all_reduce_pack_mb  DDP's bucket_cap_mb, or Horovod's fusion threshold
                      (HOROVOD_FUSION_THRESHOLD); 0 = the framework's
                      default (DDP 25 MB, Horovod 128 MB)
"""

import contextlib
import datetime
import os
import time
from typing import List, Optional

import torch
import torch.distributed as dist
from torch import nn

from overlap_core.planning.dims import ParallelDims
from overlap_core.runtime import cluster, comm_stats, waits
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.config import (ConfigError, DistributeConfig,
                                         RunConfig)
from torch_parity import rendezvous

DDP_STRATEGIES = ("mirrored", "multi_worker")
ALL_REDUCE_OFF = "off"
HOROVOD_REFUSAL_NCCL = ("this Horovod was built without NCCL "
                        "(tools/install_horovod.sh builds gloo); allowed with "
                        "horovod: auto or ring")
_MB = 1024 * 1024


def configure_host(run: RunConfig) -> None:
  """Thread pools; call before any parallel torch work (inter-op is fixed
  once the first inter-op task runs).

  A second run in the same process (`trainer.train` called again, a
  notebook, a benchmark that runs its sides in one process) asks for the
  pool it already has: torch refuses to set the inter-op pool twice, so
  an unchanged size is left as it is and only a different one is asked
  for, which torch then refuses in its own words. TensorFlow's setters
  behave so by themselves (`tfoverlap.distribute.configure_host`).
  """
  if run.intra_op_threads:
    torch.set_num_threads(run.intra_op_threads)
  if (run.inter_op_threads
      and run.inter_op_threads != torch.get_num_interop_threads()):
    torch.set_num_interop_threads(run.inter_op_threads)


def is_launched() -> bool:
  """True inside a process that torchrun, torch_parity.launch or
  horovodrun started as one rank of a world."""
  return "RANK" in os.environ or "HOROVOD_RANK" in os.environ


def _env_int(name: str, default: int) -> int:
  """An integer the launcher put in the environment (torchrun's names)."""
  raw = os.environ.get(name, str(default))
  try:
    return int(raw)
  except ValueError:
    raise ConfigError("strategy", raw,
                      f"the launcher's {name} must be an integer") from None


def check_strategy(cfg: DistributeConfig, *, num_gpus: int) -> None:
  """Refuses more mirrored devices than this host has GPUs (which knobs a
  strategy takes is the compatibility table's: `trainer.check_supported`).

  Raises:
    ConfigError: naming num_devices.
  """
  if cfg.strategy == "mirrored" and num_gpus and cfg.num_devices > num_gpus:
    raise ConfigError("num_devices", cfg.num_devices,
                      f"this host has {num_gpus} GPU(s)")


def horovod_env(cfg: DistributeConfig) -> dict:
  """Environment Horovod reads at hvd.init(): tensor fusion and timeouts.

  The launcher hands it to horovodrun and the trainer applies it before
  hvd.init(), so a run under a plain horovodrun gets the same settings.
  """
  env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(waits.collective_timeout_s())}
  if cfg.all_reduce_pack_mb:
    env["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.all_reduce_pack_mb * _MB))
  if cfg.all_reduce == "ring":
    # Horovod's CPU collectives through gloo are ring all-reduces.
    env["HOROVOD_CPU_OPERATIONS"] = "gloo"
  return env


def _check_world(cfg: DistributeConfig, world_size: int,
                 local_world_size: int) -> None:
  """The process world must be the one the flags describe."""
  if cfg.strategy in ("default", "one_device") and world_size != 1:
    raise ConfigError("strategy", cfg.strategy,
                      f"runs one process, but this one is part of a world "
                      f"of {world_size}; allowed with more processes: "
                      "mirrored, multi_worker or horovod")
  if cfg.strategy == "mirrored":
    if world_size != cfg.num_devices:
      raise ConfigError("num_devices", cfg.num_devices,
                        f"the launched world has {world_size} process(es)")
    if local_world_size != world_size:
      raise ConfigError("strategy", "mirrored",
                        "replicates over the devices of one host; allowed "
                        "across hosts: multi_worker")
  if cfg.strategy in ("multi_worker", "horovod") and (world_size !=
                                                       cfg.num_workers):
    raise ConfigError("num_workers", cfg.num_workers,
                      f"the launched world has {world_size} process(es)")


def _device_for(local_rank: int) -> torch.device:
  """The first GPU for rank 0 of a host, the next for rank 1, ...; else CPU."""
  if torch.cuda.is_available():
    if local_rank >= torch.cuda.device_count():
      raise ConfigError("num_workers", os.environ.get("WORLD_SIZE", ""),
                        f"local rank {local_rank} has no GPU of its own; "
                        f"allowed: at most {torch.cuda.device_count()} "
                        "processes per host, one per GPU")
    return torch.device("cuda", local_rank)
  return torch.device("cpu")


def _ddp_backend(cfg: DistributeConfig, device: torch.device) -> str:
  if cfg.all_reduce == "ring":
    return "gloo"
  if cfg.all_reduce == "nccl" or device.type == "cuda":
    return "nccl"
  return "gloo"


class Strategy:
  """One process's part in a run's parallelism: its device, its place in
  the world (a validated `ParallelDims`), and how it all-reduces.

  The base is one process with no all-reduce (`default`, `one_device`);
  `DDPStrategy` and `HorovodStrategy` override the parts that differ.
  `parallelize.parallelize` applies them to the model and optimizer.

  Usage:
    strategy = build_strategy(cfg)
    model, optimizer = parallelize.parallelize(model, optimizer, strategy)
    ...
    loss = strategy.mean_over_replicas(loss)
    strategy.close()

  Attributes:
    dims: the run's degrees of parallelism; world_size = dims.world_size.
    device: where this process computes.
    rank, local_rank: this process in the world, and on its host.
    worker_index, num_workers: the worker this process reports as, in the
      TensorFlow sense: a mirrored replica is part of worker 0, a
      multi_worker or horovod rank is a worker of its own.
    writes_outputs: whether this process writes run.json and the trace.
  """

  # Which library's data parallelism run.json names, TensorFlow's way.
  class_name = "none"
  # Times the all-reduce the step waited for (`comm_stats`); None where
  # there is no all-reduce the ledger can see.
  comm_timer: Optional[comm_stats.ExposedCommTimer] = None

  def __init__(self, cfg: DistributeConfig, *, dims: ParallelDims, device,
               rank: int = 0, local_rank: int = 0):
    self.cfg = cfg
    self.dims = dims
    self.device = device
    self.rank = rank
    self.local_rank = local_rank
    mirrored = cfg.strategy == "mirrored"
    self.worker_index = 0 if mirrored else rank
    self.num_workers = 1 if mirrored else dims.world_size
    self.writes_outputs = rank == 0 or not mirrored

  @property
  def world_size(self) -> int:
    return self.dims.world_size

  @property
  def is_distributed(self) -> bool:
    return self.dims.world_size > 1

  @property
  def all_reduces_in_optimizer(self) -> bool:
    """True when the gradient all-reduce finishes inside optimizer.step()
    (Horovod), so a gradient scaler must synchronize before unscaling."""
    return False

  def wrap_model(self, model: nn.Module) -> nn.Module:
    """The module the train step calls; itself without data parallelism."""
    return model

  @property
  def can_pause_all_reduce(self) -> bool:
    """Whether `all_reduce_paused` can run a step without its gradient
    all-reduce (DDP's no_sync)."""
    return False

  def all_reduce_paused(self):
    """The enclosed steps all-reduce no gradient and wait for no replica:
    the step's own work, which `reference_step` times before training."""
    raise RuntimeError(f"{type(self).__name__} cannot pause its all-reduce")

  def gradients_unsynced(self):
    """The enclosed steps all-reduce no gradient, but still average their
    loss over the replicas, as every step of --all_reduce=off does: a
    training step without its gradient all-reduce
    (--paired_removal=all_reduce)."""
    raise RuntimeError(f"{type(self).__name__} cannot pause its all-reduce")

  def wrap_optimizer(self, optimizer, model: nn.Module):
    """The optimizer the train step steps; itself unless it all-reduces."""
    del model
    return optimizer

  def sum_over_replicas(self, tensor: torch.Tensor) -> torch.Tensor:
    """The sum of `tensor` over every process (itself when single)."""
    return tensor

  def backward(self, loss: torch.Tensor) -> None:
    """`loss.backward()`; where the all-reduce finishes inside it (DDP),
    timing the wait for it that backward's compute did not hide."""
    loss.backward()

  def synchronize(self, optimizer) -> None:
    """Finishes the gradient all-reduce before the update where the
    optimizer does it (Horovod), timing the wait; else nothing."""
    del optimizer

  def split_compute(self, start_s: float, end_s: float) -> list:
    """A step's compute span as the ledger records it when the all-reduce
    is timed: `exposed_comm` (the waits), then `compute`. Called once the
    step is over and the device waited for."""
    return ledger_lib.carve_compute(start_s, end_s, ledger_lib.EXPOSED_COMM,
                                    self.comm_timer.take_s())

  def discard_step_timings(self) -> None:
    """Drops the all-reduce waits of steps the ledger does not record
    (the calibration of `reference_step`), so the next recorded step
    carries only its own."""
    if self.comm_timer is not None:
      self.split_compute(0.0, 0.0)

  def max_over_processes(self, values):
    """The element-wise maximum of a list of floats over every process; a
    collective that every process must call at the same point."""
    return list(values)

  def sum_over_processes(self, values):
    """The element-wise sum of a list of floats over every process; a
    collective, like `max_over_processes`."""
    return list(values)

  def gather_over_processes(self, value) -> list:
    """Every process's `value` (picklable), in rank order; a collective,
    like `max_over_processes`. Only DDP gathers objects (what
    --all_reduce=off records); elsewhere a world of one."""
    if self.is_distributed:
      raise NotImplementedError(
          f"{type(self).__name__} gathers no objects over processes")
    return [value]

  def mean_over_replicas(self, tensor: torch.Tensor) -> torch.Tensor:
    if not self.is_distributed:
      return tensor
    return self.sum_over_replicas(tensor) / self.world_size

  def average_buffers(self, model: nn.Module) -> None:
    """Makes every rank's floating-point buffers (BatchNorm's running
    statistics) their mean over ranks.

    Each rank updates them from its own shard; TensorFlow keeps them as
    on-read MEAN variables, so both frameworks end with the same meaning,
    and every rank with the same weights.
    """
    if not self.is_distributed:
      return
    with torch.no_grad():
      for buffer in model.buffers():
        if buffer.is_floating_point():
          buffer.copy_(self.mean_over_replicas(buffer))

  def describe(self) -> dict:
    """What run.json records about the strategy (TensorFlow's keys)."""
    local_replicas = self.world_size if self.cfg.strategy == "mirrored" else 1
    return {
        "name": self.cfg.strategy,
        "class": self.class_name,
        "num_replicas": self.world_size,
        "devices": [str(self.device)] * local_replicas,
        "all_reduce": self.cfg.all_reduce,
        "all_reduce_pack_mb": self.cfg.all_reduce_pack_mb,
        "parallel_dims": self.dims.describe(),
    }

  def describe_backend(self) -> str:
    """One line for run.json's notes: what carries the all-reduce."""
    return f"one process on {self.device}"

  def close(self) -> None:
    """Leaves the world; every process calls it at the end."""


class DDPStrategy(Strategy):
  """DistributedDataParallel over a torch.distributed process group."""

  class_name = "DistributedDataParallel"

  def __init__(self, cfg: DistributeConfig, *, backend: str, **kwargs):
    super().__init__(cfg, **kwargs)
    self.backend = backend
    self._wrapped: List[nn.parallel.DistributedDataParallel] = []
    self.comm_timer = comm_stats.ExposedCommTimer()
    self._bucket_clock = _BucketClock(self.device)
    # --all_reduce=off: every wrapped module stays inside no_sync until
    # close(), so every step, whatever calls it, reduces nothing.
    self._no_sync = contextlib.ExitStack()
    self._replicas_apart = False  # inside all_reduce_paused()

  def wrap_model(self, model: nn.Module, process_group=None) -> nn.Module:
    """DDP all-reduces gradient buckets while backward still runs, over
    `process_group` (default: the world; a pipeline stage's replicas)."""
    bucket_cap_mb = self.cfg.all_reduce_pack_mb or None  # None: DDP's 25 MB
    wrapped = nn.parallel.DistributedDataParallel(
        model, process_group=process_group,
        device_ids=[self.device.index] if self.device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        # Each replica keeps its own BatchNorm statistics and
        # average_buffers() reads their mean, as TensorFlow's on-read MEAN
        # variables do (and Horovod, which broadcasts no buffers); DDP's
        # default would overwrite them with rank 0's before every forward.
        # They are still synced once, at wrap time, when all are equal.
        forward_sync_buffers=False)
    # The default all-reduce, stamped with the time each bucket is handed
    # over: the last stamp is where backward's own work ended.
    wrapped.register_comm_hook((process_group, self._bucket_clock),
                               _stamped_allreduce_hook)
    if self.cfg.all_reduce == ALL_REDUCE_OFF:
      # no_sync must hold from the forward on: the forward is where DDP
      # prepares the reducer for the backward's all-reduce. With no bucket
      # handed over, the ledger records no exposed_comm (`_BucketClock`).
      self._no_sync.enter_context(wrapped.no_sync())
    self._wrapped.append(wrapped)
    return wrapped

  @property
  def can_pause_all_reduce(self) -> bool:
    return bool(self._wrapped) and self.cfg.all_reduce != ALL_REDUCE_OFF

  @contextlib.contextmanager
  def gradients_unsynced(self):
    """Every wrapped module inside no_sync, from the forward on, where DDP
    prepares the backward's all-reduce."""
    with contextlib.ExitStack() as paused:
      for wrapped in self._wrapped:
        paused.enter_context(wrapped.no_sync())
      yield

  @contextlib.contextmanager
  def all_reduce_paused(self):
    """`gradients_unsynced`, and the step's loss this replica's own: no
    collective in the step, where a replica would wait for a slower
    one."""
    with self.gradients_unsynced():
      self._replicas_apart = True
      try:
        yield
      finally:
        self._replicas_apart = False

  def mean_over_replicas(self, tensor: torch.Tensor) -> torch.Tensor:
    if self._replicas_apart:
      return tensor
    return super().mean_over_replicas(tensor)

  def backward(self, loss: torch.Tensor) -> None:
    """DDP's reducer waits, at backward's end, for every bucket's
    all-reduce and copies the averaged gradients back: from the last
    bucket's hand-over to backward's return is the exposed wait."""
    self._bucket_clock.start_backward()
    loss.backward()
    self._bucket_clock.end_backward(self.comm_timer)

  def split_compute(self, start_s: float, end_s: float) -> list:
    self._bucket_clock.resolve(self.comm_timer)
    return super().split_compute(start_s, end_s)

  def sum_over_replicas(self, tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor

  def max_over_processes(self, values):
    return self._reduce_floats(values, dist.ReduceOp.MAX)

  def sum_over_processes(self, values):
    return self._reduce_floats(values, dist.ReduceOp.SUM)

  def gather_over_processes(self, value) -> list:
    gathered = [None] * self.world_size
    dist.all_gather_object(gathered, value)
    return gathered

  def _reduce_floats(self, values, op):
    # NCCL reduces device tensors only; gloo reduces host ones.
    device = self.device if self.backend == "nccl" else torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()

  def describe_backend(self) -> str:
    if self.cfg.all_reduce == ALL_REDUCE_OFF:
      return (f"DistributedDataParallel over {self.backend}, every step "
              "under no_sync (--all_reduce=off): no gradient all-reduced, "
              "the replicas trained apart")
    bucket = self.cfg.all_reduce_pack_mb or 25
    return (f"DistributedDataParallel over {self.backend}, bucket_cap_mb "
            f"{bucket:g}")

  def close(self) -> None:
    # DDP's reducer holds the process group. Were it the last holder, the
    # group would be destroyed when the trainer's frame lets go of the
    # model: in the reducer's deallocation, with the GIL held, where
    # ProcessGroupGloo's destructor joins a worker thread that may still be
    # freeing the last all-reduce's tensors, which needs the GIL (seen
    # once: a rank hung at exit after its last collective; pytorch#56297).
    # Dropped here, the reducers leave the group to destroy_process_group,
    # whose destructor releases the GIL.
    self._no_sync.close()
    for wrapped in self._wrapped:
      wrapped.reducer = None
      wrapped.logger = None
    self._wrapped.clear()
    if dist.is_initialized():
      dist.destroy_process_group()


def _stamped_allreduce_hook(state, bucket):
  """DDP's default all-reduce (averaged over the group), after stamping
  the bucket's hand-over on the clock."""
  from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # pylint: disable=g-import-not-at-top
  process_group, clock = state
  clock.stamp()
  return default_hooks.allreduce_hook(process_group, bucket)


class _BucketClock:
  """When backward last handed a gradient bucket to the all-reduce, and
  when it returned.

  On the CPU both are host times. On a GPU the host runs ahead of the
  device, so both are CUDA events on the current (training) stream: the
  last bucket's completes when its gradients are computed, backward's end
  after the stream waited for every all-reduce; their distance is read
  once the loop has waited for the step (`resolve`).
  """

  def __init__(self, device: torch.device):
    self._cuda = torch.device(device).type == "cuda"
    self._last = None  # the last bucket's stamp in this backward
    self._pending = []  # CUDA (last bucket, backward end) event pairs

  def _now(self):
    if not self._cuda:
      return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event

  def start_backward(self) -> None:
    self._last = None

  def stamp(self) -> None:
    self._last = self._now()

  def end_backward(self, timer: comm_stats.ExposedCommTimer) -> None:
    if self._last is None:  # no bucket (no_sync): nothing was reduced
      timer.add(0.0)
    elif self._cuda:
      self._pending.append((self._last, self._now()))
    else:
      timer.add(time.perf_counter() - self._last)
    self._last = None

  def resolve(self, timer: comm_stats.ExposedCommTimer) -> None:
    for start, end in self._pending:
      timer.add(start.elapsed_time(end) / 1e3)
    self._pending.clear()


class HorovodStrategy(Strategy):
  """Horovod's DistributedOptimizer over the horovodrun world."""

  class_name = "horovod.torch.DistributedOptimizer"

  def __init__(self, cfg: DistributeConfig, **kwargs):
    super().__init__(cfg, **kwargs)
    self.comm_timer = comm_stats.ExposedCommTimer()

  @property
  def all_reduces_in_optimizer(self) -> bool:
    return True

  def wrap_optimizer(self, optimizer, model: nn.Module):
    """All-reduce from backward hooks, after every rank starts from rank
    0's weights and optimizer state."""
    import horovod.torch as hvd  # pylint: disable=g-import-not-at-top
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if optimizer.state_dict()["state"]:
      # Only restored state needs sharing: Horovod would fill an empty
      # state with a zero-gradient step, which counts as Adam's first.
      hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())

  def synchronize(self, optimizer) -> None:
    """Horovod's synchronize waits for every all-reduce its backward hooks
    started: all of it is the exposed wait. The step then runs under
    `optimizer.skip_synchronize()` (`steps.make_train_step`). The host
    waits here for Horovod's completion of each tensor, so the host clock
    times it on a GPU too."""
    start = time.perf_counter()
    optimizer.synchronize()
    self.comm_timer.add(time.perf_counter() - start)

  def sum_over_replicas(self, tensor: torch.Tensor) -> torch.Tensor:
    import horovod.torch as hvd  # pylint: disable=g-import-not-at-top
    return hvd.allreduce(tensor, op=hvd.Sum)

  def max_over_processes(self, values):
    return self._reduce_floats(values, "Max")

  def sum_over_processes(self, values):
    return self._reduce_floats(values, "Sum")

  @staticmethod
  def _reduce_floats(values, op_name: str):
    import horovod.torch as hvd  # pylint: disable=g-import-not-at-top
    return hvd.allreduce(torch.tensor(values, dtype=torch.float64),
                         op=getattr(hvd, op_name)).tolist()

  def describe_backend(self) -> str:
    import horovod.torch as hvd  # pylint: disable=g-import-not-at-top
    fusion_mb = (self.cfg.all_reduce_pack_mb or 128)
    return (f"Horovod over {'gloo' if hvd.gloo_enabled() else 'MPI'}, "
            f"fusion threshold {fusion_mb:g} MB")

  def close(self) -> None:
    import horovod.torch as hvd  # pylint: disable=g-import-not-at-top
    hvd.shutdown()


def _dims(cfg: DistributeConfig) -> ParallelDims:
  """Every process a data-parallel replica of the whole model, until the
  trainer puts the world on its pipeline mesh (`apply_pipeline_dims`).
  `_check_world` has made the launched world the one the flags describe."""
  return ParallelDims.for_run(strategy=cfg.strategy,
                              num_workers=cfg.num_workers,
                              num_devices=cfg.num_devices, framework="pytorch")


def _launched_world(cfg: DistributeConfig):
  """This rank's world from its launcher's variables, or None.

  torchrun's (and torch_parity.launch's) RANK, WORLD_SIZE, ... for either
  DDP strategy; for multi_worker also an srun step's tasks, which become
  the same variables here so that torch's env:// rendezvous reads them.
  """
  if cfg.strategy == "mirrored" and "RANK" not in os.environ:
    return None
  world = cluster.torch_world_from_env(os.environ)
  if world is None or world.source != "slurm":
    return world
  if world.world_size == 1:
    return None  # one task: nothing to meet, so no store to serve
  os.environ.update(world.torchrun_env())
  return world


def _build_ddp(cfg: DistributeConfig) -> Strategy:
  world = _launched_world(cfg)
  if world is not None:
    rank, world_size = world.rank, world.world_size
    local_rank, local_world_size = world.local_rank, world.local_world_size
  elif (cfg.strategy == "mirrored" and cfg.num_devices == 1) or (
      cfg.strategy == "multi_worker" and cfg.num_workers == 1):
    rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
  elif cfg.strategy == "mirrored":
    raise ConfigError("strategy", "mirrored",
                      f"--num_devices={cfg.num_devices} needs one process "
                      "per device; python -m torch_parity.train starts them")
  else:
    raise ConfigError(
        "strategy", "multi_worker",
        f"--num_workers={cfg.num_workers} needs a torchrun world or an srun "
        "step; start the workers with python -m torch_parity.launch "
        f"--num_workers={cfg.num_workers} -- <trainer flags>, or see the "
        "docs/overlaps/several-hosts.md")
  _check_world(cfg, world_size, local_world_size)
  device = _device_for(local_rank)
  backend = _ddp_backend(cfg, device)
  if device.type == "cuda":
    torch.cuda.set_device(device)
  timeout = datetime.timedelta(seconds=waits.collective_timeout_s())
  if world is not None:
    rendezvous.join_launched_world(backend, rank=rank, world_size=world_size,
                                   timeout=timeout)
  else:
    # A world of one needs no rendezvous: an in-process store will do.
    rendezvous.init_process_group(backend, store=dist.HashStore(), rank=0,
                                  world_size=1, timeout=timeout)
  return DDPStrategy(cfg, backend=backend, dims=_dims(cfg),
                     device=device, rank=rank, local_rank=local_rank)


def _build_horovod(cfg: DistributeConfig) -> Strategy:
  try:
    import horovod.torch as hvd  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError("strategy", "horovod",
                      f"Horovod's PyTorch extension is not installed ({e}); "
                      "install it with tools/install_horovod.sh") from None
  if cfg.num_workers > 1 and "HOROVOD_RANK" not in os.environ:
    raise ConfigError(
        "strategy", "horovod",
        f"--num_workers={cfg.num_workers} needs a horovodrun world; start "
        f"it with python -m torch_parity.launch --num_workers="
        f"{cfg.num_workers} -- --strategy=horovod <trainer flags>")
  os.environ.update(horovod_env(cfg))
  hvd.init()
  _check_world(cfg, hvd.size(), hvd.local_size())
  if cfg.all_reduce == "nccl" and not hvd.nccl_built():
    raise ConfigError("all_reduce", "nccl", HOROVOD_REFUSAL_NCCL)
  device = _device_for(hvd.local_rank())
  if device.type == "cuda":
    torch.cuda.set_device(device)
  return HorovodStrategy(cfg, dims=_dims(cfg), device=device,
                         rank=hvd.rank(), local_rank=hvd.local_rank())


def apply_pipeline_dims(strategy: Strategy, num_stages: int) -> Strategy:
  """Puts the strategy's world on a pipeline x data-parallel mesh:
  `num_stages` stages, each replicated world / num_stages times.

  Raises:
    ConfigError: the world does not divide into that many stages.
  """
  cfg = strategy.cfg
  strategy.dims = ParallelDims.for_run(
      strategy=cfg.strategy, num_workers=cfg.num_workers,
      num_devices=cfg.num_devices, pipeline_stages=num_stages,
      framework="pytorch")
  return strategy


def make_agree(strategy: Strategy):
  """An all-reduce maximum over processes, for decisions all must share.

  Returns None for one process: nothing to agree with. Every process must
  call the returned function at the same point (a collective).
  """
  if strategy.world_size <= 1:
    return None
  return strategy.max_over_processes


def build_strategy(cfg: DistributeConfig) -> Strategy:
  """This process's part in the strategy named by `cfg.strategy`.

  Joins the process group (DDP) or Horovod's world, so every process of the
  job must call it, and `close()` it at the end.

  Raises:
    ConfigError: for a world that does not match the flags, or a strategy
      this host cannot run.
  """
  check_strategy(cfg, num_gpus=torch.cuda.device_count())
  if cfg.strategy in DDP_STRATEGIES:
    return _build_ddp(cfg)
  if cfg.strategy == "horovod":
    return _build_horovod(cfg)
  if cfg.strategy in ("default", "one_device"):
    _check_world(cfg, _env_int("WORLD_SIZE", 1), 1)
    return Strategy(cfg, dims=_dims(cfg), device=_device_for(0))
  raise ConfigError("strategy", cfg.strategy,
                    "allowed: default, one_device, mirrored, multi_worker, "
                    "horovod")
