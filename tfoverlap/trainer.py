"""One TensorFlow training run from a TrainConfig: build, train, record.

The order matters: the host is configured before TensorFlow touches a
device, the strategy exists before any variable, and the model and optimizer
are built inside its scope so their variables are replicated.
"""

import dataclasses
import functools
import os
import sys
from typing import Optional

import keras
import tensorflow as tf

from overlap_core.planning import burst_report, command
from overlap_core.planning import split as split_lib
from overlap_core.runtime import background, cluster, compat, contention
from overlap_core.runtime import pipeline_stats
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import paired_removal, run_record, skeleton
from overlap_core.runtime.config import ConfigError, TrainConfig
from overlap_core.runtime.loop_context import LoopContext
from tfoverlap import (burst, checkpoint, data, distribute, exposed_comm,
                       loops, models, parallelize, pipeline,
                       pipeline_processes, reference_step, steps,
                       user_model)

FRAMEWORK = "tensorflow"


def check_supported(config: TrainConfig, *, num_gpus: int = None) -> None:
  """Refuses, in one line, what TensorFlow cannot honour; the launcher calls
  it too, before any worker starts. `num_gpus` (default: the GPUs TensorFlow
  sees) and the order of the checks are `compat.check_supported`'s.
  """
  if num_gpus is None:
    num_gpus = len(tf.config.list_physical_devices("GPU"))
  compat.check_supported(config, FRAMEWORK, num_gpus=num_gpus, side_checks=(
      functools.partial(pipeline.check_pipeline_supported, num_gpus=num_gpus),
      loops.check_steps_per_execution))


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


def _read_resident_batches(strategy, config: TrainConfig, spec, **which):
  """Training batches on each replica's device, read without the training
  pipeline (`data.make_resident_iterator`; `which`: its start_batch,
  count and max_bytes)."""
  return data.make_resident_iterator(
      strategy, config.data, task=spec.task, seed=config.run.seed,
      upscale=spec.upscale, **which)


def _resident_first_batch(strategy, config: TrainConfig, spec):
  """The run's first batch on each replica's device, read without the
  training pipeline, for the steps timed before it exists
  (`reference_step`, `exposed_comm`): a tf.data iterator fills its
  buffers beside whatever runs once it is made."""
  return next(_read_resident_batches(strategy, config, spec))


def _burst_spec(config: TrainConfig, plan):
  """What parallelize needs to run the plan, or None without one."""
  if plan is None:
    return None
  return parallelize.BurstSpec(
      plan, config.burst.plan_path,
      distribute.mirrored_devices(config.distribute.num_devices))


def _load_user_model(strategy, config: TrainConfig, info):
  """The user's --model, built and checked on the data's first batch."""
  return user_model.load_model(
      config, info, strategy=strategy,
      first_batch=user_model.make_first_batch(config, info))


def _build_model_and_optimizer(strategy, config: TrainConfig, num_classes,
                               channels, plan=None, prebuilt=None
                               ) -> parallelize.Parallelized:
  steps.apply_precision_policy(config.model.precision)
  return parallelize.parallelize(
      strategy,
      # The user's model was built under this strategy already.
      build_model=(lambda: prebuilt) if prebuilt is not None else (
          lambda: models.build_model(
              config.model.name, image_size=config.data.image_size,
              num_classes=num_classes, channels=channels)),
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
  devices = (pipeline_processes.stage_devices(cfg.stages)
             if cfg.runtime == pipeline_processes.RUNTIME
             else distribute.mirrored_devices(cfg.stages))
  # One pipeline takes the whole batch (no data parallelism with stages).
  return parallelize.PipelineSpec(
      cfg, microbatch_size=command.plan_microbatch_size(config),
      devices=devices, profile=profile)


def _build_strategy(config: TrainConfig) -> tf.distribute.Strategy:
  """The run's strategy. A pipelined run places its stages itself, and a
  burst plan splits each layer over the devices itself, both on the
  devices a mirrored run would replicate over, under no strategy."""
  if config.pipeline.stages > 1 or config.burst.enabled:
    return tf.distribute.get_strategy()
  return distribute.build_strategy(config.distribute)


def _derives_exposed_comm(strategy, config: TrainConfig,
                          built: parallelize.Parallelized) -> bool:
  """Whether the run's exposed all-reduce is derived (`tfoverlap.
  exposed_comm`): replicas that all-reduce, in the custom loop (model.fit
  times its input inside compute, so nothing there is carved), and no
  timed offload, which carves the same compute span its own way."""
  return (strategy.num_replicas_in_sync > 1 and config.run.loop != "fit"
          and not built.pipeline and not built.burst
          and not (built.offload and built.offload.timed))


def _run_loop(ctx: LoopContext, strategy, config: TrainConfig, spec,
              built: parallelize.Parallelized,
              comm: Optional[exposed_comm.CommDerivation] = None,
              keep_reference=None, resident_batch=None) -> float:
  """Runs the configured loop over the remaining steps; the last loss.

  `comm` is the derived exposed all-reduce to carve out of each step's
  compute, or None. `keep_reference` is given the step timed alone
  before training, where the run times one (`reference_step`), on
  `resident_batch()` (`_resident_first_batch`)."""
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
    return _run_pipelined_loop(
        ctx, config, spec, built, train_input,
        keep_reference=(keep_reference if _times_reference(config, built)
                        else None),
        resident_batch=resident_batch)
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
                             else None),
        exposed_comm_s=comm.exposed_comm_s if comm else None)
  if built.burst:
    train_step = burst.record_first_step_placements(
        steps.make_burst_train_step(
            built.burst, model, optimizer, task=spec.task,
            global_batch_size=config.data.batch_size),
        model, built.burst_placements)
  else:
    make_train_step = functools.partial(
        steps.make_train_step, model, optimizer, strategy, task=spec.task,
        global_batch_size=config.data.batch_size)
    train_step = make_train_step()
  split_compute = None
  if timed_offload:
    split_compute = timed_offload.split_compute
  elif comm:
    split_compute = comm.split_compute
  reference = None
  if _times_reference(config, built) and keep_reference is not None:
    calibrate = functools.partial(
        reference_step.calibrate, train_step, resident_batch(), model=model,
        optimizer=optimizer, num_steps=config.run.reference_steps,
        offloader=built.offload, make_train_step=make_train_step)
    reference = calibrate()
    keep_reference(reference)
    if built.offload:
      # The derived cost replaces the copies' split.
      split_compute = comm.split_compute if comm else None
    split_compute = paired_removal.split_per_arm(
        ctx.pairing,
        functools.partial(reference.split_compute, inner=split_compute),
        first_step=ctx.first_step,
        make_split_without=_split_without_all_reduce(ctx.pairing, reference,
                                                     comm))
    split_compute = contention.retime_after_loop(split_compute, reference,
                                                 calibrate, keep_reference)
  train_step, split_compute = paired_removal.apply_offload_removal(
      ctx.pairing, train_step, split_compute, cost=reference,
      # Called only where offload is removed, a run with no burst plan.
      make_step_without=lambda: reference_step.make_step_without_offload(
          make_train_step, built.offload),
      inner_split=comm.split_compute if comm else None,
      first_step=ctx.first_step)
  train_step = paired_removal.apply_step_removal(
      ctx.pairing, paired_removal.ALL_REDUCE, train_step,
      lambda: steps.make_local_train_step(
          model, optimizer, strategy, task=spec.task,
          global_batch_size=config.data.batch_size),
      first_step=ctx.first_step)
  return loops.run_custom_loop(
      ctx, train_step=train_step,
      iterator=paired_removal.apply_input_removal(
          iter(train_input), ctx.pairing,
          functools.partial(_read_resident_batches, strategy, config, spec),
          first_step=ctx.first_step, last_step=ctx.last_step),
      split_compute=split_compute)


def _split_without_all_reduce(pairing, reference, comm):
  """() -> the split of a step without the all-reduce, where `pairing`
  removes it (the compatibility table asks for a derived `comm` there):
  nothing carved as exposed_comm, and contention beyond the step alone
  less the derived exposed all-reduce, which is what the ledger claims
  such a step costs. None elsewhere."""
  if not paired_removal.removes(pairing, paired_removal.ALL_REDUCE):
    return None
  return reference.less(comm.exposed_comm_s).split_compute


def _times_reference(config: TrainConfig,
                     built: parallelize.Parallelized) -> bool:
  """Whether the run times its step alone first, for the contention
  phase (`contention.times_reference`), and only in the custom loop's one
  step per call, whose span is the step's own: not K steps per call,
  which read their input inside the call. Not a multi-worker job: there,
  a collective that timed out after the calibration made TensorFlow 2.21
  abort the process in its own code (abseil's "Mutex corrupt") in 2 of 5
  runs on a loaded host, against none of 4 without it, which costs the
  job its failure record and its one-line cause."""
  return (contention.times_reference(
      config.run.reference_steps,
      pipelined=bool(built.pipeline and not built.pipeline.can_run_alone),
      burst=bool(built.burst), fixed_offload=False)
          and config.run.loop == "ctl"
          and config.run.steps_per_execution == 1
          and config.distribute.strategy != "multi_worker")


def _run_pipelined_loop(ctx: LoopContext, config: TrainConfig, spec,
                        built: parallelize.Parallelized, train_input, *,
                        keep_reference=None, resident_batch=None) -> float:
  """The custom loop over GPipe steps, each step's compute span split into
  stage compute, transfer and bubble: from stages timed alone first
  (devices), or as each stage's process stamped them (processes).

  Where the stages can run alone (processes), `keep_reference`, if given,
  is given each stage's work timed alone on `resident_batch()` before the
  training iterator exists (`reference_step.calibrate`), and the compute
  beyond it is carved out as contention, as PyTorch's pipeline does."""
  runtime, optimizer = built.pipeline, built.optimizer
  loss_fn = steps.make_pipeline_loss(spec.task, config.data.batch_size)
  inputs, targets = steps.example_batch(runtime.model, spec.task,
                                        config.data.batch_size)
  runtime.measure_stages(inputs, targets, loss_fn, optimizer=optimizer)
  train_step = runtime.make_train_step(optimizer, loss_fn)
  split_compute = runtime.record_step
  if keep_reference is not None:
    reference = reference_step.calibrate(
        train_step, resident_batch(), model=runtime.model,
        optimizer=optimizer, num_steps=config.run.reference_steps,
        pipeline=runtime)
    keep_reference(reference)
    split_compute = paired_removal.split_per_arm(
        ctx.pairing,
        functools.partial(reference.split_stage_compute, split_compute,
                          pipeline_stats.STAGE_COMPUTE),
        first_step=ctx.first_step)
  removes_waits = paired_removal.removes(ctx.pairing,
                                         paired_removal.PIPELINE_WAITS)
  train_step = paired_removal.apply_step_removal(
      ctx.pairing, paired_removal.PIPELINE_WAITS, train_step,
      lambda: runtime.make_train_step(optimizer, loss_fn, apart=True),
      first_step=ctx.first_step)
  if runtime.can_run_alone and not removes_waits:
    # Timed or not, no step runs alone or apart from here on.
    runtime.release_stand_ins()
  return loops.run_custom_loop(
      ctx, train_step=train_step, iterator=iter(train_input),
      split_compute=split_compute)


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


class _TensorFlowSide:
  """The TensorFlow hooks of `overlap_core.runtime.skeleton.run`."""

  framework = FRAMEWORK

  def __init__(self):
    self._strategy = None
    self._service = None
    self._comm = None  # the derived exposed all-reduce, once derived
    self._reference = None  # the step timed alone, once timed
    self._user_model = None  # --model's, once load_user_model built it

  def check_supported(self, config: TrainConfig) -> None:
    check_supported(config)

  def join(self, config: TrainConfig) -> skeleton.World:
    worker_index, num_workers = (distribute.cluster_from_env()
                                 if config.distribute.strategy ==
                                 "multi_worker" else (0, 1))
    return skeleton.World(worker_index=worker_index, num_workers=num_workers,
                          is_chief=worker_index == 0)

  def leave(self) -> None:
    pass  # the strategy lives as long as the process

  def configure_host(self, config: TrainConfig) -> TrainConfig:
    if _process_pipeline(config):
      # The stages are the servers' tasks: no logical devices to split.
      pipeline_processes.connect_client(
          _pipeline_cluster(config),
          intra_op_threads=config.run.intra_op_threads,
          inter_op_threads=config.run.inter_op_threads)
    else:
      distribute.configure_host(config.distribute, config.run)
    keras.utils.set_random_seed(config.run.seed)
    if config.run.deterministic:
      tf.config.experimental.enable_op_determinism()
    self._strategy = _build_strategy(config)
    if config.data.data_service != "local":
      return config
    self._service = data.start_data_service()
    return dataclasses.replace(config, data=dataclasses.replace(
        config.data, data_service=self._service.address))

  def stop_services(self) -> None:
    if self._service is not None:
      self._service.stop()

  def describe_data(self, config: TrainConfig):
    return data.describe(config.data)

  def load_user_model(self, config: TrainConfig, info):
    self._user_model, spec = _load_user_model(self._strategy, config, info)
    return spec

  def parallelize(self, config: TrainConfig, spec, info, plan):
    del spec  # the model zoo's builder knows its own
    return _build_model_and_optimizer(
        self._strategy, config, info.num_classes, info.channels, plan,
        prebuilt=self._user_model)

  def make_checkpointer(self, config: TrainConfig, built, world,
                        describe_state):
    return checkpoint.build_checkpointer(
        config.checkpoint, config.run.model_dir, model=built.model,
        optimizer=built.optimizer, is_chief=world.is_chief,
        worker_index=world.worker_index, describe_state=describe_state,
        agree=distribute.make_agree(self._strategy))

  def make_scalar_writer(self, logdir, every_steps, ledger):
    return loops.make_scalar_writer(logdir, every_steps, ledger)

  def make_background(self, config: TrainConfig, out_dir: str, *,
                      first_step: int, last_step: int):
    return background.make_runner(
        config.burst.background_job, out_dir, first_step=first_step,
        last_step=last_step, global_batch_size=config.data.batch_size)

  def run_loop(self, ctx: LoopContext, config: TrainConfig, spec,
               built) -> float:
    # Read once, for whichever of the timings before training run.
    resident_batch = functools.cache(functools.partial(
        _resident_first_batch, self._strategy, config, spec))
    if (ctx.first_step <= ctx.last_step and
        _derives_exposed_comm(self._strategy, config, built)):
      self._comm = exposed_comm.derive_exposed_comm(
          built.model, built.optimizer, self._strategy, resident_batch(),
          task=spec.task, global_batch_size=config.data.batch_size)
    return _run_loop(ctx, self._strategy, config, spec, built, self._comm,
                     keep_reference=self._keep_reference,
                     resident_batch=resident_batch)

  def _keep_reference(self, reference) -> None:
    self._reference = reference

  def after_training(self, config: TrainConfig, built, ledger):
    if not built.pipeline:
      return None
    return built.pipeline.describe(
        config.pipeline, skip_steps=ledger.summary()["warmup_steps"])

  def stage_conditions(self, config: TrainConfig) -> dict:
    return pipeline.stage_conditions(config)

  def evaluate(self, config: TrainConfig, spec, model) -> dict:
    return _evaluate(self._strategy, config, spec, model)

  def cpu_of_processes(self, config: TrainConfig, ledger):
    return None  # one process runs all of a worker's replicas

  def notes(self, config: TrainConfig, built, restored_step: int) -> list:
    return _notes(config, built, restored_step)

  def phases_measured(self, config: TrainConfig, built) -> list:
    derived = self.phases_derived(config, built)
    return [p for p in _phases_measured(config, built) if p not in derived]

  def phases_derived(self, config: TrainConfig, built) -> list:
    return (([ledger_lib.EXPOSED_COMM] if self._comm else []) +
            (self._reference.phases_derived if self._reference else []))

  def describe_environment(self) -> dict:
    return describe_environment(self._strategy)

  def describe_strategy(self, config: TrainConfig, built, plan,
                        ledger) -> dict:
    described = _describe_strategy(self._strategy, config, built, plan,
                                   ledger)
    if self._comm:
      described[ledger_lib.EXPOSED_COMM] = self._comm.to_dict()
    if self._reference:
      described["reference_step"] = self._reference.to_dict()
    return described

  def num_params(self, model) -> int:
    return models.num_params(model)

  def weights_digest(self, model) -> str:
    return weights_digest(model)


def _input_inside_step(config: TrainConfig) -> bool:
  """Whether the step reads its input inside the traced call, untimed."""
  return config.run.loop == "fit" or (
      config.run.steps_per_execution > 1 and config.run.deterministic)


def _notes(config: TrainConfig, built, restored_step: int) -> list:
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
  if restored_step and config.data.data_service:
    notes.append("the tf.data service hands batches to consumers in "
                 "arrival order: the resumed data order is not exact")
  if built.offload is not None and not built.offload.timed:
    notes.append("offload copies are counted, not timed: op determinism "
                 "refuses tf.timestamp, so they are part of compute")
  if built.pipeline and built.pipeline.can_run_alone:
    notes.append("pipelined over stage servers: each step's compute span "
                 "is split into stage_compute (each stage's busy time, "
                 "stamped on its own process) and bubble (the rest), the "
                 "mean stage's; where each stage was timed alone before "
                 "training (strategy.reference_step), its stage_compute "
                 "beyond that is contention; see pipeline.sources")
  elif built.pipeline:
    notes.append("pipelined: each step's compute span is split into "
                 "stage_compute and transfer (stages and copies timed alone "
                 "before training) and bubble (the rest); see "
                 "pipeline.sources")
  return notes


def _phases_measured(config: TrainConfig, built) -> list:
  """The ledger phases this run times."""
  if built.pipeline:
    # The compute span is split into stage compute, transfer and bubble.
    return [ledger_lib.DATA_WAIT, ledger_lib.CHECKPOINT_STALL]
  phases = ([ledger_lib.COMPUTE, ledger_lib.CHECKPOINT_STALL]
            if _input_inside_step(config) else list(ledger_lib.PHASES))
  if built.offload is not None and built.offload.timed:
    phases.insert(phases.index(ledger_lib.COMPUTE) + 1,
                  ledger_lib.OFFLOAD)
  return phases


def _process_pipeline(config: TrainConfig) -> bool:
  return (config.pipeline.stages > 1 and
          config.pipeline.runtime == pipeline_processes.RUNTIME)


def _pipeline_cluster(config: TrainConfig):
  """This process's place in a process-pipelined job (checked)."""
  return pipeline_processes.check_cluster(
      cluster.pipeline_cluster_from_env(os.environ), config.pipeline.stages)


def train(config: TrainConfig) -> Optional[dict]:
  """Runs training as configured; returns the run record it wrote, or
  None in a stage server of --pipeline_runtime=processes, which serves its
  stage until the client is gone and records nothing.

  Raises:
    ConfigError: for a setting this framework or host cannot honour.
  """
  if _process_pipeline(config):
    found = _pipeline_cluster(config)
    if found.role == cluster.PIPELINE_STAGE:
      check_supported(config)
      pipeline_processes.serve_stage(
          found, intra_op_threads=config.run.intra_op_threads,
          inter_op_threads=config.run.inter_op_threads)
      return None
  return skeleton.run(_TensorFlowSide(), config)
