"""Burst parallelism (DeepPool): plans, their predictions, runtime overheads.

  python -m benchmarks.burst --quick          # smoke: small batch, 2 models
  python -m benchmarks.burst                  # the table for BENCHMARKS.md
  python -m benchmarks.burst --gpu_multiplex  # one GPU, with and without
                                              # the CUDA background job

Part 1, plans. For VGG-16, a WideResNet (wide_resnet101_2; 26_2 with
--quick) and Inception-V3, the layers are profiled here (PyTorch, the first
GPU or the CPU) at the per-device batches the widths give, and planned
for --num_devices devices at amplification limits 1.5, 2, 3 and 5. Each
row: the predicted iteration time and GPU-seconds of the plan, of data
parallelism on the same devices (every layer at full width), their ratios,
and how many layers each width got. Predictions, not measurements.

Part 2, runtime. On --runtime_ranks gloo processes of this host, a small
CNN trained by `torch_parity.burst.BurstModel` under a mixed-width plan and
under the all-wide plan (data parallelism by the same runtime), each with
and without the background job (`--background_job=small_mlp`'s process,
started halfway). Reports samples/s, and the foreground's slowdown and the
background's samples/s when it ran. The variants run through
`benchmarks.harness` (interleaved, the host's load recorded); burst over
data parallel throughput is the median of the per-repeat ratios. On a 2-core
CPU host this shows the runtime's overheads, not DeepPool's gains: the
ranks share the cores with each other and with the background job.

GPU multiplexing (--gpu_multiplex, a CUDA host only; without CUDA it exits
2 with one line): one foreground on the first GPU, alone and beside the
CUDA background job; see `benchmarks/burst_multiplex.py`. The other parts
do not run then.

Both parts run under `--host_allocator=retain`, the trainers' default
(section 16 of BENCHMARKS.md): the profiles are timed in this process and
the ranks are processes of their own, so each applies it, and the results
record what each got.

Results go to benchmarks/results/burst.json (burst.quick.json with --quick).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import common
from benchmarks import harness

MODELS = {"vgg16": 32, "wide_resnet101_2": 32, "inception_v3": 75}
QUICK_MODELS = {"vgg16": 32, "wide_resnet26_2": 32}
LIMITS = (1.5, 2.0, 3.0, 5.0)
RUNTIME_BATCH = 32
RANK_TIMEOUT_S = 900
# The trainers' default (--host_allocator): the plans' layers are timed,
# and the runtime's ranks run, under the policy a training run has.
HOST_ALLOCATOR = "retain"


def _plan_rows(args):
  # pylint: disable=g-import-not-at-top
  import torch
  from overlap_core.planning import burst_report
  from overlap_core.planning.burst_costs import CommModel
  from torch_parity.models import build_model
  from torch_parity.planning.graph import build_layer_graph
  from torch_parity.planning.profiler import profile_layers
  rows = []
  device = "cuda:0" if torch.cuda.is_available() else "cpu"
  comm = CommModel(bandwidth_bytes_per_s=args.bandwidth_gbps * 1e9)
  for name, size in (QUICK_MODELS if args.quick else MODELS).items():
    batches = burst_report.batches_to_profile(
        global_batch=args.global_batch, num_devices=args.num_devices)
    torch.manual_seed(0)
    model = build_model(name, image_size=size, num_classes=10)
    make_input = lambda b, size=size: torch.randn(b, 3, size, size)
    graph = build_layer_graph(model, make_input(batches[0]), name=name)
    common.log(f"profiling {name} at batches {batches} on {device}")
    profile = profile_layers(model, make_input, device=device,
                             batch_sizes=batches, warmup=args.warmup,
                             repeats=args.profile_repeats, name=name)
    for limit in LIMITS:
      plan = burst_report.make_burst_plan(
          graph, profile, global_batch=args.global_batch,
          num_devices=args.num_devices, amplification_limit=limit, comm=comm)
      counts = {}
      for lp in plan.layers:
        counts[lp.num_devices] = counts.get(lp.num_devices, 0) + 1
      rows.append({
          "model": name, "limit": limit, "device": device,
          "iteration_ms": plan.iteration_s * 1e3,
          "gpu_s": plan.gpu_s, "amplification": plan.amplification,
          "dp_iteration_ms": plan.data_parallel_iteration_s * 1e3,
          "dp_gpu_s": plan.data_parallel_gpu_s,
          "iteration_vs_dp": plan.iteration_s / plan.data_parallel_iteration_s,
          "gpu_s_vs_dp": plan.gpu_s / plan.data_parallel_gpu_s,
          "layers_by_width": {str(k): v for k, v in sorted(counts.items())}})
  return rows


def _runtime_variants(ranks: int):
  mixed = {"0": ranks, "1": ranks, "2": ranks, "3": ranks, "4": 1, "5": 1,
           "6": 1, "7": ranks}
  wide = {k: ranks for k in mixed}
  return {"burst": mixed, "data_parallel": wide}


def _rank_worker(argv) -> int:
  """One rank of a runtime variant; writes its step times as JSON."""
  out_path, widths_json, steps, background_job = argv
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import host_allocator
  allocator = host_allocator.apply(HOST_ALLOCATOR)  # before any tensor
  import torch
  from torch import nn
  from overlap_core.runtime import background
  from torch_parity import burst, rendezvous
  rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
  rendezvous.join_launched_world("gloo", rank=rank, world_size=world,
                                 timeout=datetime.timedelta(seconds=300))
  torch.manual_seed(0)
  module = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * 16 * 16, 64),
                         nn.ReLU(), nn.Linear(64, 10))
  x = torch.randn(RUNTIME_BATCH, 3, 16, 16)
  y = torch.randint(0, 10, (RUNTIME_BATCH,))
  model = burst.BurstModel(module, json.loads(widths_json),
                           global_batch=RUNTIME_BATCH, example_input=x[:2])
  optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
  steps = int(steps)
  runner = None
  if background_job != "none" and rank == 0:
    runner = background.BackgroundRunner(
        background_job, out_path + ".bg.json", start_after_step=steps // 2,
        warmup_steps=2, global_batch_size=RUNTIME_BATCH)
  times = []
  try:
    for step in range(1, steps + 1):
      start = time.perf_counter()
      optimizer.zero_grad()
      loss = nn.functional.cross_entropy(
          model(model.local_input(x)), model.local_rows(y),
          reduction="sum") / RUNTIME_BATCH
      loss.backward()
      model.allreduce_gradients()
      optimizer.step()
      torch.distributed.barrier()
      times.append(time.perf_counter() - start)
      if runner:
        runner.on_step_end(step, times[-1])
  finally:
    if runner:
      runner.stop()
  # Rank 0 reports: every step ends at a barrier, so its step times are
  # the job's, and a second writer would interleave with it in one file.
  if rank == 0:
    with open(out_path, "w", encoding="utf-8") as f:
      json.dump({"step_s": times, "host_allocator": allocator,
                 "background": runner.stats() if runner else None}, f)
  torch.distributed.destroy_process_group()
  return 0


def _run_variant(widths, *, ranks, steps, background_job, workdir):
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import processes
  from torch_parity.launch import torchrun_env
  port = processes.free_ports(1)[0]
  out = os.path.join(workdir, f"r{time.monotonic_ns()}")
  procs = [subprocess.Popen(
      [sys.executable, "-m", "benchmarks.burst", "--rank_worker", out,
       json.dumps(widths), str(steps), background_job],
      cwd=common.REPO_ROOT,
      env=torchrun_env(common.subprocess_env(), rank=r, world_size=ranks,
                       master_port=port)) for r in range(ranks)]
  for p in procs:
    if p.wait(timeout=RANK_TIMEOUT_S):
      raise common.BenchmarkError(f"a rank exited {p.returncode}")
  with open(out, encoding="utf-8") as f:
    result = json.load(f)
  measured = result["step_s"][2:]  # two warm-up steps
  row = {"samples_per_second": RUNTIME_BATCH * len(measured) / sum(measured),
         "host_allocator": result["host_allocator"]}
  if result["background"]:
    bg = result["background"]
    row.update(background_samples_per_second=bg["samples_per_second"],
               foreground_slowdown_frac=bg["foreground"]["slowdown_frac"],
               background_policy=bg["policy_seen_by_foreground"])
  return row


def _runtime(args) -> dict:
  """Every (plan, background) variant once per repeat, interleaved by the
  harness; burst over data parallel throughput paired within each repeat."""
  widths = _runtime_variants(args.runtime_ranks)
  sides = [(name, bg) for name in widths for bg in ("none", "small_mlp")]
  with tempfile.TemporaryDirectory() as workdir:

    def run_side(side, repeat):
      name, bg = side
      common.log(f"runtime {name}, background {bg}, repeat {repeat + 1}")
      return {"side": [name, bg], "repeat": repeat, **_run_variant(
          widths[name], ranks=args.runtime_ranks, steps=args.steps,
          background_job=bg, workdir=workdir)}

    record = harness.run_interleaved(sides, args.repeats, run_side)
  throughput = harness.values_by_side(record["runs"], "samples_per_second")
  summary = {}
  for name, bg in sides:
    entry = {"samples_per_second": harness.median_interval(
        throughput[(name, bg)])}
    if bg != "none":
      mine = [r for r in record["runs"] if r["side"] == [name, bg]]
      entry["foreground_slowdown_frac"] = harness.median_interval(
          [r["foreground_slowdown_frac"] for r in mine])
      entry["background_samples_per_second"] = harness.median_interval(
          [r["background_samples_per_second"] for r in mine])
      entry["background_policy"] = mine[0]["background_policy"]
    summary[f"{name}/{bg}"] = entry
  for bg in ("none", "small_mlp"):
    summary[f"burst_over_data_parallel/{bg}"] = harness.summarize_ratios(
        throughput[("burst", bg)], throughput[("data_parallel", bg)])
  return {"summary": summary, "runs": record["runs"],
          "host": record["host"]}


def _cuda_missing() -> bool:
  import torch  # pylint: disable=g-import-not-at-top
  return not torch.cuda.is_available()


def main(argv) -> int:
  if argv[1:2] == ["--rank_worker"]:
    return _rank_worker(argv[2:])
  parser = argparse.ArgumentParser(prog="benchmarks.burst")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--num_devices", type=int, default=8)
  parser.add_argument("--global_batch", type=int, default=None)
  parser.add_argument("--bandwidth_gbps", type=float, default=25.0)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--profile_repeats", type=int, default=5)
  parser.add_argument("--runtime_ranks", type=int, default=2)
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--repeats", type=int, default=None)
  parser.add_argument("--gpu_multiplex", action="store_true")
  parser.add_argument("--output", default=None,
                      help="Result JSON path (default "
                      "benchmarks/results/burst[_gpu_multiplex][.quick].json)")
  args = parser.parse_args(argv[1:])
  if args.gpu_multiplex and _cuda_missing():
    print("benchmarks.burst: --gpu_multiplex needs a CUDA device; this host "
          "has none", file=sys.stderr)
    return 2
  args.global_batch = args.global_batch or (16 if args.quick else 64)
  args.steps = args.steps or (8 if args.quick else 60)
  # Five repeats: the fewest whose order-statistics interval of a median
  # reaches the harness's 90% (see benchmarks.harness.median_interval).
  args.repeats = args.repeats or (1 if args.quick else 5)
  if args.quick:
    args.profile_repeats, args.warmup = 1, 0
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import host_allocator
  # Before the profiles' first tensor: this process times the layers.
  allocator = host_allocator.apply(HOST_ALLOCATOR)
  machine = common.describe_machine()  # the load average before the runs
  start = time.perf_counter()
  if args.gpu_multiplex:
    # pylint: disable=g-import-not-at-top
    from benchmarks import burst_multiplex
    return burst_multiplex.write_results(args, machine=machine,
                                         host_allocator=allocator,
                                         start_s=start)
  # The plans rest on profiles measured here, so the host's load over the
  # profiling is recorded as the runtime's is.
  before = harness.host_snapshot()
  plans = _plan_rows(args)
  profiling_host = harness.host_load(before, harness.host_snapshot())
  runtime = _runtime(args)
  payload = {"benchmark": "burst", "machine": machine,
             "command": common.command_line(), "quick": args.quick,
             "repeats": args.repeats, "settings": vars(args),
             "host_allocator": allocator,
             "plans": plans, "runtime": runtime["summary"],
             "runs": runtime["runs"],
             "total_wall_s": time.perf_counter() - start,
             **harness.payload_fields({"profiling": profiling_host,
                                       "runtime": runtime["host"]})}
  path = args.output or os.path.join(
      common.RESULTS_DIR, "burst.quick.json" if args.quick else "burst.json")
  common.write_results(path, payload)
  for row in payload["plans"]:
    print(f"{row['model']:<18} limit {row['limit']:<4} iteration "
          f"{row['iteration_ms']:9.2f} ms (x{row['iteration_vs_dp']:.2f} of "
          f"data parallel), GPU-s x{row['gpu_s_vs_dp']:.2f}, widths "
          f"{row['layers_by_width']}")
  for name, entry in payload["runtime"].items():
    value = entry.get("samples_per_second", entry)
    print(f"{name:<34} {harness.format_interval(value)}")
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
