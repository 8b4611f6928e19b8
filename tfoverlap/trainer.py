"""One TensorFlow training run from a TrainConfig: build, train, record.

The order matters: the host is configured before TensorFlow touches a
device, the strategy exists before any variable, and the model and optimizer
are built inside its scope so their variables are replicated.
"""

import contextlib
import dataclasses
import os
import sys
import time

import keras
import tensorflow as tf

from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.planning import burst_report, command, conditions
from overlap_core.planning import split as split_lib
from overlap_core.runtime import background, compat, ledger as ledger_lib
from overlap_core.runtime import outputs, run_record, zoo
from overlap_core.runtime.config import (ConfigError, TrainConfig,
                                         check_burst_supported)
from overlap_core.runtime.loop_context import LoopContext
from overlap_core.runtime.progress import ProgressPrinter
from tfoverlap import (burst, checkpoint, data, distribute, loops, models,
                       parallelize, pipeline, steps)

FRAMEWORK = "tensorflow"


def check_supported(config: TrainConfig, *, num_gpus: int = None) -> None:
  """Refuses every flag value that has no meaning in TensorFlow.

  The one place that decides what this trainer cannot honour, so that no
  flag is ever silently ignored; the launcher calls it too, before any
  worker starts. Which features combine is `overlap_core.runtime.compat`'s
  table; what is left here are counts this host or runtime must match.

  Args:
    config: the validated run configuration.
    num_gpus: GPUs on this host (default: what TensorFlow sees).

  Raises:
    ConfigError: naming the flag, the value and why.
  """
  if num_gpus is None:
    num_gpus = len(tf.config.list_physical_devices("GPU"))
  compat.check_combinations(config, FRAMEWORK,
                            host=compat.Host(num_gpus=num_gpus))
  pipeline.check_pipeline_supported(config, num_gpus=num_gpus)
  loops.check_steps_per_execution(config)
  check_burst_supported(
      config.burst, host_devices=num_gpus or os.cpu_count(),
      device_kind="GPUs" if num_gpus else "CPU cores")


def describe_environment(strategy: tf.distribute.Strategy) -> dict:
  environment = run_record.describe_host()
  environment.update({
      "tensorflow": tf.__version__,
      "keras": keras.__version__,
      "devices": [d.name for d in tf.config.list_logical_devices()],
      "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
      "num_replicas": strategy.num_replicas_in_sync,
  })
  return environment


def weights_digest(model) -> str:
  return run_record.digest_weights(
      (w.path, w.numpy()) for w in model.weights)


def _build_train_input(strategy, config: TrainConfig, spec,
                       start_batch: int):
  """The distributed training data, or resident batches with no pipeline."""
  if config.data.synthetic_on_device:
    return data.make_resident_iterator(strategy, config.data, task=spec.task,
                                       seed=config.run.seed,
                                       upscale=spec.upscale)
  input_fn = data.make_input_fn(config.data, split="train", task=spec.task,
                                seed=config.run.seed, upscale=spec.upscale,
                                start_batch=start_batch)
  return data.distribute_input(strategy, input_fn, config.data)


def _burst_spec(config: TrainConfig, plan):
  """What parallelize needs to run the plan, or None without one."""
  if plan is None:
    return None
  return parallelize.BurstSpec(
      plan, config.burst.plan_path,
      distribute.mirrored_devices(config.distribute.num_devices))


def _build_model_and_optimizer(strategy, config: TrainConfig, num_classes,
                               channels, plan=None
                               ) -> parallelize.Parallelized:
  steps.apply_precision_policy(config.model.precision)
  return parallelize.parallelize(
      strategy,
      build_model=lambda: models.build_model(
          config.model.name, image_size=config.data.image_size,
          num_classes=num_classes, channels=channels),
      build_optimizer=lambda: steps.build_optimizer(config.model),
      offload=config.offload,
      pipeline=_pipeline_spec(config),
      burst=_burst_spec(config, plan),
      # Op determinism refuses the graph's clock.
      time_offload_copies=not config.run.deterministic)


def _pipeline_spec(config: TrainConfig):
  """How parallelize cuts the model, or None when it is not pipelined."""
  cfg = config.pipeline
  if cfg.stages == 1:
    return None
  profile = split_lib.load_profile(cfg.profile)
  # Kinder than a refusal: another framework's costs still rank a split,
  # but the user should know whose costs they are.
  warning = pipeline.check_profile(config)
  if warning:
    print(warning, file=sys.stderr, flush=True)
  # One pipeline takes the whole batch (no data parallelism with stages).
  return parallelize.PipelineSpec(
      cfg, microbatch_size=command.plan_microbatch_size(config),
      devices=distribute.mirrored_devices(cfg.stages), profile=profile)


def _build_strategy(config: TrainConfig) -> tf.distribute.Strategy:
  """The run's strategy. A pipelined run places its stages itself, and a
  burst plan splits each layer over the devices itself, both on the
  devices a mirrored run would replicate over, under no strategy."""
  if config.pipeline.stages > 1 or config.burst.enabled:
    return tf.distribute.get_strategy()
  return distribute.build_strategy(config.distribute)


def _run_loop(ctx: LoopContext, strategy, config: TrainConfig, spec,
              built: parallelize.Parallelized) -> float:
  """Runs the configured loop over the remaining steps; the last loss."""
  model, optimizer = built.model, built.optimizer
  # One global batch per step: the steps done are the batches consumed.
  train_input = _build_train_input(strategy, config, spec,
                                   start_batch=ctx.first_step - 1)
  if ctx.first_step > ctx.last_step:
    return float("nan")
  k = config.run.steps_per_execution
  if config.run.loop == "fit":
    remaining = ctx.last_step - ctx.first_step + 1
    if remaining % k:
      raise ConfigError(
          "steps_per_execution", k,
          f"the run resumes after step {ctx.first_step - 1} and model.fit "
          f"runs whole executions, but {remaining} steps remain; allowed: "
          f"a divisor of {remaining}, or --loop=ctl")
    return loops.run_fit_loop(ctx, model=model, optimizer=optimizer,
                              loss_fn=loops.fit_loss(spec.task),
                              distributed_data=train_input,
                              steps_per_execution=k)
  if built.pipeline:
    return _run_pipelined_loop(ctx, config, spec, built.pipeline, optimizer,
                               iter(train_input))
  # Timed offload copies are carved out of each step's compute span.
  timed_offload = (built.offload if built.offload and built.offload.timed
                   else None)
  if k > 1:
    return loops.run_multi_step_loop(
        ctx, train_steps=steps.make_multi_step_train_step(
            model, optimizer, strategy, task=spec.task,
            global_batch_size=config.data.batch_size,
            time_waits=not config.run.deterministic),
        iterator=iter(train_input), steps_per_execution=k,
        take_offload_copy_s=(timed_offload.take_copy_s if timed_offload
                             else None))
  if built.burst:
    train_step = burst.record_first_step_placements(
        steps.make_burst_train_step(
            built.burst, model, optimizer, task=spec.task,
            global_batch_size=config.data.batch_size),
        model, built.burst_placements)
  else:
    train_step = steps.make_train_step(
        model, optimizer, strategy, task=spec.task,
        global_batch_size=config.data.batch_size)
  return loops.run_custom_loop(
      ctx, train_step=train_step, iterator=iter(train_input),
      split_compute=timed_offload.split_compute if timed_offload else None)


def _run_pipelined_loop(ctx: LoopContext, config: TrainConfig, spec, runtime,
                        optimizer, iterator) -> float:
  """The custom loop over GPipe steps, each step's compute span split into
  stage compute, transfer and bubble from stages timed alone first."""
  loss_fn = steps.make_pipeline_loss(spec.task, config.data.batch_size)
  inputs, targets = steps.example_batch(runtime.model, spec.task,
                                        config.data.batch_size)
  runtime.measure_stages(inputs, targets, loss_fn, optimizer=optimizer)
  return loops.run_custom_loop(
      ctx, train_step=runtime.make_train_step(optimizer, loss_fn),
      iterator=iterator, split_compute=runtime.record_step)


def _describe_strategy(strategy, config: TrainConfig,
                       built: parallelize.Parallelized, plan,
                       ledger) -> dict:
  described = {**distribute.describe_strategy(strategy, config.distribute),
               "parallel_dims": built.dims.describe()}
  if built.pipeline:
    described["pipeline_devices"] = list(built.pipeline.devices)
  if plan is not None:
    described["class"] = "tfoverlap.burst"
    described["devices"] = list(_burst_spec(config, plan).devices)
    described["burst"] = burst_report.plan_against_run(
        plan, config.burst.plan_path, ledger.summary())
    # The plan names layers neutrally, PyTorch's traced functions
    # included; these are the Keras layers' widths
    # (tfoverlap.burst.widths_for_model), and where the first step's parts
    # really computed.
    described["burst"]["widths_run"] = burst.widths_for_model(
        built.model, plan)
    described["burst"]["placements_run"] = dict(built.burst_placements)
  return described


def _evaluate(strategy, config: TrainConfig, spec, model) -> dict:
  eval_fn = data.make_input_fn(config.data, split="eval", task=spec.task,
                               seed=config.run.seed, upscale=spec.upscale)
  return steps.evaluate(model,
                        data.distribute_input(strategy, eval_fn, config.data),
                        strategy, task=spec.task)


def train(config: TrainConfig) -> dict:
  """Runs training as configured; returns the run record it wrote.

  Raises:
    ConfigError: for a setting this framework or host cannot honour.
  """
  start = time.perf_counter()
  check_supported(config)
  worker_index, num_workers = (distribute.cluster_from_env()
                               if config.distribute.strategy == "multi_worker"
                               else (0, 1))
  config = run_record.with_default_model_dir(config, FRAMEWORK)
  out_dir = run_record.worker_dir(config.run.model_dir, worker_index)
  # Before anything is built: a second run on the directory ends at once.
  with outputs.hold_worker_dir(out_dir):
    return _train_holding(config, out_dir, worker_index, num_workers,
                          start=start)


def _train_holding(config: TrainConfig, out_dir: str, worker_index: int,
                   num_workers: int, *, start: float) -> dict:
  """`train`, once this process holds `out_dir`."""
  distribute.configure_host(config.distribute, config.run)
  keras.utils.set_random_seed(config.run.seed)
  if config.run.deterministic:
    tf.config.experimental.enable_op_determinism()
  strategy = _build_strategy(config)

  service = None
  if config.data.data_service == "local":
    service = data.start_data_service()
    config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, data_service=service.address))
  try:
    spec = zoo.MODELS[config.model.name]
    info = data.describe(config.data)
    plan = (burst_report.read_plan(config.burst.plan_path)
            if config.burst.enabled else None)
    built = _build_model_and_optimizer(
        strategy, config, info.num_classes, info.channels, plan)
    model, optimizer = built.model, built.optimizer
    offloader = built.offload
    checkpointer = checkpoint.build_checkpointer(
        config.checkpoint, config.run.model_dir, model=model,
        optimizer=optimizer, is_chief=worker_index == 0,
        worker_index=worker_index,
        describe_state=checkpoint_engine.make_state_describer(
            config.data, seed=config.run.seed,
            num_train_examples=info.num_train_examples),
        agree=distribute.make_agree(strategy))
    resume = checkpointer.restore_latest() if checkpointer else None
    restored_step = resume.step if resume else 0

    ledger = ledger_lib.StepLedger()
    ctx = LoopContext(
        ledger=ledger,
        progress=ProgressPrinter(
            total_steps=config.run.train_steps,
            every_steps=config.run.log_every_steps,
            enabled=config.run.progress and worker_index == 0,
            prefix="" if num_workers == 1 else f"[worker {worker_index}] "),
        checkpointer=checkpointer,
        write_scalars=loops.make_scalar_writer(
            os.path.join(out_dir, "tensorboard")
            if config.run.tensorboard else None,
            config.run.log_every_steps, ledger),
        first_step=restored_step + 1,
        last_step=config.run.train_steps,
        global_batch_size=config.data.batch_size,
        background=(background.make_runner(
            config.burst.background_job, out_dir,
            first_step=restored_step + 1, last_step=config.run.train_steps,
            global_batch_size=config.data.batch_size)
                    if config.burst.background and worker_index == 0
                    else None))
    try:
      final = {"train_loss": _run_loop(ctx, strategy, config, spec, built)}
    except BaseException:
      if checkpointer:
        # The running persist completes or is dropped whole, never half;
        # the training error is the one to report.
        with contextlib.suppress(Exception):
          checkpointer.close()
      raise
    finally:
      if ctx.background is not None:
        ctx.background.stop()
    if checkpointer:
      checkpointer.finish(ctx.last_step)
    # Before evaluation, whose forward passes would count copies too.
    offload_stats = (offloader.summary(num_steps=len(ledger.steps))
                     if offloader else None)
    pipeline_section = (built.pipeline.describe(
        config.pipeline, skip_steps=ledger.summary()["warmup_steps"])
        if built.pipeline else None)
    if pipeline_section is not None:
      # Where predictions and measurements part, the conditions may say why.
      pipeline_section["profile_conditions"] = conditions.describe(
          split_lib.load_profile(config.pipeline.profile),
          pipeline.stage_conditions(config))
    if config.run.evaluate and info.num_eval_examples:
      final.update(_evaluate(strategy, config, spec, model))
  finally:
    if service is not None:
      service.stop()

  notes = []
  if config.run.loop == "fit":
    notes.append("model.fit pulls its input inside the compiled step: "
                 "data wait is part of compute")
  elif config.run.steps_per_execution > 1:
    notes.append(f"{config.run.steps_per_execution} steps per traced call, "
                 "the input read inside it: each call is timed as one span "
                 "and each step recorded as the span divided by the steps; "
                 + ("data wait is timed in the graph and divided likewise"
                    if not config.run.deterministic else
                    "data wait is part of compute (op determinism refuses "
                    "tf.timestamp)"))
  if restored_step:
    notes.append(f"resumed from the checkpoint of step {restored_step}")
    if config.data.data_service:
      notes.append("the tf.data service hands batches to consumers in "
                   "arrival order: the resumed data order is not exact")
  input_inside = config.run.loop == "fit" or (
      config.run.steps_per_execution > 1 and config.run.deterministic)
  phases_measured = ([ledger_lib.COMPUTE, ledger_lib.CHECKPOINT_STALL]
                     if input_inside else list(ledger_lib.PHASES))
  if offloader is not None and offloader.timed:
    phases_measured.insert(phases_measured.index(ledger_lib.COMPUTE) + 1,
                           ledger_lib.OFFLOAD_COPY)
  elif offloader is not None:
    notes.append("offload copies are counted, not timed: op determinism "
                 "refuses tf.timestamp, so they are part of compute")
  if built.pipeline:
    # The compute span is split into stage compute, transfer and bubble.
    phases_measured = [ledger_lib.DATA_WAIT, ledger_lib.CHECKPOINT_STALL]
    notes.append("pipelined: each step's compute span is split into "
                 "stage_compute and transfer (stages and copies timed alone "
                 "before training) and bubble (the rest); see "
                 "pipeline.sources")
  return outputs.write_worker_outputs(
      config, out_dir, ledger, framework=FRAMEWORK,
      worker_index=worker_index, num_workers=num_workers,
      environment=describe_environment(strategy),
      strategy=_describe_strategy(strategy, config, built, plan, ledger),
      num_params=models.num_params(model),
      weights_digest=weights_digest(model), final=final,
      phases_measured=phases_measured,
      checkpoint_stats=checkpointer.stats() if checkpointer else None,
      notes=notes, wall_s=time.perf_counter() - start,
      offload_stats=offload_stats, pipeline=pipeline_section,
      background_stats=ctx.background.stats() if ctx.background else None)
