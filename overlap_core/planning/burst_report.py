"""The burst planning command's steps, shared by both frameworks.

`python -m tfoverlap.burst_plan` and `python -m torch_parity.burst_plan`
differ only in how they read a model's graph and time its layers; each
hands those two callables to `plan_burst_command`, which does the rest:
the checks on the request, the batches to profile, a profile from a file
(the shared schema, the per-layer-times table or DeepPool's files) or
measured, the plan (with a fitted cost model where the profile does not
reach), and the report and files.

  graph, profile, plan = plan_burst_command(
      config, request, build_graph=lambda: ..., measure=lambda batches: ...)
  print_burst_plan(graph, profile, plan, request.output_dir)
"""

import dataclasses
import os
from typing import Callable, List, Optional, Sequence, Tuple

from overlap_core.planning import burst
from overlap_core.planning.burst_costs import (CommModel, default_widths,
                                               split_samples)
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile
from overlap_core.runtime.config import TrainConfig

PLAN_NAME, PNG_NAME = "burst_plan.json", "burst_scaling.png"


def batches_to_profile(*, global_batch: int, num_devices: int,
                       widths: Optional[Sequence[int]] = None
                       ) -> Tuple[int, ...]:
  """The per-device batches a plan reads: the largest part at each width."""
  widths = widths or default_widths(num_devices, global_batch)
  return tuple(sorted({max(split_samples(global_batch, k)) for k in widths}))


def make_burst_plan(graph: LayerGraph, profile: Profile, *,
                    global_batch: int, num_devices: int,
                    amplification_limit: float,
                    comm: Optional[CommModel] = None,
                    widths: Optional[Sequence[int]] = None
                    ) -> burst.BurstPlan:
  """Plans; fits the cost model only if the profile misses a batch.

  Raises:
    ValueError, KeyError: one line, for what cannot be planned.
  """
  needed = set(batches_to_profile(global_batch=global_batch,
                                  num_devices=num_devices, widths=widths))
  cost_model = None
  if not needed <= set(profile.batch_sizes):
    # pylint: disable=g-import-not-at-top
    from overlap_core.planning.cost_model import fit_cost_model
    cost_model = fit_cost_model([(graph, profile)])
  return burst.plan_burst(graph, profile, global_batch=global_batch,
                          num_devices=num_devices,
                          amplification_limit=amplification_limit,
                          comm=comm or CommModel(), cost_model=cost_model,
                          widths=widths)


def write_burst_files(graph: LayerGraph, profile: Profile,
                      plan: burst.BurstPlan, output_dir: str) -> List[str]:
  """graph.json, profile.json, burst_plan.json and burst_plan.txt; prints
  the command that draws the scaling plot from them."""
  os.makedirs(output_dir, exist_ok=True)
  files = {"graph.json": graph.to_json(), "profile.json": profile.to_json(),
           PLAN_NAME: plan.to_json(), "burst_plan.txt": plan.table() + "\n"}
  paths = []
  for name, text in files.items():
    path = os.path.join(output_dir, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    paths.append(path)
  # The plot needs matplotlib, which the neutral core never loads, and is
  # drawn by the comparison package, which sits above it; so the planner
  # names the command instead of running a layer above its own.
  print(f"scaling plot: python -m overlap_compare.burst_plot "
        f"{os.path.join(output_dir, PLAN_NAME)} "
        f"{os.path.join(output_dir, PNG_NAME)}")
  return paths


def read_plan(path: str) -> burst.BurstPlan:
  """A burst plan from its JSON file: what --burst_parallel checks and a
  trainer then runs.

  Raises:
    ValueError: one line, saying whether the file could not be read or
      does not hold a burst plan.
  """
  try:
    with open(path, encoding="utf-8") as f:
      return burst.BurstPlan.from_json(f.read())
  except OSError as e:
    raise ValueError(f"cannot read it ({e.strerror})") from None
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"not a burst plan ({' '.join(str(e).split())})"
                     ) from None


def plan_against_run(plan: burst.BurstPlan, plan_path: str,
                     ledger_summary: dict) -> dict:
  """run.json's `burst` section: what the plan predicted beside what the
  run measured, so that a user sees where the cost model was wrong."""
  measured_s = ledger_summary["phases"]["step"]["mean"]
  predicted_s = plan.iteration_s
  return {
      "plan": plan_path,
      "model": plan.model,
      "num_devices": plan.num_devices,
      "global_batch": plan.global_batch,
      "amplification_limit": plan.amplification_limit,
      "widths_by_layer": plan.widths_by_layer(),
      "predicted_iteration_ms": predicted_s * 1e3,
      "predicted_data_parallel_iteration_ms":
          plan.data_parallel_iteration_s * 1e3,
      "measured_step_ms": measured_s * 1e3,
      # > 1: the run was slower than the plan said (data wait included).
      "measured_over_predicted": (measured_s / predicted_s
                                  if predicted_s > 0 else None),
  }


@dataclasses.dataclass(frozen=True)
class BurstRequest:
  """The planning flags a burst command reads (--plan_*), as plain data."""
  profile_path: str = ""
  profile_format: str = "shared"
  deeppool_job: str = ""
  batch_sizes: Tuple[str, ...] = ()
  bandwidth_gbps: float = 0.0
  output_dir: str = ""


def check_burst_request(request: BurstRequest) -> None:
  """Refuses planning flags a burst plan has no use for.

  Raises:
    ValueError: one line naming the flag, its value and what is allowed.
  """
  if request.batch_sizes:
    raise ValueError(
        f"--plan_batch_sizes={','.join(request.batch_sizes)}: the burst "
        "planner profiles the per-device batches of its widths itself; "
        "allowed: empty")
  if request.deeppool_job and request.profile_format != "deeppool":
    raise ValueError(f"--plan_deeppool_job={request.deeppool_job}: applies "
                     "only with --plan_profile_format=deeppool")


def _read_text(flag: str, path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    raise ValueError(f"--{flag}={path}: {e}") from None


def read_profile_file(path: str, profile_format: str) -> Profile:
  """--plan_profile, in the shared schema or this project's per-layer
  times table.

  Raises:
    ValueError: one line naming --plan_profile.
  """
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import profile_formats
  text = _read_text("plan_profile", path)
  try:
    if profile_format == "per_layer_times":
      return profile_formats.read_per_layer_times(text)
    return Profile.from_json(text)
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"--plan_profile={path}: {e}") from None


def read_deeppool_files(request: BurstRequest
                        ) -> Tuple[LayerGraph, Profile]:
  """DeepPool's graph and times; no model is built, nothing is timed.

  Raises:
    ValueError: one line naming the two flags.
  """
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import deeppool_format
  job, table = request.deeppool_job, request.profile_path
  if not job or not table:
    raise ValueError(
        f"--plan_profile_format=deeppool with --plan_deeppool_job={job!r} "
        f"and --plan_profile={table!r}: needs both, DeepPool's job "
        "description JSON and its layer time table")
  job_text = _read_text("plan_deeppool_job", job)
  table_text = _read_text("plan_profile", table)
  try:
    return deeppool_format.read_deeppool(
        job_text, table_text,
        model=os.path.splitext(os.path.basename(job))[0])
  except ValueError as e:
    raise ValueError(f"--plan_deeppool_job={job} --plan_profile={table}: "
                     f"{e}") from None


def plan_burst_command(
    config: TrainConfig, request: BurstRequest, *,
    build_graph: Callable[[int], LayerGraph],
    measure: Callable[[Sequence[int]], Profile]
) -> Tuple[LayerGraph, Profile, burst.BurstPlan]:
  """A burst planning command's flow, after its framework is chosen.

  Args:
    config: the run the plan is for: its devices (--num_workers, times
      --num_devices under mirrored), global batch (--batch_size) and
      --amplification_limit.
    request: the --plan_* flags.
    build_graph: build_graph(batch) -> the model's layer graph, read at
      that batch (not called for DeepPool's files).
    measure: measure(batches) -> the model's profile, every layer timed
      at each batch (called only without --plan_profile).

  Raises:
    ValueError, KeyError: one line, for what cannot be planned.
  """
  # pylint: disable=g-import-not-at-top
  from overlap_core.planning import command
  check_burst_request(request)
  num_devices = command.world_size(config)
  batch = config.data.batch_size
  batches = batches_to_profile(global_batch=batch, num_devices=num_devices)
  if request.profile_format == "deeppool":
    graph, profile = read_deeppool_files(request)
  else:
    graph = build_graph(batches[0])
    profile = (read_profile_file(request.profile_path,
                                 request.profile_format)
               if request.profile_path else measure(batches))
  comm = CommModel(bandwidth_bytes_per_s=request.bandwidth_gbps * 1e9
                   or None)
  plan = make_burst_plan(graph, profile, global_batch=batch,
                         num_devices=num_devices,
                         amplification_limit=config.burst.amplification_limit,
                         comm=comm)
  return graph, profile, plan


def print_burst_plan(graph: LayerGraph, profile: Profile,
                     plan: burst.BurstPlan, output_dir: str) -> None:
  """The command's report: the profile, the plan's table, and the files
  with `output_dir`."""
  print(profile.summary())
  print()
  print(plan.table())
  if output_dir:
    for path in write_burst_files(graph, profile, plan, output_dir):
      print(f"wrote {path}")
