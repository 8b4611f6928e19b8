"""The foreground's side of --background_job: start it, measure what it costs.

Halfway through the foreground's steps, a runner starts the background job
and waits until the job reports its first step. On a CPU device the job is
`BackgroundRunner`'s: a separate process in the idle scheduling class
(`background_job.py`). On a CUDA device it is the PyTorch trainer's
`torch_parity.background_cuda.CudaBackgroundRunner`: a thread of the
trainer's process replaying the job's step on the lowest-priority stream.
Both file the foreground's steps here (`JobRunner`), so run.json's
`background` section has one schema.

The foreground's **slowdown** is measured against its own steps before the
job started (warm-up steps left out): mean step with the job running over
mean step before it, minus 1. Its samples/s are given over the same two
spans. The same run therefore measures both, on the same host minutes,
with no second run to align.

  runner = BackgroundRunner("small_mlp", "run/background.json",
                            start_after_step=50, warmup_steps=10,
                            global_batch_size=64)
  ...after each step: runner.on_step_end(step, step_s)
  runner.stop(); record["background"] = runner.stats()
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import List, Optional, Tuple

JOB_MODULE = "overlap_core.runtime.background_job"
START_TIMEOUT_S = 120.0  # interpreter and NumPy start-up at idle priority
STOP_TIMEOUT_S = 30.0
_POLL_S = 0.05


def read_stats(path: str) -> Optional[dict]:
  """The job's last report, or None before its first."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


class JobRunner:
  """Starts a job after `start_after_step`; files the foreground's steps
  before the job and with it.

  Subclasses start and stop the job (`_launch`, `_halt`) and say what it
  did (`_job_stats`: the `background` section's keys besides `job` and
  `foreground`).
  """

  def __init__(self, job: str, *, start_after_step: int,
               global_batch_size: int, warmup_steps: int = 0):
    if start_after_step < 1:
      raise ValueError("Invalid value for argument `start_after_step`. "
                       f"Received: {start_after_step}; allowed: >= 1")
    if global_batch_size < 1:
      raise ValueError("Invalid value for argument `global_batch_size`. "
                       f"Received: {global_batch_size}; allowed: >= 1")
    self._job = job
    self._start_after_step, self._warmup_steps = start_after_step, warmup_steps
    self._global_batch_size = global_batch_size
    self._before_s: List[float] = []
    self._with_s: List[float] = []
    self._started = False
    self._skipped_first = False

  def on_step_end(self, step: int, step_s: float) -> None:
    """Files the step's time; starts the job after `start_after_step`."""
    if not self._started:
      if step > self._warmup_steps:
        self._before_s.append(step_s)
      if step >= self._start_after_step:
        self.start()
    elif self._skipped_first:
      self._with_s.append(step_s)
    else:
      # The step after the start also holds the wait for the job's first
      # report (outside the step, so in its "other" time): left out.
      self._skipped_first = True

  def start(self) -> None:
    """Starts the job and waits (bounded) for its first step."""
    self._started = True
    self._launch()

  def stop(self) -> None:
    """Stops the job, if it runs, and keeps its final numbers."""
    if self._started:
      self._halt()

  def stats(self) -> dict:
    """run.json's `background` section."""
    return {"job": self._job, **self._job_stats(),
            "foreground": self._foreground_stats()}

  def _foreground_stats(self) -> dict:
    before = statistics.mean(self._before_s) if self._before_s else None
    during = statistics.mean(self._with_s) if self._with_s else None
    slowdown = (during / before - 1.0) if before and during else None
    return {
        "baseline": "the foreground's own steps before the job started, "
                    "warm-up left out",
        "started_after_step": self._start_after_step,
        "steps_before": len(self._before_s),
        "steps_with": len(self._with_s),
        "step_s_before": before,
        "step_s_with": during,
        "slowdown_frac": slowdown,
        # Over the same steps as the step times: the run-wide samples/s
        # in run.json mixes steps with and without the job.
        "samples_per_second_before": self._throughput(self._before_s),
        "samples_per_second_with": self._throughput(self._with_s),
    }

  def _throughput(self, steps_s: List[float]) -> Optional[float]:
    total_s = sum(steps_s)
    if not steps_s or total_s <= 0:
      return None
    return self._global_batch_size * len(steps_s) / total_s

  def _launch(self) -> None:
    raise NotImplementedError

  def _halt(self) -> None:
    raise NotImplementedError

  def _job_stats(self) -> dict:
    raise NotImplementedError


class BackgroundRunner(JobRunner):
  """The job as a separate process in the idle scheduling class."""

  def __init__(self, job: str, stats_path: str, *, start_after_step: int,
               global_batch_size: int, warmup_steps: int = 0,
               start_timeout_s: float = START_TIMEOUT_S):
    super().__init__(job, start_after_step=start_after_step,
                     global_batch_size=global_batch_size,
                     warmup_steps=warmup_steps)
    self._stats_path = stats_path
    self._start_timeout_s = start_timeout_s
    self._process: Optional[subprocess.Popen] = None
    self._final: Optional[dict] = None
    self._policy_seen: Optional[str] = None

  @property
  def pid(self) -> Optional[int]:
    return self._process.pid if self._process else None

  def _launch(self) -> None:
    if os.path.exists(self._stats_path):
      os.remove(self._stats_path)  # a previous run's report is not ours
    self._process = subprocess.Popen(
        [sys.executable, "-m", JOB_MODULE, f"--job={self._job}",
         f"--stats={self._stats_path}"], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + self._start_timeout_s
    while read_stats(self._stats_path) is None:
      if self._process.poll() is not None:
        raise RuntimeError(f"background job {self._job!r} exited with status"
                           f" {self._process.returncode} before its first "
                           "step")
      if time.monotonic() > deadline:
        self.stop()
        raise RuntimeError(f"background job {self._job!r} reported no step "
                           f"within {self._start_timeout_s:.0f} s")
      time.sleep(_POLL_S)
    # Read from outside the job: what the kernel really applies to it.
    self._policy_seen = policy_name(self._process.pid)
    print(f"background job {self._job} started: pid {self._process.pid}, "
          f"{self._policy_seen}", flush=True)

  def _halt(self) -> None:
    """SIGTERM, then its final report; SIGKILL if it does not end in time."""
    if self._process is None or self._process.poll() is not None:
      return
    self._process.send_signal(signal.SIGTERM)
    try:
      self._process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
    self._final = read_stats(self._stats_path)

  def _job_stats(self) -> dict:
    job = self._final or read_stats(self._stats_path) or {}
    return {
        "pid": self.pid,
        "policy": job.get("policy"),
        "policy_seen_by_foreground": self._policy_seen,
        "steps": job.get("steps", 0),
        "samples": job.get("samples", 0),
        "samples_per_second": job.get("samples_per_second", 0.0),
        "first_loss": job.get("first_loss"),
        "last_loss": job.get("last_loss"),
        "finished": job.get("finished", False),
    }


def policy_name(pid: int) -> str:
  """The scheduling class of `pid` as the kernel reports it, with its nice."""
  policy = os.sched_getscheduler(pid)
  names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_IDLE",
                                       "SCHED_BATCH", "SCHED_FIFO",
                                       "SCHED_RR") if hasattr(os, n)}
  name = names.get(policy, str(policy))
  if name == "SCHED_IDLE":
    return name
  return f"nice {os.getpriority(os.PRIO_PROCESS, pid)}"


def split_steps(*, first_step: int, last_step: int
                ) -> Optional[Tuple[int, int]]:
  """(start_after_step, warmup_steps) for a job started halfway through
  first_step..last_step; None when fewer than 4 steps are left to split
  into before and with."""
  num_steps = last_step - first_step + 1
  if num_steps < 4:
    return None
  warmup = first_step - 1 + max(1, min(10, num_steps // 10))
  return max(warmup + 1, first_step - 1 + num_steps // 2), warmup


def make_runner(job: str, model_dir: str, *, first_step: int,
                last_step: int, global_batch_size: int
                ) -> Optional[BackgroundRunner]:
  """The process runner a trainer starts halfway through its steps; None
  when the run is too short to split (`split_steps`)."""
  split = split_steps(first_step=first_step, last_step=last_step)
  if split is None:
    return None
  start_after, warmup = split
  return BackgroundRunner(job, os.path.join(model_dir, "background.json"),
                          start_after_step=start_after, warmup_steps=warmup,
                          global_batch_size=global_batch_size)
