"""What a profile was measured under, against what a run's stages will get.

A layer timed on two threads and run in a stage process holding one core
takes about twice as long as profiled, in every stage alike, and a split
predicted from it says nothing true about the run. So a profile records
its conditions (threads, device, dtype, the batches it timed), and before
`--pipeline_split=auto` trusts one, the trainer holds them against what its
stages will get. The check is here once; each trainer only says what its
stages get (`StageConditions`), and each planning command times layers
under the same conditions for the same job flags.

The framework is a condition of another kind: a profile measured by the
other framework still ranks a split (the frameworks run the same kernels
on the same device), so it is taken, with one warning line, rather than
refused.

  stage = StageConditions(framework="torch", device="cpu", threads=1,
                          dtype="float32", microbatch_size=4)
  check_conditions(profile, stage, path="plan/profile.json",
                   replan="python -m torch_parity.plan --model=... ")
  warning = foreign_framework_warning(profile, stage, path=..., replan=...)
  run_json["pipeline"]["profile_conditions"] = describe(profile, stage)
"""

import dataclasses
from typing import Optional

from overlap_core.planning.profile import Profile
from overlap_core.runtime.config import ConfigError

FRAMEWORK_TITLES = {"tensorflow": "TensorFlow", "torch": "PyTorch"}


@dataclasses.dataclass(frozen=True)
class StageConditions:
  """What each pipeline stage of this run will run under.

  Attributes:
    framework: the first word of a Profile.framework this trainer writes
      ("tensorflow", "torch").
    device: where a stage runs, in either framework's spelling ("cpu",
      "/gpu:0", "cuda:1"); compared by kind (`device_kind`).
    threads: intra-op threads a stage's layers run on.
    dtype: the compute dtype ("float32").
    microbatch_size: the samples of one stage call.
  """
  framework: str
  device: str
  threads: int
  dtype: str
  microbatch_size: int


def device_kind(device: str) -> str:
  """"cpu", "gpu" or another kind, from either framework's device name:
  TensorFlow's "/gpu:0" and torch's "cuda:0 (NVIDIA H200)" are one kind."""
  name = device.strip().lstrip("/").lower()
  if name.startswith(("cuda", "gpu")):
    return "gpu"
  return name.split(":")[0].split(" ")[0] or "unknown"


def compute_dtype(precision: str) -> str:
  """The dtype layers compute in under --precision (mixed_* compute in the
  half type and keep float32 weights)."""
  return precision.split("_", 1)[1] if precision.startswith("mixed_") \
      else precision


def recorded(profile: Profile) -> dict:
  """The conditions a profile records, as run.json shows them."""
  return {"framework": profile.framework, "device": profile.device,
          "threads": profile.threads, "dtype": profile.dtype,
          "batch_sizes": list(profile.batch_sizes)}


def expected(stage: StageConditions) -> dict:
  """The same keys for what this run's stages get."""
  return {"framework": stage.framework, "device": stage.device,
          "threads": stage.threads, "dtype": stage.dtype,
          "batch_sizes": [stage.microbatch_size]}


def describe(profile: Optional[Profile], stage: StageConditions) -> dict:
  """run.json's `profile_conditions`: the profile's beside the run's (the
  profile's None without one)."""
  return {"profile": recorded(profile) if profile is not None else None,
          "run": expected(stage)}


def difference(profile: Profile, stage: StageConditions) -> Optional[str]:
  """The first condition under which the profile's times do not hold for
  this run's stages, as "<condition> <recorded> (this run: <its>)"; None
  when they all agree. The framework is not one (see module docstring)."""
  if device_kind(profile.device) != device_kind(stage.device):
    return (f"device {profile.device} (this run's stages: "
            f"{device_kind(stage.device)})")
  if profile.threads != stage.threads:
    recorded_threads = (profile.threads if profile.threads
                        else "not recorded")
    return (f"threads {recorded_threads} (this run's stages: "
            f"{stage.threads})")
  if profile.dtype != stage.dtype:
    return f"dtype {profile.dtype} (this run's stages: {stage.dtype})"
  if stage.microbatch_size not in profile.batch_sizes:
    # A plan sums measured layer times where it has them; at a batch never
    # timed every layer would be the fit's guess.
    return (f"batch sizes {','.join(map(str, profile.batch_sizes))} (this "
            f"run's stages: micro-batches of {stage.microbatch_size})")
  return None


def check_conditions(profile: Profile, stage: StageConditions, *,
                     path: str, replan: str) -> None:
  """Refuses a profile measured under other conditions than the stages'.

  Args:
    profile: the --plan_profile read.
    stage: what this run's stages will get.
    path: the --plan_profile value, for the message.
    replan: the command that profiles under this run's conditions.

  Raises:
    ConfigError: one line naming plan_profile, the differing condition
      (recorded, and this run's), and `replan`.
  """
  diff = difference(profile, stage)
  if diff is not None:
    raise ConfigError("plan_profile", path,
                      f"was measured under other conditions than this "
                      f"run's stages get: {diff}; re-profile with {replan}")


def foreign_framework_warning(profile: Optional[Profile],
                              stage: StageConditions, *, path: str,
                              replan: str) -> str:
  """One line for a profile another framework measured, or ""."""
  if profile is None or profile.framework.lower().startswith(stage.framework):
    return ""
  title = FRAMEWORK_TITLES.get(stage.framework, stage.framework)
  return (f"pipeline: warning: --plan_profile={path} was measured in "
          f"{profile.framework}, not {title}, so the split and the predicted "
          f"stage times follow that framework's layer costs; {replan} "
          "measures them here")
