"""One PyTorch training run from a TrainConfig: build, train, record.

The same run as `tfoverlap.trainer.train`, in PyTorch: the same flags, the
same ledger phases, the same run.json schema, trace, progress lines and
final table. The order matters: thread pools are fixed before any torch
work, the process joins its world before the model exists (DDP broadcasts
rank 0's weights when it wraps the model), and the optimizer is built on
the device-resident parameters.
"""

import functools
import os
import sys

import torch

from overlap_core.planning import burst_report, command
from overlap_core.planning import split as split_lib
from overlap_core.runtime import background, compat, contention, pipeline_stats
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import datasets, paired_removal, replica_phases
from overlap_core.runtime import run_record, skeleton
from overlap_core.runtime import user_code
from overlap_core.runtime.config import TrainConfig
from torch_parity import (background_cuda, checkpoint, data, distribute,
                          loops, models, parallelize, pipeline,
                          pipeline_timing, reference_step, steps,
                          user_model)

FRAMEWORK = "pytorch"


def check_supported(config: TrainConfig, *, num_gpus: int = None) -> None:
  """Refuses, in one line, what PyTorch cannot honour; the launcher calls
  it too, before any process starts. `num_gpus` (default: the GPUs PyTorch
  sees) and the order of the checks are `compat.check_supported`'s.
  """
  if num_gpus is None:
    num_gpus = torch.cuda.device_count()
  compat.check_supported(config, FRAMEWORK, num_gpus=num_gpus, side_checks=(
      functools.partial(pipeline.check_pipeline_supported, num_gpus=num_gpus),
      lambda c: distribute.check_strategy(c.distribute, num_gpus=num_gpus)))


def describe_environment(strategy: distribute.Strategy) -> dict:
  environment = run_record.describe_host()
  gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
  environment.update({
      "torch": torch.__version__,
      "devices": ["cpu"] + gpus,
      "gpus": [f"{name} ({torch.cuda.get_device_name(i)})"
               for i, name in enumerate(gpus)],
      "num_replicas": strategy.world_size,
  })
  return environment


def weights_digest(model: torch.nn.Module) -> str:
  """The digest of every weight and buffer (TensorFlow's `model.weights`
  holds BatchNorm's moving statistics too)."""
  return run_record.digest_weights(
      (name, tensor.detach().cpu().numpy())
      for name, tensor in model.state_dict().items())


def _seed(config: TrainConfig, device: torch.device) -> None:
  torch.manual_seed(config.run.seed)
  if config.run.deterministic:
    if device.type == "cuda":
      # cuBLAS is deterministic only with a fixed workspace; it must be set
      # before the first cuBLAS call.
      os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
      torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


def _data_shard(config: TrainConfig, strategy) -> dict:
  """Which share of the data this process reads: `make_loader`'s rank and
  world_size."""
  if config.burst.enabled:
    # Every rank reads the whole global batch: which rows a rank needs
    # changes from layer to layer (and ranks beyond the first layer's width
    # need none of its inputs but some of the last layer's targets), and
    # one shared order of samples is what makes a burst run train exactly
    # like one process on the same data. Reading a batch is cheap next to
    # an exchange of its rows.
    return {"rank": 0, "world_size": 1}
  # A batch per data-parallel replica: every stage of one replica reads
  # the same batch (the first uses its inputs, the last its targets).
  dims = strategy.dims
  return {"rank": dims.coordinates(strategy.rank).data_parallel,
          "world_size": dims.data_parallel}


def _read_resident_batches(config: TrainConfig, spec, strategy, **which):
  """This process's training batches on its device, read without the
  training loader (`data.make_resident_iterator`; `which`: its
  start_batch, count and max_bytes)."""
  # Iterating a loader draws a seed from torch's generator; forked, the
  # training loader and the dropout stream draw as they would have.
  with torch.random.fork_rng(devices=[]):
    return data.make_resident_iterator(
        config.data, task=spec.task, seed=config.run.seed,
        upscale=spec.upscale, device=strategy.device,
        **_data_shard(config, strategy), **which)


def _resident_first_batch(config: TrainConfig, spec, strategy):
  """This process's first training batch on its device, read before the
  training loader exists (`reference_step`)."""
  return next(_read_resident_batches(config, spec, strategy))


def _build_train_batches(config: TrainConfig, spec, strategy, first_step):
  """This process's training batches: resident, or the loader (staged on
  the device ahead of the step with --prefetch_to_device)."""
  shard = _data_shard(config, strategy)
  if config.data.synthetic_on_device:
    return data.make_resident_iterator(
        config.data, task=spec.task, seed=config.run.seed,
        upscale=spec.upscale, device=strategy.device, **shard)
  batches = data.make_loader(config.data, split="train", task=spec.task,
                             seed=config.run.seed, upscale=spec.upscale,
                             skip_batches=first_step - 1, **shard)
  if config.data.prefetch_to_device:
    return data.make_device_prefetcher(
        batches, strategy.device,
        datasets.device_buffer_size(config.data.prefetch))
  return iter(batches)


def _evaluate(config: TrainConfig, spec, strategy, model) -> dict:
  batches = data.make_loader(config.data, split="eval", task=spec.task,
                             seed=config.run.seed, upscale=spec.upscale,
                             rank=strategy.rank,
                             world_size=strategy.world_size)
  return steps.evaluate(model, batches, strategy, task=spec.task,
                        precision=config.model.precision)


def _image_shape(config: TrainConfig, spec, info) -> tuple:
  """One example's inputs from the zoo's data: [C, S/u, S/u]."""
  side = config.data.image_size // spec.upscale
  return (info.channels, side, side)


def _pipeline_spec(config: TrainConfig, spec, example_shape):
  """How parallelize cuts the model, or None when it is not pipelined."""
  cfg = config.pipeline
  if cfg.stages == 1:
    return None
  # Kinder than a refusal: another framework's costs still rank a split,
  # but the user should know whose costs they are (once, from rank 0).
  warning = pipeline.check_profile(config)
  if warning and int(os.environ.get("RANK", "0")) == 0:
    print(warning, file=sys.stderr, flush=True)
  microbatch = command.plan_microbatch_size(config)
  return parallelize.PipelineSpec(
      cfg, torch.randn(microbatch, *example_shape),
      steps.make_pipeline_loss(spec.task), split_lib.load_profile(cfg.profile))


def _burst_spec(config: TrainConfig, example_shape, plan):
  """What parallelize needs to run the plan, or None without one."""
  if plan is None:
    return None
  # Zeros: only shapes are traced, and drawing random numbers here would
  # move the seeded stream the model's initial weights come from.
  return parallelize.BurstSpec(plan, config.burst.plan_path,
                               torch.zeros(2, *example_shape))


def _make_train_step(config: TrainConfig, spec, strategy, parallel):
  if parallel.burst:
    return steps.make_burst_train_step(
        parallel.burst, parallel.optimizer, strategy, task=spec.task,
        global_batch_size=config.data.batch_size)
  if parallel.pipeline:
    return steps.make_pipeline_train_step(parallel.pipeline,
                                          parallel.optimizer, strategy)
  return steps.make_train_step(parallel.train_model, parallel.optimizer,
                               strategy, task=spec.task,
                               precision=config.model.precision)


def _make_background(config: TrainConfig, strategy, out_dir: str, *,
                     first_step: int, last_step: int):
  """--background_job's runner, on rank 0 only (one job per run), or None.

  On a CUDA device the job shares the GPU as DeepPool's does: a thread of
  this process replaying its step on the lowest-priority stream, the
  foreground on the highest (`background_cuda`). On the CPU it is a
  separate process in the idle scheduling class.
  """
  if not config.burst.background or strategy.rank != 0:
    return None
  split = dict(first_step=first_step, last_step=last_step,
               global_batch_size=config.data.batch_size)
  if strategy.device.type == "cuda":
    return background_cuda.make_runner(config.burst.background_job,
                                       strategy.device, **split)
  return background.make_runner(config.burst.background_job, out_dir,
                                **split)


def _foreground_stream(runner):
  """The stream the steps run on beside the CUDA job; None otherwise."""
  if isinstance(runner, background_cuda.CudaBackgroundRunner):
    return runner.foreground_stream
  return None


def _gradients_apart(config: TrainConfig):
  """step -> whether that step all-reduced no gradient, where some did
  (--all_reduce=off: every one; --paired_removal=all_reduce: its blocks
  without); None where every step all-reduced its gradients."""
  if config.distribute.all_reduce == distribute.ALL_REDUCE_OFF:
    return lambda step: True
  pairing = paired_removal.from_config(config.run.paired_removal,
                                       config.run.paired_block_steps)
  if paired_removal.removes(pairing, paired_removal.ALL_REDUCE):
    return pairing.removed
  return None


def _times_all_reduce(strategy, parallel) -> bool:
  """Whether the strategy times the all-reduce of this run's steps (DDP
  or Horovod around the whole model; a pipeline or burst plan reduces in
  its own runtime)."""
  return (strategy.comm_timer is not None and not parallel.pipeline
          and not parallel.burst)


def _phases_measured(parallel, strategy, *, offload_derived: bool) -> list:
  """The ledger phases this run records: a pipelined step's compute is its
  stage_compute, bubble and transfer instead; an offloading step's is
  offload and the rest of compute; a data-parallel step's exposed
  all-reduce is apart from compute, beside a derived offload but not
  beside the copies' split (`_split_compute`)."""
  if parallel.pipeline:
    return [ledger_lib.DATA_WAIT, *parallel.pipeline.recorder.phases,
            ledger_lib.CHECKPOINT_STALL]
  phases = [ledger_lib.DATA_WAIT, ledger_lib.COMPUTE]
  if parallel.offload:
    phases.append(ledger_lib.OFFLOAD)
  if _times_all_reduce(strategy, parallel) and (
      offload_derived or not parallel.offload):
    phases.append(ledger_lib.EXPOSED_COMM)
  return phases + [ledger_lib.CHECKPOINT_STALL]


def _split_compute(parallel, strategy, *, offload_derived: bool = False):
  """How the loop records a step's compute span: as the pipeline phases,
  as offload copies and compute, as exposed all-reduce and compute, or
  (None) as one compute phase. Offload and pipeline stages are never
  combined, nor offload and several replicas (`check_supported`); with a
  derived offload, which the reference step carves (`offload_cost`),
  what is left is the all-reduce's split."""
  if parallel.pipeline:
    return parallel.pipeline.recorder.end_step
  if parallel.offload and not offload_derived:
    return parallel.offload.split_compute
  if _times_all_reduce(strategy, parallel):
    return strategy.split_compute
  return None


def _describe_strategy(strategy, parallel, config, plan, ledger,
                       replica_digests=None) -> dict:
  described = strategy.describe()
  if replica_digests is not None:
    described["replica_weights_digests"] = replica_digests
  if parallel.pipeline:
    described["pipeline"] = parallel.pipeline.describe()
  if parallel.burst:
    described["class"] = "torch_parity.burst.BurstModel"
    described["burst"] = burst_report.plan_against_run(
        plan, config.burst.plan_path, ledger.summary())
  return described


class _TorchSide:
  """The PyTorch hooks of `overlap_core.runtime.skeleton.run`."""

  framework = FRAMEWORK

  def __init__(self):
    self._strategy = None
    self._user_model = None  # --model's, once load_user_model built it
    # Every replica's weights digest, in rank order, under --all_reduce=off.
    self._replica_digests = None
    self._example_shape = None  # one example's inputs, of the user's data
    self._reference = None  # the step timed alone, once timed
    # What taking data wait and contention over the replicas moved in
    # this one's ledger (`replica_phases`).
    self._moved_over_replicas = None

  def check_supported(self, config: TrainConfig) -> None:
    check_supported(config)

  def join(self, config: TrainConfig) -> skeleton.World:
    distribute.configure_host(config.run)
    strategy = self._strategy = distribute.build_strategy(config.distribute)
    if config.pipeline.stages > 1:
      distribute.apply_pipeline_dims(strategy, config.pipeline.stages)
    return skeleton.World(worker_index=strategy.worker_index,
                          num_workers=strategy.num_workers,
                          is_chief=strategy.rank == 0,
                          writes_outputs=strategy.writes_outputs)

  def leave(self) -> None:
    self._strategy.close()

  def configure_host(self, config: TrainConfig) -> TrainConfig:
    _seed(config, self._strategy.device)
    return config

  def stop_services(self) -> None:
    pass  # the loader's workers end with their loader

  def describe_data(self, config: TrainConfig):
    return data.describe(config.data)

  def load_user_model(self, config: TrainConfig, info):
    first_batch = user_model.make_first_batch(config, info)

    def first_batch_and_shape(spec):
      inputs, targets = first_batch(spec)
      if user_code.is_import_path(config.data.dataset):
        self._example_shape = tuple(inputs.shape[1:])
      return inputs, targets

    self._user_model, spec = user_model.load_model(
        config, info, first_batch=first_batch_and_shape)
    return spec

  def parallelize(self, config: TrainConfig, spec, info, plan):
    prebuilt = self._user_model
    example_shape = self._example_shape or _image_shape(config, spec, info)
    return parallelize.parallelize(
        self._strategy,
        build_model=(lambda: prebuilt) if prebuilt is not None else (
            lambda: models.build_model(
                config.model.name, image_size=config.data.image_size,
                num_classes=info.num_classes, channels=info.channels)),
        build_optimizer=lambda module: steps.build_optimizer(
            config.model, module.parameters()),
        offload=config.offload,
        pipeline=_pipeline_spec(config, spec, example_shape),
        burst=_burst_spec(config, example_shape, plan))

  def make_checkpointer(self, config: TrainConfig, built, world,
                        describe_state):
    # A burst run's checkpoint is rank 0's: it runs every layer, so its
    # model and optimizer state are the whole run's.
    # After parallelize: Horovod's DistributedOptimizer is a new optimizer
    # with state of its own, the one to save and restore. Every rank
    # restores rank 0's checkpoint, so all resume from the same state.
    return checkpoint.build_checkpointer(
        config.checkpoint, config.run.model_dir, model=built.model,
        optimizer=built.optimizer, is_chief=world.is_chief,
        describe_state=describe_state,
        agree=distribute.make_agree(self._strategy))

  def make_scalar_writer(self, logdir, every_steps, ledger):
    return loops.make_scalar_writer(logdir, every_steps, ledger)

  def make_background(self, config: TrainConfig, out_dir: str, *,
                      first_step: int, last_step: int):
    return _make_background(config, self._strategy, out_dir,
                            first_step=first_step, last_step=last_step)

  def run_loop(self, ctx, config: TrainConfig, spec, built) -> float:
    return _run_loop(ctx, config, spec, self._strategy, built,
                     keep_reference=self._keep_reference)

  def _keep_reference(self, reference) -> None:
    self._reference = reference

  def after_training(self, config: TrainConfig, built, ledger):
    if built.pipeline:
      pipeline.average_stage_buffers(built.pipeline)
      return pipeline_timing.gather_pipeline_section(
          built.pipeline, config.pipeline, self._strategy.device,
          warmup_steps=ledger_lib.default_warmup_steps(len(ledger.steps)))
    if built.burst:
      built.burst.share_first_rank_state(built.model)
    else:
      if self._strategy.world_size > 1 and _times_all_reduce(
          self._strategy, built):
        self._moved_over_replicas = replica_phases.count_over_replicas(
            ledger, self._strategy.max_over_processes,
            gradients_apart=_gradients_apart(config))
      self._strategy.average_buffers(built.model)
      if _gradients_apart(config) is not None:
        # Replicas that trained apart: run.json shows how far (equal
        # digests would mean the all-reduce was not off after all).
        self._replica_digests = self._strategy.gather_over_processes(
            weights_digest(built.model))
    return None

  def stage_conditions(self, config: TrainConfig) -> dict:
    return pipeline.stage_conditions(config)

  def evaluate(self, config: TrainConfig, spec, model) -> dict:
    return _evaluate(config, spec, self._strategy, model)

  def cpu_of_processes(self, config: TrainConfig, ledger):
    return _mirrored_cpu_work(self._strategy, config, ledger)

  def notes(self, config: TrainConfig, built, restored_step: int) -> list:
    del restored_step  # the skeleton's note says it all
    return [self._strategy.describe_backend() if not built.burst else
            f"burst plan {config.burst.plan_path} over "
            f"{self._strategy.backend}"]

  def phases_measured(self, config: TrainConfig, built) -> list:
    derived = self.phases_derived(config, built)
    return [p for p in _phases_measured(
        built, self._strategy, offload_derived=ledger_lib.OFFLOAD in derived)
            if p not in derived]

  def phases_derived(self, config: TrainConfig, built) -> list:
    # DDP's and Horovod's all-reduce waits are timed each step.
    return self._reference.phases_derived if self._reference else []

  def describe_environment(self) -> dict:
    return describe_environment(self._strategy)

  def describe_strategy(self, config: TrainConfig, built, plan,
                        ledger) -> dict:
    described = _describe_strategy(self._strategy, built, config, plan,
                                   ledger, self._replica_digests)
    if self._reference:
      described["reference_step"] = self._reference.to_dict()
    if self._moved_over_replicas is not None:
      described[replica_phases.OVER_REPLICAS_KEY] = (
          self._moved_over_replicas)
    return described

  def num_params(self, model) -> int:
    return models.num_params(model)

  def weights_digest(self, model) -> str:
    return weights_digest(model)


def _run_loop(ctx, config: TrainConfig, spec, strategy, parallel,
              keep_reference=None) -> float:
  """Runs the custom loop over the remaining steps; the last loss.

  `keep_reference` is given the step timed alone before training, where
  the run times one (`reference_step`)."""
  if ctx.first_step > ctx.last_step:
    return float("nan")
  train_step = _make_train_step(config, spec, strategy, parallel)
  split_compute = _split_compute(parallel, strategy)
  stream = _foreground_stream(ctx.background)
  reference = None
  if (_times_reference(config, parallel) and stream is None
      and keep_reference is not None):
    calibrate = functools.partial(
        reference_step.calibrate, train_step,
        _resident_first_batch(config, spec, strategy),
        model=parallel.model, optimizer=parallel.optimizer,
        strategy=strategy, num_steps=config.run.reference_steps,
        offloader=parallel.offload, pipeline=parallel.pipeline)
    reference = calibrate()
    keep_reference(reference)
    if parallel.pipeline:
      make_split = functools.partial(reference.split_stage_compute,
                                     split_compute,
                                     pipeline_stats.STAGE_COMPUTE)
    else:
      # With offload, the derived cost replaces the copies' split.
      make_split = functools.partial(
          reference.split_compute,
          inner=_split_compute(parallel, strategy, offload_derived=True))
    split_compute = contention.retime_after_loop(
        paired_removal.split_per_arm(ctx.pairing, make_split,
                                     first_step=ctx.first_step),
        reference, calibrate, keep_reference,
        pipelined=bool(parallel.pipeline))
  train_step, split_compute = paired_removal.apply_offload_removal(
      ctx.pairing, train_step, split_compute, cost=reference,
      make_step_without=functools.partial(
          reference_step.make_step_without_offload, train_step,
          parallel.offload),
      inner_split=_split_compute(parallel, strategy, offload_derived=True),
      first_step=ctx.first_step)
  # A step without its all-reduce is split against the same step alone,
  # timed with the all-reduce paused (`reference_step`).
  train_step = paired_removal.apply_step_removal(
      ctx.pairing, paired_removal.ALL_REDUCE, train_step,
      functools.partial(steps.make_local_train_step, train_step,
                        strategy),
      first_step=ctx.first_step)
  removes_waits = paired_removal.removes(ctx.pairing,
                                         paired_removal.PIPELINE_WAITS)
  train_step = paired_removal.apply_step_removal(
      ctx.pairing, paired_removal.PIPELINE_WAITS, train_step,
      functools.partial(steps.make_apart_train_step, train_step,
                        parallel.pipeline),
      first_step=ctx.first_step)
  if parallel.pipeline and not removes_waits:
    # Timed or not, no step runs alone or apart from here on.
    parallel.pipeline.release_stand_ins()
  # The loader draws its workers' seed from torch's generator; forked,
  # the training stream (dropout) is the one a checkpoint restores.
  with torch.random.fork_rng(devices=[]):
    batches = paired_removal.apply_input_removal(
        _build_train_batches(config, spec, strategy, ctx.first_step),
        ctx.pairing,
        functools.partial(_read_resident_batches, config, spec, strategy),
        first_step=ctx.first_step, last_step=ctx.last_step)
  try:
    return loops.run_custom_loop(
        ctx, train_step=train_step, iterator=batches,
        device=strategy.device, split_compute=split_compute, stream=stream)
  finally:
    # The device prefetcher stages batches on a thread of its own.
    if hasattr(batches, "close"):
      batches.close()


def _times_reference(config: TrainConfig, parallel) -> bool:
  """Whether the run times its step alone first, for the contention
  phase (`contention.times_reference`; PyTorch has one step per call and
  no loop but its own)."""
  return contention.times_reference(
      config.run.reference_steps,
      pipelined=bool(parallel.pipeline
                     and not parallel.pipeline.can_run_alone),
      burst=bool(parallel.burst),
      fixed_offload=bool(parallel.offload
                         and not parallel.offload.can_pause))


def check_user_model(config: TrainConfig) -> None:
  """Builds the user's --model and reads its data once, in this process,
  so that a bad one is refused in one line before replicas start (each
  would refuse it again, in a line of its own).

  Raises:
    ConfigError: what `load_user_model` refuses.
  """
  if user_code.model_spec(config.model.name) is not None and (
      not user_code.is_import_path(config.data.dataset)):
    return
  side = _TorchSide()
  info = side.describe_data(config)
  if user_code.model_spec(config.model.name) is None:
    torch.manual_seed(config.run.seed)
    side.load_user_model(config, info)


def train(config: TrainConfig):
  """Runs training as configured; returns the run record it wrote.

  Returns:
    The run record, or None in a mirrored replica other than rank 0, which
    writes nothing (its worker's record is rank 0's).

  Raises:
    ConfigError: for a setting this framework or host cannot honour.
  """
  return skeleton.run(_TorchSide(), config)


def _mirrored_cpu_work(strategy, config: TrainConfig,
                       ledger: ledger_lib.StepLedger):
  """(work seconds per step, processes) summed over a mirrored job's
  replica processes, or None for any other job. Each replica is a process
  of its own and none is another's child, so rank 0's process tree holds
  its own work only, while the one worker's steps take all of theirs. A
  collective: every replica calls it."""
  if config.distribute.strategy != "mirrored" or strategy.world_size < 2:
    return None
  (work_s,) = strategy.sum_over_processes(
      [ledger.summary()["cpu"]["work_s_per_step"]])
  return work_s, strategy.world_size
