"""Burst benchmark, GPU multiplexing: a foreground alone and beside the job.

  python -m benchmarks.burst --gpu_multiplex           # 5 repeats
  python -m benchmarks.burst --gpu_multiplex --quick   # a smoke run

DeepPool's second half: the devices a burst plan leaves idle go to a
background job that must not slow the foreground. On the first GPU, a
VGG-16 foreground (batch 128, 32x32 images) trains on the highest-priority
stream alone, and beside the CUDA background job of the PyTorch trainer
(`torch_parity.background_cuda`: the `small_mlp` step replayed as a CUDA
graph on the lowest-priority stream); a third side runs the job alone for
JOB_ALONE_S. The three sides are interleaved by the harness. Reports the
foreground's step time alone and beside the job, with over alone paired
within each repeat, and the job's samples/s beside the foreground over its
samples/s alone, likewise paired. Targets: the foreground at most 5%
slower (MAX_SLOWDOWN) while the job keeps at least half of what it does
alone (MIN_JOB_SHARE), each judged on its interval.

`benchmarks.burst` parses the flags, refuses a host without CUDA, applies
the host allocator and calls `write_results`. Results go to
benchmarks/results/burst_gpu_multiplex.json (.quick.json with --quick).
"""

import os
import time

from benchmarks import common
from benchmarks import harness

MULTIPLEX_MODEL, MULTIPLEX_IMAGE, MULTIPLEX_BATCH = "vgg16", 32, 128
MULTIPLEX_WARMUP_STEPS = 3  # cuDNN's choices and the allocator's first fill
MULTIPLEX_SIDES = ("alone", "with_job", "job_alone")
# The job alone runs for this long: thousands of small_mlp steps on a GPU,
# so its samples/s is not a start-up's.
JOB_ALONE_S = 3.0
MAX_SLOWDOWN = 1.05
MIN_JOB_SHARE = 0.5


def _multiplex_foreground(device):
  """One training step of the foreground model on fixed device tensors."""
  # pylint: disable=g-import-not-at-top
  import torch
  from torch import nn
  from torch_parity.models import build_model
  torch.manual_seed(0)
  model = build_model(MULTIPLEX_MODEL, image_size=MULTIPLEX_IMAGE,
                      num_classes=10).to(device)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
  x = torch.randn(MULTIPLEX_BATCH, 3, MULTIPLEX_IMAGE, MULTIPLEX_IMAGE,
                  device=device)
  y = torch.randint(0, 10, (MULTIPLEX_BATCH,), device=device)

  def step():
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
  return step


def _timed_steps(step, stream, steps: int) -> list:
  """Seconds of each step after the warm-up, run on `stream` and waited for
  on it alone (the job's kernels on the device are not the step's)."""
  import torch  # pylint: disable=g-import-not-at-top
  times = []
  # After the model and batch, made on the stream that was current.
  stream.wait_stream(torch.cuda.current_stream(stream.device))
  with torch.cuda.stream(stream):
    for i in range(MULTIPLEX_WARMUP_STEPS + steps):
      start = time.perf_counter()
      step()
      stream.synchronize()
      if i >= MULTIPLEX_WARMUP_STEPS:
        times.append(time.perf_counter() - start)
  return times


def _beside_job(device, work):
  """Runs `work(runner)` while the background job trains.

  Returns:
    (what `work` returned, the job's stats).

  Raises:
    BenchmarkError: if the background job failed.
  """
  # pylint: disable=g-import-not-at-top
  from torch_parity import background_cuda
  runner = background_cuda.CudaBackgroundRunner(
      "small_mlp", device, start_after_step=1,
      global_batch_size=MULTIPLEX_BATCH)
  runner.start()  # returns after the job's first step
  try:
    result = work(runner)
  finally:
    runner.stop()
  job = runner.stats()
  if job["error"]:
    raise common.BenchmarkError(f"the background job failed: "
                                f"{job['error']}")
  return result, job


def _job_alone(device) -> dict:
  """The background job with no foreground, for JOB_ALONE_S."""
  _, job = _beside_job(device, lambda runner: time.sleep(JOB_ALONE_S))
  return {"background_samples_per_second": job["samples_per_second"],
          "background_steps": job["steps"], "cuda_graph": job["cuda_graph"]}


def measure(args) -> dict:
  """Both sides once per repeat, interleaved; with over alone paired
  within each repeat."""
  # pylint: disable=g-import-not-at-top
  import torch
  from torch_parity import background_cuda
  device = torch.device("cuda", 0)
  step = _multiplex_foreground(device)

  def run_side(side, repeat):
    common.log(f"gpu multiplex, foreground {side}, repeat {repeat + 1}")
    row = {"side": side, "repeat": repeat}
    if side == "job_alone":
      return {**row, **_job_alone(device)}
    if side == "alone":
      # The same priority as beside the job: the sides differ by the job.
      times = _timed_steps(step, background_cuda.foreground_stream(device),
                           args.steps)
    else:
      times, job = _beside_job(
          device, lambda runner: _timed_steps(step, runner.foreground_stream,
                                              args.steps))
      row.update(background_samples_per_second=job["samples_per_second"],
                 background_steps=job["steps"],
                 stream_priority=job["stream_priority"],
                 foreground_stream_priority=job["foreground_stream_priority"],
                 cuda_graph=job["cuda_graph"],
                 cuda_graph_error=job["cuda_graph_error"])
    row.update(step_s=sum(times) / len(times),
               samples_per_second=MULTIPLEX_BATCH * len(times) / sum(times))
    return row

  record = harness.run_interleaved(MULTIPLEX_SIDES, args.repeats, run_side)
  step_s = harness.values_by_side(record["runs"], lambda r: r.get("step_s"))
  job_rate = harness.values_by_side(
      record["runs"], lambda r: r.get("background_samples_per_second"))
  with_job = [r for r in record["runs"] if r["side"] == "with_job"]
  summary = {
      f"step_s/{side}": harness.median_interval(step_s[side])
      for side in ("alone", "with_job")}
  # Above 1: the foreground's step is slower beside the job.
  summary["step_s/with_job_over_alone"] = harness.judge(
      harness.summarize_ratios(step_s["with_job"], step_s["alone"]),
      MAX_SLOWDOWN, harness.AT_MOST)
  summary["background_samples_per_second"] = harness.median_interval(
      job_rate["with_job"])
  summary["background_samples_per_second/job_alone"] = (
      harness.median_interval(job_rate["job_alone"]))
  # What the job keeps beside the foreground of what it does alone.
  summary["background_samples_per_second/with_job_over_job_alone"] = (
      harness.judge(harness.summarize_ratios(job_rate["with_job"],
                                             job_rate["job_alone"]),
                    MIN_JOB_SHARE, harness.AT_LEAST))
  summary["cuda_graph"] = all(r["cuda_graph"] for r in with_job)
  summary["stream_priorities"] = {
      "background": with_job[0]["stream_priority"],
      "foreground": with_job[0]["foreground_stream_priority"]}
  return {"summary": summary, "runs": record["runs"],
          "host": record["host"], "gpu": torch.cuda.get_device_name(device)}


def write_results(args, *, machine: dict, host_allocator: dict,
                  start_s: float) -> int:
  """Measures, writes burst_gpu_multiplex.json, prints the summary."""
  multiplex = measure(args)
  payload = {"benchmark": "burst_gpu_multiplex",
             "machine": {**machine, "gpu_used": multiplex["gpu"]},
             "command": common.command_line(), "quick": args.quick,
             "repeats": args.repeats, "settings": vars(args),
             "host_allocator": host_allocator,
             "foreground": {"model": MULTIPLEX_MODEL,
                            "image_size": MULTIPLEX_IMAGE,
                            "batch": MULTIPLEX_BATCH},
             "multiplex": multiplex["summary"], "runs": multiplex["runs"],
             "total_wall_s": time.perf_counter() - start_s,
             **harness.payload_fields({"multiplex": multiplex["host"]})}
  name = "burst_gpu_multiplex" + (".quick" if args.quick else "")
  path = args.output or os.path.join(common.RESULTS_DIR, f"{name}.json")
  common.write_results(path, payload)
  for key, value in payload["multiplex"].items():
    if isinstance(value, dict) and "median" in value:
      print(f"{key:<34} {harness.format_interval(value)}")
  print(f"wrote {path}")
  return 0
