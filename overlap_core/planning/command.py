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
"""

from typing import List, Optional, Sequence

from overlap_core.planning import partition, report
from overlap_core.planning.dims import ParallelDims
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile
from overlap_core.runtime import compat, processes
from overlap_core.runtime.config import PipelineConfig, TrainConfig


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
