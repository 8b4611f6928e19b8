"""One PyTorch training run from a TrainConfig: build, train, record.

The same run as `tfoverlap.trainer.train`, in PyTorch: the same flags, the
same ledger phases, the same run.json schema, trace, progress lines and
final table. The order matters: thread pools are fixed before any torch
work, the process joins its world before the model exists (DDP broadcasts
rank 0's weights when it wraps the model), and the optimizer is built on
the device-resident parameters.
"""

import contextlib
import os
import sys
import time

import torch

from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.planning import burst_report, command, conditions
from overlap_core.planning import split as split_lib
from overlap_core.runtime import background, compat, ledger as ledger_lib
from overlap_core.runtime import (datasets, outputs, pipeline_stats,
                                  run_record, zoo)
from overlap_core.runtime.config import TrainConfig, check_burst_supported
from overlap_core.runtime.loop_context import LoopContext
from overlap_core.runtime.progress import ProgressPrinter
from torch_parity import (background_cuda, checkpoint, data, distribute,
                          loops, models, parallelize, pipeline,
                          pipeline_timing, steps)

FRAMEWORK = "pytorch"


def check_supported(config: TrainConfig, *, num_gpus: int = None) -> None:
  """Refuses every flag value that has no meaning in PyTorch.

  The one place that decides what this trainer cannot honour, so that no
  flag is ever silently ignored; the launcher calls it too, before any
  process starts. Which features combine is `overlap_core.runtime.compat`'s
  table; what is left here are counts this host or world must match.

  Args:
    config: the validated run configuration.
    num_gpus: GPUs on this host (default: what torch sees).

  Raises:
    ConfigError: naming the flag, the value and why.
  """
  if num_gpus is None:
    num_gpus = torch.cuda.device_count()
  compat.check_combinations(config, FRAMEWORK,
                            host=compat.Host(num_gpus=num_gpus))
  pipeline.check_pipeline_supported(config, num_gpus=num_gpus)
  distribute.check_strategy(config.distribute, num_gpus=num_gpus)
  check_burst_supported(
      config.burst, host_devices=num_gpus or os.cpu_count(),
      device_kind="GPUs" if num_gpus else "CPU cores")


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


def _build_train_batches(config: TrainConfig, spec, strategy, first_step):
  """This process's training batches: resident, or the loader (staged on
  the device ahead of the step with --prefetch_to_device)."""
  # A batch per data-parallel replica: every stage of one replica reads
  # the same batch (the first uses its inputs, the last its targets).
  dims = strategy.dims
  shard = {"rank": dims.coordinates(strategy.rank).data_parallel,
           "world_size": dims.data_parallel}
  if config.burst.enabled:
    # Every rank reads the whole global batch: which rows a rank needs
    # changes from layer to layer (and ranks beyond the first layer's width
    # need none of its inputs but some of the last layer's targets), and
    # one shared order of samples is what makes a burst run train exactly
    # like one process on the same data. Reading a batch is cheap next to
    # an exchange of its rows.
    shard = {"rank": 0, "world_size": 1}
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


def _pipeline_spec(config: TrainConfig, spec, info):
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
  side = config.data.image_size // spec.upscale
  return parallelize.PipelineSpec(
      cfg, torch.randn(microbatch, info.channels, side, side),
      steps.make_pipeline_loss(spec.task), split_lib.load_profile(cfg.profile))


def _burst_spec(config: TrainConfig, spec, info, plan):
  """What parallelize needs to run the plan, or None without one."""
  if plan is None:
    return None
  side = config.data.image_size // spec.upscale
  # Zeros: only shapes are traced, and drawing random numbers here would
  # move the seeded stream the model's initial weights come from.
  return parallelize.BurstSpec(plan, config.burst.plan_path,
                               torch.zeros(2, info.channels, side, side))


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


def _phases_measured(parallel) -> list:
  """The ledger phases this run times: a pipelined step's compute is its
  stage_compute, bubble and transfer instead; an offloading step's is
  offload_copy and the rest of compute."""
  if parallel.offload:
    return [ledger_lib.DATA_WAIT, ledger_lib.COMPUTE, ledger_lib.OFFLOAD_COPY,
            ledger_lib.CHECKPOINT_STALL]
  if not parallel.pipeline:
    return list(ledger_lib.PHASES)
  return [ledger_lib.DATA_WAIT, *pipeline_stats.PHASES,
          ledger_lib.CHECKPOINT_STALL]


def _split_compute(parallel):
  """How the loop records a step's compute span: as the pipeline phases,
  as offload copies and compute, or (None) as one compute phase. Offload
  and pipeline stages are never combined (`check_supported`)."""
  if parallel.pipeline:
    return parallel.pipeline.recorder.end_step
  if parallel.offload:
    return parallel.offload.split_compute
  return None


def _describe_strategy(strategy, parallel, config, plan, ledger) -> dict:
  described = strategy.describe()
  if parallel.pipeline:
    described["pipeline"] = parallel.pipeline.describe()
  if parallel.burst:
    described["class"] = "torch_parity.burst.BurstModel"
    described["burst"] = burst_report.plan_against_run(
        plan, config.burst.plan_path, ledger.summary())
  return described


def train(config: TrainConfig):
  """Runs training as configured; returns the run record it wrote.

  Returns:
    The run record, or None in a mirrored replica other than rank 0, which
    writes nothing (its worker's record is rank 0's).

  Raises:
    ConfigError: for a setting this framework or host cannot honour.
  """
  start = time.perf_counter()
  check_supported(config)
  distribute.configure_host(config.run)
  strategy = distribute.build_strategy(config.distribute)
  if config.pipeline.stages > 1:
    distribute.apply_pipeline_dims(strategy, config.pipeline.stages)
  held = None
  try:
    config = run_record.with_default_model_dir(config, FRAMEWORK)
    out_dir = run_record.worker_dir(config.run.model_dir,
                                    strategy.worker_index)
    if strategy.writes_outputs:
      # Before anything is built: a second run on the directory ends at
      # once (its launcher stops the other replicas).
      held = outputs.hold_worker_dir(out_dir)
    _seed(config, strategy.device)
    spec = zoo.MODELS[config.model.name]
    info = data.describe(config.data)
    plan = (burst_report.read_plan(config.burst.plan_path)
            if config.burst.enabled else None)
    parallel = parallelize.parallelize(
        strategy,
        build_model=lambda: models.build_model(
            config.model.name, image_size=config.data.image_size,
            num_classes=info.num_classes, channels=info.channels),
        build_optimizer=lambda module: steps.build_optimizer(
            config.model, module.parameters()),
        offload=config.offload,
        pipeline=_pipeline_spec(config, spec, info),
        burst=_burst_spec(config, spec, info, plan))
    model, optimizer = parallel.model, parallel.optimizer
    offloader = parallel.offload
    # A burst run's checkpoint is rank 0's: it runs every layer, so its
    # model and optimizer state are the whole run's.
    # After parallelize: Horovod's DistributedOptimizer is a new optimizer
    # with state of its own, the one to save and restore. Every rank
    # restores rank 0's checkpoint, so all resume from the same state.
    checkpointer = checkpoint.build_checkpointer(
        config.checkpoint, config.run.model_dir, model=model,
        optimizer=optimizer, is_chief=strategy.rank == 0,
        describe_state=checkpoint_engine.make_state_describer(
            config.data, seed=config.run.seed,
            num_train_examples=info.num_train_examples),
        agree=distribute.make_agree(strategy))
    resume = checkpointer.restore_latest() if checkpointer else None
    restored_step = resume.step if resume else 0

    ledger = ledger_lib.StepLedger()
    write_scalars = loops.make_scalar_writer(
        os.path.join(out_dir, "tensorboard")
        if config.run.tensorboard and strategy.writes_outputs else None,
        config.run.log_every_steps, ledger)
    ctx = LoopContext(
        ledger=ledger,
        progress=ProgressPrinter(
            total_steps=config.run.train_steps,
            every_steps=config.run.log_every_steps,
            enabled=config.run.progress and strategy.rank == 0,
            prefix=("" if strategy.num_workers == 1
                    else f"[worker {strategy.worker_index}] ")),
        checkpointer=checkpointer,
        write_scalars=write_scalars,
        first_step=restored_step + 1,
        last_step=config.run.train_steps,
        global_batch_size=config.data.batch_size,
        background=_make_background(
            config, strategy, out_dir, first_step=restored_step + 1,
            last_step=config.run.train_steps))
    train_loss = float("nan")
    if ctx.first_step <= ctx.last_step:
      # The loader draws its workers' seed from torch's generator; forked,
      # the training stream (dropout) is the one a checkpoint restores.
      with torch.random.fork_rng(devices=[]):
        batches = _build_train_batches(config, spec, strategy,
                                       ctx.first_step)
      try:
        train_loss = loops.run_custom_loop(
            ctx,
            train_step=_make_train_step(config, spec, strategy, parallel),
            iterator=batches, device=strategy.device,
            split_compute=_split_compute(parallel),
            stream=_foreground_stream(ctx.background))
      except BaseException:
        if checkpointer:
          # The running persist completes or is dropped whole, never half;
          # the training error is the one to report.
          with contextlib.suppress(Exception):
            checkpointer.close()
        raise
      finally:
        # The device prefetcher stages batches on a thread of its own.
        if hasattr(batches, "close"):
          batches.close()
        if ctx.background is not None:
          ctx.background.stop()
    if checkpointer:
      checkpointer.finish(ctx.last_step)
    write_scalars.close()
    pipeline_section = None
    if parallel.pipeline:
      pipeline.average_stage_buffers(parallel.pipeline)
      # A collective: every rank, before only some go on to write.
      pipeline_section = pipeline_timing.gather_pipeline_section(
          parallel.pipeline, config.pipeline, strategy.device,
          warmup_steps=ledger_lib.default_warmup_steps(len(ledger.steps)))
      # Where predictions and measurements part, the conditions may say why.
      pipeline_section["profile_conditions"] = conditions.describe(
          split_lib.load_profile(config.pipeline.profile),
          pipeline.stage_conditions(config))
    elif parallel.burst:
      parallel.burst.share_first_rank_state(model)
    else:
      strategy.average_buffers(model)
    final = {"train_loss": train_loss}
    # Before evaluation, whose forward passes would count copies too.
    offload_stats = (offloader.summary(num_steps=len(ledger.steps))
                     if offloader else None)
    if config.run.evaluate and info.num_eval_examples:
      final.update(_evaluate(config, spec, strategy, model))
    cpu_of_processes = _mirrored_cpu_work(strategy, config, ledger)
    if not strategy.writes_outputs:
      return None
    notes = [strategy.describe_backend() if not parallel.burst else
             f"burst plan {config.burst.plan_path} over {strategy.backend}"]
    if restored_step:
      notes.append(f"resumed from the checkpoint of step {restored_step}")
    return outputs.write_worker_outputs(
        config, out_dir, ledger, framework=FRAMEWORK,
        worker_index=strategy.worker_index,
        num_workers=strategy.num_workers,
        environment=describe_environment(strategy),
        strategy=_describe_strategy(strategy, parallel, config, plan,
                                    ledger),
        num_params=models.num_params(model),
        weights_digest=weights_digest(model), final=final,
        phases_measured=_phases_measured(parallel),
        checkpoint_stats=checkpointer.stats() if checkpointer else None,
        notes=notes, wall_s=time.perf_counter() - start,
        offload_stats=offload_stats,
        pipeline=pipeline_section,
        background_stats=(ctx.background.stats() if ctx.background
                          else None),
        cpu_of_processes=cpu_of_processes)
  finally:
    if held is not None:
      held.release()
    strategy.close()


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
