"""Burst-parallel flags: a per-layer width plan, its bound, a background job."""

from absl import flags

# The small training jobs --background_job can run beside the foreground.
BACKGROUND_JOBS = ("none", "small_mlp")


def define_flags():
  flags.DEFINE_string(
      "burst_parallel", "off",
      "off, or a burst plan JSON (python -m torch_parity.burst_plan): every "
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
      "priority (a separate process under SCHED_IDLE, or nice 19 where that "
      "is not allowed); both throughputs and the foreground's slowdown go "
      "into run.json.")
