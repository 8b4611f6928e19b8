"""One rank of benchmarks.all_reduce_sizes: all-reduce time at every size.

  python -m benchmarks.all_reduce_worker --backend=torch_gloo --rank=0 \
      --world_size=2 --master_port=PORT --sizes=4,8 --result_json=OUT

Each rank sums a float32 tensor of every size in --sizes (bytes) with the
other ranks, first --warmup times untimed, then a timed loop, and writes
its own mean seconds per all-reduce to --result_json ("{rank}" in the path
becomes its rank). The driver takes the slowest rank per size: a collective
is over for the job only when its last rank is done.

Backends:
  tf_ring       MultiWorkerMirroredStrategy with RING collectives (gRPC);
                TF_CONFIG comes from the driver. Each all-reduce is one
                call of a tf.function, whose call overhead is included.
  torch_gloo    torch.distributed all_reduce on gloo
  torch_nccl    the same on NCCL, one GPU per rank
  horovod_gloo  horovod.torch allreduce_ under `horovodrun --gloo`
"""

import argparse
import json
import os
import time
from typing import Callable, Dict, List

BACKENDS = ("tf_ring", "torch_gloo", "torch_nccl", "horovod_gloo")
# Iterations per size: many for small messages, whose time is latency and
# jitter, few for large ones, whose time is bandwidth (OSU does the same:
# 1000 under 8 KB, 100 above). Chosen so each size times about the same
# number of bytes, between these bounds.
MAX_ITERS = 200
MIN_ITERS = 5
BYTES_PER_SIZE = 64 << 20
FLOAT32_BYTES = 4


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--backend", required=True, choices=BACKENDS)
  parser.add_argument("--sizes", required=True,
                      help="Comma-separated message sizes in bytes.")
  parser.add_argument("--result_json", required=True)
  parser.add_argument("--rank", type=int, default=0)
  parser.add_argument("--world_size", type=int, default=2)
  parser.add_argument("--master_port", type=int, default=0)
  parser.add_argument("--warmup", type=int, default=3)
  return parser.parse_args(argv)


def iterations(size_bytes: int) -> int:
  return max(MIN_ITERS, min(MAX_ITERS, BYTES_PER_SIZE // max(1, size_bytes)))


def time_all_reduce(run_once: Callable[[], None], finish: Callable[[], None],
                    barrier: Callable[[], None], *, warmup: int,
                    iters: int) -> float:
  """Mean seconds per all-reduce, the ranks starting together."""
  for _ in range(warmup):
    run_once()
  finish()
  barrier()
  start = time.perf_counter()
  for _ in range(iters):
    run_once()
  finish()
  return (time.perf_counter() - start) / iters


def _elements(size_bytes: int) -> int:
  return max(1, size_bytes // FLOAT32_BYTES)


def sweep_torch(args, sizes: List[int]) -> Dict[int, float]:
  import torch  # pylint: disable=g-import-not-at-top
  import torch.distributed as dist  # pylint: disable=g-import-not-at-top
  from torch_parity import rendezvous  # pylint: disable=g-import-not-at-top
  nccl = args.backend == "torch_nccl"
  device = torch.device(f"cuda:{args.rank}" if nccl else "cpu")
  if nccl:
    torch.cuda.set_device(device)
  rendezvous.init_process_group(
      "nccl" if nccl else "gloo",
      init_method=f"tcp://127.0.0.1:{args.master_port}", rank=args.rank,
      world_size=args.world_size)
  finish = torch.cuda.synchronize if nccl else (lambda: None)
  times = {}
  for size in sizes:
    tensor = torch.ones(_elements(size), dtype=torch.float32, device=device)
    times[size] = time_all_reduce(
        lambda t=tensor: dist.all_reduce(t), finish, dist.barrier,
        warmup=args.warmup, iters=iterations(size))
  dist.destroy_process_group()
  return times


def sweep_horovod(args, sizes: List[int]) -> Dict[int, float]:
  import horovod.torch as hvd  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  hvd.init()
  args.rank = hvd.rank()
  barrier = lambda: hvd.allreduce(torch.zeros(1), name="barrier")
  times = {}
  for size in sizes:
    tensor = torch.ones(_elements(size), dtype=torch.float32)
    times[size] = time_all_reduce(
        lambda t=tensor, s=size: hvd.allreduce_(t, op=hvd.Sum, name=f"m{s}"),
        lambda: None, barrier, warmup=args.warmup, iters=iterations(size))
  hvd.shutdown()
  return times


def sweep_tensorflow(args, sizes: List[int]) -> Dict[int, float]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Two processes share the host's cores: one thread per pool each, as the
  # project's launcher gives its workers.
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=tf.distribute.experimental.CommunicationImplementation
      .RING)
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=options)
  args.rank = strategy.cluster_resolver.task_id

  # Inside a tf.function an input tensor has no device yet, and the
  # collective all-reduce takes its destination from that device ("the
  # destinations can not be empty"): place it on this worker's device.
  device = strategy.extended.worker_devices[0]

  def replica_sum(v):
    with tf.device(device):
      v = tf.identity(v)
    return tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, v)

  def make_all_reduce():
    @tf.function
    def all_reduce(x):
      return strategy.run(replica_sum, args=(x,))
    return all_reduce

  barrier_fn = make_all_reduce()
  barrier_input = tf.zeros([1])
  times = {}
  for size in sizes:
    tensor = tf.ones([_elements(size)], dtype=tf.float32)
    all_reduce = make_all_reduce()  # one trace per size, in the warm-up
    last = [None]  # the newest result: reading it waits for it
    times[size] = time_all_reduce(
        lambda f=all_reduce, t=tensor, out=last: out.__setitem__(0, f(t)),
        lambda out=last: out[0].numpy(),
        lambda: barrier_fn(barrier_input).numpy(),
        warmup=args.warmup, iters=iterations(size))
  return times


def main(argv=None) -> None:
  args = parse_args(argv)
  sizes = [int(s) for s in args.sizes.split(",") if s]
  if args.backend == "tf_ring":
    times = sweep_tensorflow(args, sizes)
  elif args.backend == "horovod_gloo":
    times = sweep_horovod(args, sizes)
  else:
    times = sweep_torch(args, sizes)
  path = args.result_json.replace("{rank}", str(args.rank))
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"rank": args.rank, "backend": args.backend,
               "pid": os.getpid(),
               "time_s": {str(s): t for s, t in times.items()},
               "iterations": {str(s): iterations(s) for s in sizes}}, f)


if __name__ == "__main__":
  main()
