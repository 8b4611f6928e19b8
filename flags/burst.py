"""Burst-parallel flags: a per-layer width plan, its bound, a background job;
and `build_config`, which checks a plan against the run it is given to."""

from absl import flags

from overlap_core.planning import burst_report
from overlap_core.runtime.config import BurstConfig, ConfigError

# The small training jobs --background_job can run beside the foreground.
BACKGROUND_JOBS = ("none", "small_mlp")


def define_flags():
  flags.DEFINE_string(
      "burst_parallel", "off",
      "off, or a burst plan JSON (python -m tfoverlap.burst_plan or "
      "torch_parity.burst_plan; either plan runs in either trainer): every "
      "layer runs on its own number of devices, the batch scattered and "
      "gathered between layers of different width. The plan's devices must "
      "equal the run's replicas.")
  flags.DEFINE_float(
      "amplification_limit", 2.0,
      "Bound on a layer's device-seconds at its width over its time on one "
      "device (per layer). The planning command plans within it; a trainer "
      "refuses a plan with a layer above it.", lower_bound=1.0)
  flags.DEFINE_enum(
      "background_job", "none", list(BACKGROUND_JOBS),
      "A small training job run beside the foreground at the lowest "
      "priority: on the CPU a separate process under SCHED_IDLE (nice 19 "
      "where that is not allowed); on a CUDA device (PyTorch only) a CUDA "
      "graph replayed on the lowest-priority stream. Both throughputs and "
      "the foreground's slowdown go into run.json.")


def build_config(values) -> BurstConfig:
  """--burst_parallel and its bound: the plan must fit this run."""
  path = values.burst_parallel.strip()
  limit = values.amplification_limit
  if path in ("", "off"):
    return BurstConfig(amplification_limit=limit,
                       background_job=values.background_job)
  try:
    plan = burst_report.read_plan(path)
  except ValueError as e:
    raise ConfigError("burst_parallel", path,
                      f"{e}; allowed: off or a burst plan JSON from python "
                      "-m tfoverlap.burst_plan or torch_parity.burst_plan"
                      ) from None
  if plan.model != values.model:
    raise ConfigError("burst_parallel", path,
                      f"the plan is for model {plan.model!r}, not "
                      f"--model={values.model}; allowed: a plan made with "
                      f"--model={values.model}")
  replicas = values.num_workers
  if values.strategy == "mirrored":
    replicas *= values.num_devices
  if plan.num_devices != replicas:
    raise ConfigError("burst_parallel", path,
                      f"the plan is for {plan.num_devices} devices and this "
                      f"run has {replicas} replicas; allowed: a plan for "
                      "exactly the run's replicas")
  if plan.global_batch != values.batch_size:
    raise ConfigError("burst_parallel", path,
                      f"the plan is for a global batch of "
                      f"{plan.global_batch}, not --batch_size="
                      f"{values.batch_size}")
  over = [lp for lp in plan.layers if lp.amplification > limit + 1e-9]
  if over:
    raise ConfigError("amplification_limit", limit,
                      f"layer {over[0].layer!r} of the plan amplifies "
                      f"{over[0].amplification:.2f}x ({len(over)} layers "
                      "above the limit); allowed: a limit at or above the "
                      "plan's")
  return BurstConfig(plan_path=path, num_devices=plan.num_devices,
                     amplification_limit=limit,
                     background_job=values.background_job)
