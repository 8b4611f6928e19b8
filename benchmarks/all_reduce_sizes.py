"""All-reduce time and bus bandwidth by message size, 2 workers on this host.

  python -m benchmarks.all_reduce_sizes                # 4 B to 64 MB
  python -m benchmarks.all_reduce_sizes --quick        # 4 B to 4 KB, 1 repeat
  python -m benchmarks.all_reduce_sizes --sides=torch_gloo,horovod_gloo

The OSU micro-benchmarks' view (osu_allreduce) of the libraries the
trainers use: every side is a 2-process job on this host, each rank one
`benchmarks.all_reduce_worker` process, summing float32 messages from
--min_bytes to --max_bytes, doubling:

  tf_ring       TensorFlow's collective all-reduce, RING over gRPC
                (MultiWorkerMirroredStrategy, TF_CONFIG on localhost)
  torch_gloo    torch.distributed all_reduce on gloo (127.0.0.1)
  horovod_gloo  Horovod's PyTorch extension under `horovodrun --gloo`
  torch_nccl    torch.distributed on NCCL, added when 2 GPUs are present

Each repeat runs every side's whole sweep once, the first side rotating
(`benchmarks.harness`). Per side and size: the slowest rank's mean time per
all-reduce, its median over repeats with an interval, the algorithm
bandwidth (bytes / time) and the bus bandwidth (algorithm bandwidth times
2(n-1)/n, the share of the message each rank sends and receives in a ring:
NCCL-tests' measure, comparable across world sizes; with n = 2 the two
are equal), and the time over torch_gloo's at the same size, per repeat.
A PNG beside the results file plots time and bus bandwidth against the size
on log-log axes, as OSU's plots do.

Exposure: TensorFlow's gRPC servers and horovodrun's rendezvous listen on
all interfaces (neither can be bound to loopback); gloo's store listens on
127.0.0.1. Run this on a trusted network.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import common
from benchmarks import harness
from overlap_core.runtime import processes

NAME = "all_reduce_sizes"
NUM_WORKERS = 2
# 5: the fewest repeats whose range covers the median at the harness's 90%.
DEFAULT_REPEATS = 5
SIDES = ("tf_ring", "torch_gloo", "horovod_gloo")
GPU_SIDES = ("torch_nccl",)
REFERENCE_SIDE = "torch_gloo"
WORKER = "benchmarks.all_reduce_worker"
STDERR_TAIL_CHARS = 3000
# The servers of these sides cannot be bound to loopback.
EXPOSED_SIDES = {"tf_ring": "TensorFlow's gRPC servers",
                 "horovod_gloo": "horovodrun's rendezvous server"}


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS)
  parser.add_argument("--sides", default=None,
                      help="Comma-separated: " + ", ".join(SIDES + GPU_SIDES)
                      + " (default: all that this host can run).")
  parser.add_argument("--min_bytes", type=int, default=4)
  parser.add_argument("--max_bytes", type=int, default=64 << 20)
  args = parser.parse_args()
  if args.quick and args.max_bytes == 64 << 20:
    args.max_bytes = 4096
  if not 4 <= args.min_bytes <= args.max_bytes:
    parser.error(f"--min_bytes={args.min_bytes}, --max_bytes="
                 f"{args.max_bytes}: allowed: 4 <= min_bytes <= max_bytes")
  return args


def message_sizes(min_bytes: int, max_bytes: int) -> list:
  sizes, size = [], min_bytes
  while size <= max_bytes:
    sizes.append(size)
    size *= 2
  return sizes


def _gpu_count() -> int:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return 0
  return torch.cuda.device_count()


def _horovod_available() -> bool:
  try:
    import horovod.torch  # noqa: F401  pylint: disable=unused-import
  except ImportError:
    return False
  return True


def choose_sides(requested) -> tuple:
  """(sides to run, {side: why it is skipped})."""
  available = {"tf_ring": None, "torch_gloo": None,
               "horovod_gloo": None if _horovod_available() else
               "horovod.torch does not import (tools/install_horovod.sh)",
               "torch_nccl": None if _gpu_count() >= NUM_WORKERS else
               f"NCCL needs {NUM_WORKERS} GPUs"}
  names = ([s for s in requested.split(",") if s] if requested
           else list(SIDES + GPU_SIDES))
  unknown = [s for s in names if s not in available]
  if unknown:
    raise SystemExit(f"--sides: unknown {unknown}; allowed: "
                     f"{', '.join(available)}")
  skipped = {s: available[s] for s in names if available[s]}
  return [s for s in names if not available[s]], skipped


def _worker_command(side: str, sizes: list, result_json: str) -> list:
  return [sys.executable, "-m", WORKER, f"--backend={side}",
          "--sizes=" + ",".join(str(s) for s in sizes),
          f"--result_json={result_json}"]


def rank_jobs(side: str, sizes: list, result_json: str) -> list:
  """[(command, env)] for the processes of one side's job."""
  env = common.subprocess_env()
  command = _worker_command(side, sizes, result_json)
  if side == "horovod_gloo":
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [([horovodrun, "-np", str(NUM_WORKERS), "-H",
              f"localhost:{NUM_WORKERS}", "--gloo", "--disable-cache",
              *command], env)]
  if side == "tf_ring":
    ports = processes.free_ports(NUM_WORKERS)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    return [(command, dict(env, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": rank}})))
            for rank in range(NUM_WORKERS)]
  port = processes.free_ports(1)[0]
  return [(command + [f"--rank={rank}", f"--world_size={NUM_WORKERS}",
                      f"--master_port={port}"], dict(env, OMP_NUM_THREADS="1"))
          for rank in range(NUM_WORKERS)]


def run_job(jobs: list, timeout_s: float) -> None:
  """Starts every process of a job, waits for all; stops all on a failure."""
  started = [subprocess.Popen(
      command, cwd=common.REPO_ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True)
             for command, env in jobs]
  deadline = time.monotonic() + timeout_s
  failure = None
  for process in started:
    try:
      _, stderr = process.communicate(
          timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      failure = f"timed out after {timeout_s:.0f} s"
      break
    if process.returncode != 0:
      failure = f"exit {process.returncode}: {stderr[-STDERR_TAIL_CHARS:]}"
      break
  if failure:
    for process in started:
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    raise common.BenchmarkError(f"{' '.join(jobs[0][0])}: {failure}")


def run_side(side: str, sizes: list, scratch: str) -> dict:
  """One sweep; {"time_s": {size: slowest rank's mean}, process stats}."""
  result_json = os.path.join(scratch, f"{side}-{{rank}}.json")
  cpu_before = common.children_cpu_s()
  host_before = common.host_cpu_s()
  start = time.perf_counter()
  run_job(rank_jobs(side, sizes, result_json), common.PROCESS_TIMEOUT_S)
  wall_s = time.perf_counter() - start
  ranks = []
  for rank in range(NUM_WORKERS):
    with open(result_json.replace("{rank}", str(rank)), encoding="utf-8") as f:
      ranks.append(json.load(f))
  process_cpu_s = common.children_cpu_s() - cpu_before
  return {
      # The job's all-reduce is done when its slowest rank is.
      "time_s": {str(s): max(r["time_s"][str(s)] for r in ranks)
                 for s in sizes},
      "time_s_by_rank": [r["time_s"] for r in ranks],
      "iterations": ranks[0]["iterations"],
      "process_wall_s": wall_s, "process_cpu_s": process_cpu_s,
      "foreign_cpu_s": max(0.0, common.host_cpu_s()["busy"]
                           - host_before["busy"] - process_cpu_s)}


def bus_bandwidth_factor(num_ranks: int) -> float:
  """Bus over algorithm bandwidth in a ring: 2(n-1)/n (NCCL-tests)."""
  return 2.0 * (num_ranks - 1) / num_ranks


def summarize(runs: list, sides: list, sizes: list) -> dict:
  times = harness.values_by_side(runs, lambda r: r["result"]["time_s"])
  summary = {}
  for side in sides:
    summary[side] = {}
    for size in sizes:
      per_repeat = [t[str(size)] for t in times[side] if t is not None]
      stats = harness.median_interval(per_repeat)
      algbw = size / stats["median"]
      entry = {"time_us": 1e6 * stats["median"],
               "time_s_per_repeat": per_repeat, "time_interval_s": stats,
               "algbw_gb_s": algbw / 1e9,
               "busbw_gb_s": algbw * bus_bandwidth_factor(NUM_WORKERS) / 1e9}
      if side != REFERENCE_SIDE and REFERENCE_SIDE in times:
        entry["time_over_reference"] = harness.summarize_ratios(
            [t and t[str(size)] for t in times[side]],
            [t and t[str(size)] for t in times[REFERENCE_SIDE]])
      summary[side][str(size)] = entry
  return summary


def format_summary(summary: dict, sizes: list) -> str:
  sides = list(summary)
  headers = ["bytes"] + [f"{s} us" for s in sides] + [
      f"{s} busbw GB/s" for s in sides]
  rows = [[size] + [summary[s][str(size)]["time_us"] for s in sides]
          + [summary[s][str(size)]["busbw_gb_s"] for s in sides]
          for size in sizes]
  return common.format_table(headers, rows)


def plot(summary: dict, sizes: list, path: str) -> None:
  """Time and bus bandwidth against size, log-log, one line per side."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, (latency, bandwidth) = pyplot.subplots(1, 2, figsize=(11, 4.2))
  for side, by_size in summary.items():
    latency.plot(sizes, [by_size[str(s)]["time_us"] for s in sizes],
                 marker="o", markersize=3, label=side)
    bandwidth.plot(sizes, [by_size[str(s)]["busbw_gb_s"] for s in sizes],
                   marker="o", markersize=3, label=side)
  for axes, label in ((latency, "time per all-reduce (µs)"),
                      (bandwidth, "bus bandwidth (GB/s)")):
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("message size (bytes)")
    axes.set_ylabel(label)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
  figure.suptitle(f"All-reduce, {NUM_WORKERS} workers on one host")
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  pyplot.close(figure)


def main():
  args = parse_args()
  repeats = common.resolve_repeats(args, DEFAULT_REPEATS)
  sides, skipped = choose_sides(args.sides)
  for side, why in skipped.items():
    common.log(f"skipping {side}: {why}")
  for side in sides:
    if side in EXPOSED_SIDES:
      common.log(f"WARNING: {side}: {EXPOSED_SIDES[side]} listen on all "
                 "interfaces while it runs")
  if not sides:
    raise SystemExit("no side can run here: " + "; ".join(
        f"{s}: {w}" for s, w in skipped.items()))
  sizes = message_sizes(args.min_bytes, args.max_bytes)
  machine = common.describe_machine()
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="tfo-allreduce-") as scratch:

    def run_one(side, repeat):
      result = run_side(side, sizes, scratch)
      common.log(f"repeat {repeat + 1}/{repeats} {side}: "
                 f"{1e6 * result['time_s'][str(sizes[0])]:.1f} us at "
                 f"{sizes[0]} B, {1e6 * result['time_s'][str(sizes[-1])]:.0f}"
                 f" us at {sizes[-1]} B")
      return {"side": side, "repeat": repeat, "result": result}

    record = harness.run_interleaved(sides, repeats, run_one,
                                     redo_busy=args.redo_busy)
  summary = summarize(record["runs"], sides, sizes)
  path = common.result_path(NAME, args)
  payload = {"benchmark": NAME, "command": common.command_line(),
             "quick": args.quick, "repeats": repeats, "machine": machine,
             "num_workers": NUM_WORKERS, "sizes_bytes": sizes,
             "sides": sides, "skipped": skipped,
             "reference_side": REFERENCE_SIDE,
             "bus_bandwidth_factor": bus_bandwidth_factor(NUM_WORKERS),
             "summary": summary, "runs": record["runs"],
             "total_wall_s": time.perf_counter() - start,
             **harness.payload_fields({"all": record["host"]})}
  common.write_results(path, payload)
  plot_path = os.path.splitext(path)[0] + ".png"
  plot(summary, sizes, plot_path)
  print(format_summary(summary, sizes))
  print(f"\nresults: {os.path.relpath(path, common.REPO_ROOT)}; plot: "
        f"{os.path.relpath(plot_path, common.REPO_ROOT)}")


if __name__ == "__main__":
  main()
