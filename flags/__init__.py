"""The one absl flag surface of tfoverlap, shared by every entry point.

Usage in an entry point:

  from absl import app
  import flags as tfo_flags

  tfo_flags.define_flags()

  def main(argv):
    config = tfo_flags.to_config(tfo_flags.FLAGS)
    ...

  app.run(main, flags_parser=tfo_flags.parse_or_exit)

Groups live in one module each; `define_flags()` defines them all exactly
once. `to_config()` is the only place where flag values become a validated,
frozen `TrainConfig`; anything it refuses exits with status 2 and one line.
"""

import dataclasses
import os
import re
import sys

from absl import flags as absl_flags

from flags import (burst, checkpoint, data, distribute, help as flag_help,
                   model, offload, pipeline, run)
from overlap_core.planning.dims import ParallelDims
from overlap_core.runtime import ledger, paired_removal, user_code
from overlap_core.runtime.config import (AUTOTUNE, CheckpointConfig,
                                         ConfigError, DataConfig, DistributeConfig,
                                         ModelConfig, OffloadConfig,
                                         PipelineConfig, RunConfig,
                                         TrainConfig, USAGE_ERROR_EXIT_CODE,
                                         every_steps_from)

FLAGS = absl_flags.FLAGS
GROUPS = {
    "run": run,
    "model": model,
    "data": data,
    "distribute": distribute,
    "checkpoint": checkpoint,
    "pipeline": pipeline,
    "offload": offload,
    "burst": burst,
}
RUNTIME_ERROR_EXIT_CODE = 1

_HELP_FLAGS = ("--help", "-help", "--helpshort", "--helpfull", "--helpxml",
               "-?")
_DATA_SERVICE_ADDRESS = re.compile(r"^(grpc://)?[\w.\-\[\]:]+:\d+$")


def define_flags(flag_values=FLAGS):
  """Defines every group's flags once; later calls do nothing."""
  if "model_dir" in flag_values:
    return
  for group in GROUPS.values():
    group.define_flags()


def parse_or_exit(argv, validate: bool = True):
  """absl `flags_parser`: parses and validates, or exits 2 with one line.

  Args:
    argv: the command line, program name first.
    validate: also build the TrainConfig, refusing what it refuses; a
      launcher that only reads its own flags passes False.
  """
  asked = flag_help.asked_for(argv)
  if asked:
    # Before parsing: help needs no valid value of any other flag.
    print(flag_help.full_help(FLAGS) if asked == "full"
          else flag_help.short_help(FLAGS))
    sys.exit(0)
  try:
    remaining = FLAGS(argv)
  except absl_flags.Error as e:
    exit_with_usage_error(str(e))
  except SystemExit as e:
    # absl's help flags exit 1 after printing; asking for help succeeded.
    asked_help = any(a.split("=")[0] in _HELP_FLAGS for a in argv[1:])
    sys.exit(0 if asked_help and e.code == 1 else e.code)
  if len(remaining) > 1:
    exit_with_usage_error(
        f"unexpected positional arguments {remaining[1:]}; flags take the "
        "form --name=value")
  if validate:
    try:
      to_config(FLAGS)
    except ConfigError as e:
      exit_with_config_error(e)
  return remaining


def parse_launcher_argv(argv, *, build_worker_args, check=None,
                        counts_workers=None):
  """A launcher's flags before `--`; the trainer's after it, validated now.

  Args:
    argv: the launcher's command line, program name first.
    build_worker_args: (trainer_args, num_workers) -> the flags every
      process runs with.
    check: optional (TrainConfig) -> None raising ConfigError, for what only
      the launched trainer refuses; it runs here so that nothing starts,
      as does the import of the user's --model and --dataset modules.
    counts_workers: optional (trainer_args) -> whether the job's processes
      are --num_workers (default: always); a job that sizes itself from the
      trainer's flags (a stage server per pipeline stage) skips the check.

  Returns:
    [program, *worker_args], already checked as the trainer will check
    them: a bad flag exits 2 before any process starts.
  """
  if "--" in argv:
    split = argv.index("--")
    own, trainer_args = argv[:split], argv[split + 1:]
  else:
    own, trainer_args = argv, []
  parse_or_exit(own, validate=False)
  num_workers = FLAGS.num_workers
  if num_workers < 2 and (counts_workers is None or
                          counts_workers(trainer_args)):
    exit_with_usage_error(
        f"--num_workers={num_workers}: the launcher starts 2 or more workers")
  worker_args = build_worker_args(trainer_args, num_workers)
  FLAGS.unparse_flags()
  parse_or_exit(argv[:1] + worker_args)  # exits 2 on a bad flag
  try:
    config = to_config(FLAGS)
    if check is not None:
      check(config)
    # The user's module imports, or one line now rather than one per worker.
    user_code.check_importable(config.model.name, config.data.dataset)
  except ConfigError as e:
    exit_with_config_error(e)
  return argv[:1] + worker_args


def exit_with_config_error(error: ConfigError):
  """Exits 2 with the refusal's one line and the page that explains it."""
  exit_with_usage_error(flag_help.refusal_line(error, FLAGS))


def exit_with_usage_error(message: str):
  program = os.path.basename(sys.argv[0]) if sys.argv else "tfoverlap"
  print(f"{program}: error: {' '.join(message.split())}", file=sys.stderr)
  sys.exit(USAGE_ERROR_EXIT_CODE)


def exit_with_runtime_error(program: str, error: Exception):
  """Exits 1 with one line naming the error, for a run that failed.

  A lost peer, an exhausted device or a full disk is not a usage error: the
  user gets the error's type and first line, not a traceback (the trainers
  log that at debug level).

  Args:
    program: the entry point to name, e.g. "tfoverlap.train".
    error: what ended the run.
  """
  first_line = (str(error).strip().splitlines() or [""])[0]
  print(f"{program}: error: {type(error).__name__}: {first_line}",
        file=sys.stderr)
  sys.exit(RUNTIME_ERROR_EXIT_CODE)


def _parse_depth(name: str, text: str, minimum: int) -> int:
  if text.strip().lower() == "autotune":
    return AUTOTUNE
  try:
    value = int(text)
  except ValueError:
    value = None
  if value is None or value < minimum:
    raise ConfigError(name, text,
                      f"allowed: autotune or an integer >= {minimum}")
  return value


ZOO_DATASETS = ("digits", "synthetic", "tfds", "image_folder")


def _check_model(values) -> None:
  """--model's form (the module is imported only by the trainer)."""
  user_code.model_kind(values.model)


def _check_paired_removal(values) -> None:
  """Both halves of a paired removal count steps past the warm-up."""
  pairing = paired_removal.from_config(values.paired_removal,
                                       values.paired_block_steps)
  if pairing is None:
    return

  def both_counted(num_steps):
    counts = pairing.counted_steps(num_steps,
                                   ledger.default_warmup_steps(num_steps))
    return all(counts.values())

  if not both_counted(values.train_steps):
    least = next(n for n in range(values.train_steps, 1 << 20)
                 if both_counted(n))
    raise ConfigError(
        "train_steps", values.train_steps,
        f"with --paired_removal={values.paired_removal} and "
        f"--paired_block_steps={values.paired_block_steps}, one half counts "
        "no step past the warm-up and its blocks' settling; allowed: "
        f"{least} or more")


def _check_data(values) -> None:
  if (values.dataset not in ZOO_DATASETS and
      not user_code.is_import_path(values.dataset)):
    raise ConfigError("dataset", values.dataset,
                      f"allowed: {', '.join(ZOO_DATASETS)}, or "
                      "package.module:callable")
  user_code.check_user_data(dataset=values.dataset, cache=values.cache,
                            preprocess_cost_ms=values.preprocess_cost_ms)
  needs_dir = values.dataset in ("tfds", "image_folder")
  if needs_dir and not values.data_dir:
    raise ConfigError("data_dir", values.data_dir,
                      f"--dataset={values.dataset} needs a local data_dir "
                      "(tfoverlap never downloads)")
  if needs_dir and not os.path.isdir(values.data_dir):
    raise ConfigError("data_dir", values.data_dir,
                      "no such directory; allowed: an existing local directory")
  if values.data_dir and not needs_dir:
    raise ConfigError("data_dir", values.data_dir,
                      "applies only to --dataset=tfds or image_folder, not "
                      f"--dataset={values.dataset}")
  if values.synthetic_on_device and values.dataset != "synthetic":
    raise ConfigError("synthetic_on_device", True,
                      "applies only to --dataset=synthetic")
  service = values.data_service
  if service not in ("", "local") and not _DATA_SERVICE_ADDRESS.match(service):
    raise ConfigError("data_service", service,
                      "allowed: empty, local, or an address like "
                      "grpc://localhost:5050")
  spec = user_code.model_spec(values.model)
  if spec is None:
    return  # the user's builder decides what sizes it takes
  if values.image_size < spec.min_image_size:
    raise ConfigError("image_size", values.image_size,
                      f"--model={values.model} needs at least "
                      f"{spec.min_image_size}")
  if values.image_size % spec.upscale:
    raise ConfigError("image_size", values.image_size,
                      f"--model={values.model} needs a multiple of "
                      f"{spec.upscale} (its upscale factor)")


def _parallel_dims(values) -> ParallelDims:
  """The run's degrees as the shared flags reckon them, before a trainer is
  known: a world the stages do not divide counts as one pipeline, and each
  trainer refuses it with its own reason (`ParallelDims.for_run`)."""
  return ParallelDims.for_run(
      strategy=values.strategy, num_workers=values.num_workers,
      num_devices=values.num_devices, pipeline_stages=values.pipeline_stages,
      framework=None)


def _check_distribute(values) -> None:
  replicas = _parallel_dims(values).data_parallel
  if values.batch_size % replicas:
    raise ConfigError("batch_size", values.batch_size,
                      f"must divide evenly over {replicas} replicas")


def _parse_pipeline(values) -> PipelineConfig:
  """--pipeline_*: refuses combinations no schedule can run."""
  stages, micro = values.pipeline_stages, values.pipeline_microbatches
  schedule, virtual = values.pipeline_schedule, values.pipeline_virtual_stages
  split = values.pipeline_split.strip()
  profile = values.plan_profile.strip()
  if stages == 1:
    for flag, value, default in (("pipeline_microbatches", micro, 1),
                                 ("pipeline_schedule", schedule, "gpipe"),
                                 ("pipeline_split", split, "auto"),
                                 ("pipeline_virtual_stages", virtual, 1),
                                 ("pipeline_overlap_all_reduce",
                                  values.pipeline_overlap_all_reduce, True),
                                 ("pipeline_runtime",
                                  values.pipeline_runtime, "devices"),
                                 ("pipeline_stages_apart",
                                  values.pipeline_stages_apart, False)):
      if value != default:
        raise ConfigError(flag, value, "applies only with "
                          "--pipeline_stages of 2 or more")
  # Each pipeline splits its replica's batch, which for a TensorFlow
  # pipeline (its stages are the devices) is the whole batch.
  per_pipeline = _parallel_dims(values).replica_batch_size(values.batch_size)
  if per_pipeline % micro:
    raise ConfigError("pipeline_microbatches", micro,
                      f"must divide each pipeline's batch of {per_pipeline}")
  if schedule != "gpipe" and micro < stages:
    raise ConfigError("pipeline_microbatches", micro,
                      f"--pipeline_schedule={schedule} needs at least as "
                      f"many micro-batches as stages ({stages})")
  interleaved = schedule in ("interleaved_1f1b", "zero_bubble")
  if interleaved and virtual < 2:
    raise ConfigError("pipeline_virtual_stages", virtual,
                      f"--pipeline_schedule={schedule} runs 2 or more "
                      "stages per rank")
  if virtual > 1 and not interleaved:
    raise ConfigError("pipeline_virtual_stages", virtual,
                      "applies only to --pipeline_schedule=interleaved_1f1b "
                      "or zero_bubble")
  if interleaved and micro % stages:
    raise ConfigError("pipeline_microbatches", micro,
                      f"--pipeline_schedule={schedule} needs a multiple of "
                      f"the {stages} stages")
  cut_layers = ()
  if split not in ("auto", "even"):
    cut_layers = tuple(c.strip() for c in split.split(","))
    if "" in cut_layers or len(cut_layers) != stages * virtual - 1:
      raise ConfigError("pipeline_split", split,
                        f"{stages * virtual} stages need "
                        f"{stages * virtual - 1} comma-separated cut layers;"
                        " allowed: auto, even, or layer names")
    split = "explicit"
  if profile and not os.path.isfile(profile):
    raise ConfigError("plan_profile", profile, "no such file; allowed: a "
                      "profile JSON, e.g. python -m tfoverlap.plan (or "
                      "torch_parity.plan) --plan_output_dir=DIR writes "
                      "DIR/profile.json")
  return PipelineConfig(stages=stages, microbatches=micro, schedule=schedule,
                        split=split, cut_layers=cut_layers,
                        virtual_stages=virtual, profile=profile,
                        overlap_all_reduce=values.pipeline_overlap_all_reduce,
                        runtime=values.pipeline_runtime,
                        stages_apart=values.pipeline_stages_apart)


def _build_offload(values) -> OffloadConfig:
  """--offload and its knobs; the knobs alone, with nothing offloaded, would
  change nothing, so they are refused rather than ignored."""
  names = [n.strip() for n in values.offload if n.strip()]
  allowed = ("allowed: none, or a comma-separated list of "
             f"{', '.join(offload.OFFLOAD_TARGETS)}")
  text = ",".join(values.offload)
  if names in ([], ["none"]):
    targets = ()
  elif "none" in names or len(set(names)) != len(names) or any(
      n not in offload.OFFLOAD_TARGETS for n in names):
    raise ConfigError("offload", text, allowed)
  else:
    targets = tuple(n for n in offload.OFFLOAD_TARGETS if n in names)
  knobs = {"offload_pin_memory": values.offload_pin_memory,
           "offload_non_blocking": values.offload_non_blocking,
           "offload_prefetch": values.offload_prefetch}
  for name, value in knobs.items():
    if value and not targets:
      raise ConfigError(name, True, "applies only with --offload=" +
                        "|".join(offload.OFFLOAD_TARGETS))
  if values.offload_prefetch and not values.offload_non_blocking:
    # The side stream joins the main one before each fetch; a blocking
    # copy there would make the host wait for all the compute queued so
    # far, at every prefetch.
    raise ConfigError("offload_prefetch", True,
                      "a blocking copy on the side stream makes the host "
                      "wait for all queued compute at every prefetch; "
                      "allowed with --offload_non_blocking")
  return OffloadConfig(targets=targets,
                       pin_memory=values.offload_pin_memory,
                       non_blocking=values.offload_non_blocking,
                       prefetch=values.offload_prefetch)


def _from_same_named_flags(config_class, values, **parsed):
  """A `config_class` whose every field is the flag of its name.

  Args:
    config_class: a config dataclass.
    values: parsed flag values.
    **parsed: the fields whose flag has another name or needs parsing.
  """
  same_named = {field.name: getattr(values, field.name)
                for field in dataclasses.fields(config_class)
                if field.name not in parsed}
  return config_class(**same_named, **parsed)


def to_config(values=FLAGS) -> TrainConfig:
  """Builds the validated run configuration from parsed flag values.

  Raises:
    ConfigError: naming the first flag whose value is not allowed.
  """
  prefetch = _parse_depth("prefetch", values.prefetch, minimum=0)
  map_parallelism = _parse_depth("map_parallelism", values.map_parallelism,
                                 minimum=1)
  _check_model(values)
  _check_data(values)
  _check_distribute(values)
  _check_paired_removal(values)
  return TrainConfig(
      run=_from_same_named_flags(RunConfig, values),
      model=_from_same_named_flags(ModelConfig, values, name=values.model),
      data=_from_same_named_flags(DataConfig, values, prefetch=prefetch,
                                  map_parallelism=map_parallelism),
      distribute=_from_same_named_flags(DistributeConfig, values),
      checkpoint=CheckpointConfig(
          mode=values.checkpoint,
          every_steps=every_steps_from(
              values.checkpoint_every,
              checkpoint.CONFIG_NAMES["every_steps"]),
          keep=values.checkpoint_keep,
          max_overhead_frac=values.checkpoint_max_overhead,
          on_error=values.checkpoint_on_error,
          if_busy=values.checkpoint_if_busy,
          names=checkpoint.CONFIG_NAMES),
      pipeline=_parse_pipeline(values),
      offload=_build_offload(values),
      burst=burst.build_config(values))


def flag_names(flag_values=FLAGS) -> dict:
  """The flags each group defines, by group: the surface a test freezes."""
  by_module = flag_values.flags_by_module_dict()
  return {
      group: sorted(f.name for f in by_module.get(module.__name__, []))
      for group, module in GROUPS.items()
  }
