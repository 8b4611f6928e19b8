"""What the planning commands of both frameworks share, from flags to report.

`python -m tfoverlap.plan` and `python -m torch_parity.plan` differ only
in how they read a model's graph and time its layers. The arithmetic on
the run's configuration (which micro-batch a stage sees, which batch sizes
to profile), the early refusal of an impossible split and the report are
here, so both commands print the same plan for the same flags.

  microbatch = plan_microbatch_size(config)
  sizes = profile_batch_sizes(values.plan_batch_sizes, microbatch)
  check_split(graph, config.pipeline, microbatch)   # before profiling
  print(run_plan(graph, profile, config, bandwidth_bytes_per_s=None,
                 output_dir="plan/"))

The commands' flows are here too (`plan_main`, `burst_plan_main`): a
framework's command hands its measuring callables (`Measurer`) and its
flags' values to them, so only how a graph is read and layers are timed
differs between `tfoverlap.plan` and `torch_parity.plan`.
"""

import dataclasses
import os
from typing import Any, Callable, List, NoReturn, Optional, Sequence, Tuple

from overlap_core.planning import (burst_report, conditions, deeppool_format,
                                   partition,
                                   profile_formats, report, split)
from overlap_core.planning.burst_costs import CommModel
from overlap_core.planning.dims import ParallelDims
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile
from overlap_core.runtime import compat, processes
from overlap_core.runtime.config import (ConfigError, PipelineConfig,
                                         TrainConfig)


def check_plannable(config: TrainConfig, framework: str, *,
                    burst: bool = False) -> None:
  """Refuses a pipeline (or, with `burst`, a burst) plan that `framework`'s
  trainer could not run: the compatibility table's rows about what is
  planned. The trainer checks the rest of its flags when it runs.

  Raises:
    ConfigError: one line, e.g. --pipeline_schedule=1f1b for TensorFlow.
  """
  compat.check_planned(config, framework, burst=burst)


def profiling_threads(config: TrainConfig, num_processes: int) -> int:
  """The intra-op threads a pipeline stage runs on, and so the threads to
  time layers on: --intra_op_threads, else what each of the trainer's
  `num_processes` processes on this host gets when launched
  (`processes.threads_per_process`). A layer timed on the whole host and
  run in a stage process holding half of it takes up to twice as long as
  profiled, in every stage alike. The planning commands profile on it and
  the trainers check a profile against it (`conditions`).
  """
  return processes.threads_per_process(config.run.intra_op_threads,
                                      num_processes)


def replan_command(program: str, config: TrainConfig) -> str:
  """The planning command that profiles for this run: `program` with the
  job flags that decide a stage's threads, device share and micro-batch.
  Printed where a profile is refused or foreign, so the user can copy it.
  """
  dist, pipe = config.distribute, config.pipeline
  job = [f"--model={config.model.name}",
         f"--image_size={config.data.image_size}",
         f"--batch_size={config.data.batch_size}",
         f"--strategy={dist.strategy}"]
  if dist.strategy == "mirrored":
    job.append(f"--num_devices={dist.num_devices}")
  if dist.num_workers > 1:
    job.append(f"--num_workers={dist.num_workers}")
  job += [f"--pipeline_stages={pipe.stages}",
          f"--pipeline_microbatches={pipe.microbatches}"]
  if pipe.virtual_stages > 1:
    job.append(f"--pipeline_virtual_stages={pipe.virtual_stages}")
  if config.run.intra_op_threads:
    job.append(f"--intra_op_threads={config.run.intra_op_threads}")
  return " ".join([f"python -m {program}"] + job +
                  ["--plan_output_dir=DIR"])


def plan_microbatch_size(config: TrainConfig) -> int:
  """The micro-batch one stage runs: the replica's batch over M
  (`ParallelDims.microbatch_size`, as the flags reckon the replicas)."""
  return ParallelDims.from_config(config, None).microbatch_size(
      config.data.batch_size, config.pipeline.microbatches)


def stage_conditions(config: TrainConfig, *, framework: str, device: str,
                     num_processes: int) -> conditions.StageConditions:
  """What each stage of `config`'s pipeline runs under, in the terms a
  profile records: the framework's own words for itself and the device,
  and the threads each of `num_processes` processes on this host gets."""
  return conditions.StageConditions(
      framework=framework, device=device,
      threads=profiling_threads(config, num_processes),
      dtype=conditions.compute_dtype(config.model.precision),
      microbatch_size=plan_microbatch_size(config))


def check_stage_profile(config: TrainConfig,
                        stage: Callable[[], conditions.StageConditions],
                        plan_program: str) -> str:
  """`split.check_profile` against what each stage gets (`stage()`, asked
  only for a pipelined run); the warning line for a profile the other
  framework measured, or "".

  Raises:
    ConfigError: naming plan_profile or pipeline_split.
  """
  if config.pipeline.stages == 1:
    return split.check_profile(config.pipeline)
  return split.check_profile(config.pipeline, stage(),
                             replan=replan_command(plan_program, config))


def profile_batch_sizes(requested: Sequence[str], microbatch: int) -> List[int]:
  """--plan_batch_sizes as integers, or the micro-batch, half and double.

  Half is never below 2 unless the micro-batch itself is 1: training-mode
  BatchNorm after global pooling has one value per channel at a batch of
  one and cannot normalize it, so profiling a micro-batch of 2 at 1 would
  fail where the training it plans for does not.

  Raises:
    ValueError: one line, for a size that is not a positive integer.
  """
  if not requested:
    half = min(microbatch, max(2, microbatch // 2))
    return sorted({half, microbatch, 2 * microbatch})
  try:
    sizes = sorted({int(b) for b in requested})
  except ValueError:
    sizes = [0]
  if sizes[0] < 1:
    raise ValueError(f"--plan_batch_sizes={','.join(requested)}: allowed: "
                     "positive integers")
  return sizes


def check_split(graph: LayerGraph, pipe: PipelineConfig,
                microbatch: int) -> None:
  """Refuses a split the graph cannot take, before minutes of profiling.

  Raises:
    ValueError: one line (too many stages, a cut layer that is no cut).
  """
  partition.partition(graph, {n.name: 0.0 for n in graph.nodes},
                      num_stages=pipe.stages * pipe.virtual_stages,
                      batch_size=microbatch, mode=pipe.split,
                      cut_layers=pipe.cut_layers)


def run_plan(graph: LayerGraph, profile: Profile, config: TrainConfig, *,
             bandwidth_bytes_per_s: Optional[float],
             output_dir: str = "") -> str:
  """Fits, splits and reports; writes the plan files when asked.

  Returns:
    The report, followed by a "wrote <path>" line per file written.

  Raises:
    ValueError, KeyError: one line, for a split or profile that does not
      fit the graph.
  """
  pipe = config.pipeline
  result = report.make_plan(
      graph, profile, num_stages=pipe.stages * pipe.virtual_stages,
      microbatch_size=plan_microbatch_size(config),
      num_microbatches=pipe.microbatches, split=pipe.split,
      cut_layers=pipe.cut_layers,
      bandwidth_bytes_per_s=bandwidth_bytes_per_s)
  lines = [report.format_report(result)]
  if output_dir:
    lines += [f"wrote {path}"
              for path in report.write_plan_files(result, output_dir)]
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Measurer:
  """What a framework does in a planning command: it only measures.

  Attributes:
    framework: as the compatibility table names it ("tensorflow").
    build_graph: (config, batch_size) -> (model, LayerGraph): the seeded
      model and its layer graph, traced at batch_size. It may set the
      framework's threads first (before any op runs).
    profile_layers: (model, config, batch_sizes, warmup, repeats) ->
      Profile: every layer timed forward and backward where the trainer
      would run it.
  """
  framework: str
  build_graph: Callable[[TrainConfig, int], Tuple[Any, LayerGraph]]
  profile_layers: Callable[..., Profile]


UsageError = Callable[[str], NoReturn]  # prints one line and exits 2


def plan_main(values, config: TrainConfig, measurer: Measurer, *,
              usage_error: UsageError) -> int:
  """`python -m <side>.plan`: measure (or read --plan_profile), split, report.

  Args:
    values: the parsed flags (those of `flags.plan` included).
    config: the run configuration they make.
    measurer: the framework's measuring callables.
    usage_error: ends the command on a refused input.
  """
  try:
    check_plannable(config, measurer.framework)
  except ConfigError as e:
    usage_error(str(e))
  microbatch = plan_microbatch_size(config)
  try:
    sizes = profile_batch_sizes(values.plan_batch_sizes, microbatch)
  except ValueError as e:
    usage_error(str(e))
  model, graph = measurer.build_graph(config, microbatch)
  try:
    check_split(graph, config.pipeline, microbatch)
    profile = split.load_profile(values.plan_profile)
  except (ValueError, ConfigError) as e:
    usage_error(str(e))
  if profile is None:
    profile = measurer.profile_layers(model, config, sizes,
                                      values.plan_warmup, values.plan_repeats)
  try:
    print(run_plan(
        graph, profile, config,
        bandwidth_bytes_per_s=values.plan_bandwidth_gbps * 1e9 or None,
        output_dir=values.plan_output_dir))
  except (ValueError, KeyError) as e:
    usage_error(str(e).strip("'\""))
  return 0


def burst_plan_main(values, config: TrainConfig, measurer: Measurer, *,
                    usage_error: UsageError) -> int:
  """`python -m <side>.burst_plan`: measure (or read a profile, or
  DeepPool's files), give each layer its width, report.

  Args: as `plan_main`'s; `measurer.profile_layers` is given the
    per-device batches of the candidate widths.
  """
  try:
    check_plannable(config, measurer.framework, burst=True)
  except ConfigError as e:
    usage_error(str(e))
  if values.plan_batch_sizes:
    usage_error(
        f"--plan_batch_sizes={','.join(values.plan_batch_sizes)}: the burst "
        "planner profiles the per-device batches of its widths itself; "
        "allowed: empty")
  deeppool = values.plan_profile_format == "deeppool"
  if values.plan_deeppool_job and not deeppool:
    usage_error(f"--plan_deeppool_job={values.plan_deeppool_job}: applies "
                "only with --plan_profile_format=deeppool")
  num_devices = ParallelDims.from_config(config, None).world_size
  batch = config.data.batch_size
  batches = burst_report.batches_to_profile(global_batch=batch,
                                            num_devices=num_devices)
  if deeppool:
    graph, profile = _read_deeppool(values, usage_error)
  else:
    model, graph = measurer.build_graph(config, batches[0])
    profile = (_read_profile(values.plan_profile,
                             values.plan_profile_format, usage_error)
               if values.plan_profile else
               measurer.profile_layers(model, config, batches,
                                       values.plan_warmup,
                                       values.plan_repeats))
  comm = CommModel(bandwidth_bytes_per_s=values.plan_bandwidth_gbps * 1e9
                   or None)
  try:
    plan = burst_report.make_burst_plan(
        graph, profile, global_batch=batch, num_devices=num_devices,
        amplification_limit=values.amplification_limit, comm=comm)
  except (ValueError, KeyError) as e:
    usage_error(str(e).strip("'\""))
  print(profile.summary())
  print()
  print(plan.table())
  if values.plan_output_dir:
    for path in burst_report.write_burst_files(graph, profile, plan,
                                               values.plan_output_dir):
      print(f"wrote {path}")
  return 0


def _read_profile(path: str, fmt: str, usage_error: UsageError) -> Profile:
  """--plan_profile in the shared schema or, with
  --plan_profile_format=per_layer_times, this project's interchange table."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    if fmt == "per_layer_times":
      return profile_formats.read_per_layer_times(text)
    return Profile.from_json(text)
  except (OSError, ValueError, KeyError, TypeError) as e:
    usage_error(f"--plan_profile={path}: {e}")


def _read_text(flag: str, path: str, usage_error: UsageError) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    usage_error(f"--{flag}={path}: {e}")


def _read_deeppool(values, usage_error: UsageError):
  """DeepPool's graph and times; no model is built, nothing is timed."""
  job, table = values.plan_deeppool_job, values.plan_profile
  if not job or not table:
    usage_error(
        f"--plan_profile_format=deeppool with --plan_deeppool_job={job!r} "
        f"and --plan_profile={table!r}: needs both, DeepPool's job "
        "description JSON and its layer time table")
  try:
    return deeppool_format.read_deeppool(
        _read_text("plan_deeppool_job", job, usage_error),
        _read_text("plan_profile", table, usage_error),
        model=os.path.splitext(os.path.basename(job))[0])
  except ValueError as e:
    usage_error(f"--plan_deeppool_job={job} --plan_profile={table}: {e}")
