"""One training run, framework-neutral: the order both trainers follow.

Join the world, hold the worker's directory, configure the host, build and
parallelize, restore, loop, evaluate, record. Each framework side supplies
what only it knows as a `Side` (its hooks); the order, the directory lock,
the checkpoint's final save, the progress line and run.json's assembly are
decided here, once, so the two trainers cannot drift apart.

  record = skeleton.run(TensorFlowSide(), config)

Nothing here imports a framework.
"""

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, List, Optional, Protocol

from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.planning import burst_report, conditions
from overlap_core.planning import split as split_lib
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import (offload_cost, outputs, paired_removal,
                                  run_record, user_code, zoo)
from overlap_core.runtime.config import TrainConfig
from overlap_core.runtime.loop_context import LoopContext
from overlap_core.runtime.progress import ProgressPrinter


@dataclasses.dataclass(frozen=True)
class World:
  """Where this process stands in the run, once it has joined it.

  Attributes:
    worker_index, num_workers: this process's worker among the run's.
    is_chief: the one process that prints progress, checkpoints as chief
      and runs the background job (TensorFlow's worker 0, PyTorch's rank 0).
    writes_outputs: whether this process writes its worker's directory (a
      PyTorch mirrored replica other than rank 0 does not).
  """
  worker_index: int = 0
  num_workers: int = 1
  is_chief: bool = True
  writes_outputs: bool = True


class Side(Protocol):
  """What a framework supplies to `run`, in the order `run` calls it.

  One object per run: hooks may keep what they build (the strategy) on it.
  `built` is the side's parallelized result; `run` reads only its `model`,
  `optimizer` and `offload` (an `Offloader` with `summary()`, or None).
  """
  framework: str  # as run.json names it

  def check_supported(self, config: TrainConfig) -> None: ...

  def join(self, config: TrainConfig) -> World: ...

  def leave(self) -> None: ...

  def configure_host(self, config: TrainConfig) -> TrainConfig: ...

  def stop_services(self) -> None: ...

  def describe_data(self, config: TrainConfig) -> Any: ...

  def load_user_model(self, config: TrainConfig, info) -> zoo.ModelSpec:
    """Builds (or loads) the user's --model, checks it on the data's first
    batch and keeps it for `parallelize`; returns its Task's spec."""

  def parallelize(self, config: TrainConfig, spec, info, plan) -> Any: ...

  def make_checkpointer(self, config: TrainConfig, built, world: World,
                        describe_state: Callable) -> Optional[Any]: ...

  def make_scalar_writer(self, logdir: Optional[str], every_steps: int,
                         ledger: ledger_lib.StepLedger) -> Callable: ...

  def make_background(self, config: TrainConfig, out_dir: str, *,
                      first_step: int, last_step: int) -> Optional[Any]: ...

  def run_loop(self, ctx: LoopContext, config: TrainConfig, spec,
               built) -> float: ...

  def after_training(self, config: TrainConfig, built,
                     ledger: ledger_lib.StepLedger) -> Optional[dict]: ...

  def stage_conditions(self, config: TrainConfig) -> dict: ...

  def evaluate(self, config: TrainConfig, spec, model) -> dict: ...

  def cpu_of_processes(self, config: TrainConfig,
                       ledger: ledger_lib.StepLedger) -> Optional[tuple]: ...

  def notes(self, config: TrainConfig, built, restored_step: int
            ) -> List[str]: ...

  def phases_measured(self, config: TrainConfig, built) -> List[str]: ...

  def phases_derived(self, config: TrainConfig, built) -> List[str]: ...

  def describe_environment(self) -> dict: ...

  def describe_strategy(self, config: TrainConfig, built, plan,
                        ledger: ledger_lib.StepLedger) -> dict: ...

  def num_params(self, model) -> int: ...

  def weights_digest(self, model) -> str: ...


def run(side: Side, config: TrainConfig) -> Optional[dict]:
  """Runs training as configured; returns the run record it wrote.

  Returns:
    The run record, or None in a process that writes no outputs.

  Raises:
    ConfigError: for a setting the side or host cannot honour, unchanged.
  """
  start = time.perf_counter()
  side.check_supported(config)
  # Before the directory is held: a user's module that does not import
  # leaves nothing behind.
  user_code.check_importable(config.model.name, config.data.dataset)
  world = side.join(config)
  try:
    config = run_record.with_default_model_dir(config, side.framework)
    out_dir = run_record.worker_dir(config.run.model_dir, world.worker_index)
    # Before anything is built: a second run on the directory ends at once
    # (its launcher stops the rest of its job). Held until run.json is
    # written, so it covers the final save too.
    held = outputs.hold_worker_dir(out_dir) if world.writes_outputs else None
    try:
      return _run_holding(side, config, world, out_dir, start=start)
    finally:
      if held is not None:
        held.release()
  finally:
    side.leave()


@dataclasses.dataclass
class _Trained:
  """What the record is made of once training and evaluation are done."""
  built: Any
  plan: Any
  ctx: LoopContext
  checkpointer: Any
  restored_step: int
  final: dict
  offload_stats: Optional[dict]
  pipeline_section: Optional[dict]
  cpu_of_processes: Optional[tuple]


def _run_holding(side: Side, config: TrainConfig, world: World, out_dir: str,
                 *, start: float) -> Optional[dict]:
  """`run`, once this process holds `out_dir` (or writes nothing)."""
  config = side.configure_host(config)
  try:
    trained = _train(side, config, world, out_dir)
  finally:
    side.stop_services()
  if not world.writes_outputs:
    return None
  built, ledger = trained.built, trained.ctx.ledger
  notes = side.notes(config, built, trained.restored_step)
  if trained.restored_step:
    notes.append(
        f"resumed from the checkpoint of step {trained.restored_step}")
  background_runner = trained.ctx.background
  return outputs.write_worker_outputs(
      config, out_dir, ledger, framework=side.framework,
      worker_index=world.worker_index, num_workers=world.num_workers,
      environment=side.describe_environment(),
      strategy=side.describe_strategy(config, built, trained.plan, ledger),
      num_params=side.num_params(built.model),
      weights_digest=side.weights_digest(built.model), final=trained.final,
      phases_measured=side.phases_measured(config, built),
      phases_derived=side.phases_derived(config, built),
      checkpoint_stats=(trained.checkpointer.stats()
                        if trained.checkpointer else None),
      notes=notes, wall_s=time.perf_counter() - start,
      offload_stats=trained.offload_stats, pipeline=trained.pipeline_section,
      background_stats=(background_runner.stats() if background_runner
                        else None),
      cpu_of_processes=trained.cpu_of_processes,
      pairing=trained.ctx.pairing)


def _train(side: Side, config: TrainConfig, world: World,
           out_dir: str) -> _Trained:
  """Builds, restores, trains and evaluates."""
  spec = user_code.model_spec(config.model.name)
  info = side.describe_data(config)
  if spec is None:
    # The user's model: built now, so its Task is known before anything
    # that depends on it (pipeline loss, input pairs) is made.
    spec = side.load_user_model(config, info)
  plan = (burst_report.read_plan(config.burst.plan_path)
          if config.burst.enabled else None)
  built = side.parallelize(config, spec, info, plan)
  checkpointer = side.make_checkpointer(
      config, built, world, checkpoint_engine.make_state_describer(
          config.data, seed=config.run.seed,
          num_train_examples=info.num_train_examples))
  resume = checkpointer.restore_latest() if checkpointer else None
  restored_step = resume.step if resume else 0

  ctx = _make_loop_context(side, config, world, out_dir, checkpointer,
                           first_step=restored_step + 1)
  try:
    final = {"train_loss": side.run_loop(ctx, config, spec, built)}
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
  ctx.write_scalars.close()
  # May be a collective: every process, before only some go on to write.
  pipeline_section = side.after_training(config, built, ctx.ledger)
  if pipeline_section is not None:
    # Where predictions and measurements part, the conditions may say why.
    pipeline_section["profile_conditions"] = conditions.describe(
        split_lib.load_profile(config.pipeline.profile),
        side.stage_conditions(config))
  # Before evaluation, whose forward passes would count copies too.
  offload_stats = (built.offload.summary(num_steps=len(ctx.ledger.steps))
                   if built.offload else None)
  if offload_stats is not None:
    offload_stats["phase_from"] = offload_cost.phase_from(
        side.phases_measured(config, built), side.phases_derived(config, built))
  if config.run.evaluate and info.num_eval_examples:
    final.update(side.evaluate(config, spec, built.model))
  return _Trained(built=built, plan=plan, ctx=ctx, checkpointer=checkpointer,
                  restored_step=restored_step, final=final,
                  offload_stats=offload_stats,
                  pipeline_section=pipeline_section,
                  cpu_of_processes=side.cpu_of_processes(config, ctx.ledger))


def _make_loop_context(side: Side, config: TrainConfig, world: World,
                       out_dir: str, checkpointer, *,
                       first_step: int) -> LoopContext:
  """The loop's bookkeeping: ledger, progress line, scalars, background."""
  ledger = ledger_lib.StepLedger()
  last_step = config.run.train_steps
  background_runner = None
  if config.burst.background and world.is_chief:  # one job per run
    background_runner = side.make_background(
        config, out_dir, first_step=first_step, last_step=last_step)
  return LoopContext(
      ledger=ledger,
      progress=ProgressPrinter(
          total_steps=last_step,
          every_steps=config.run.log_every_steps,
          enabled=config.run.progress and world.is_chief,
          prefix=("" if world.num_workers == 1
                  else f"[worker {world.worker_index}] ")),
      checkpointer=checkpointer,
      write_scalars=side.make_scalar_writer(
          os.path.join(out_dir, "tensorboard")
          if config.run.tensorboard and world.writes_outputs else None,
          config.run.log_every_steps, ledger),
      first_step=first_step,
      last_step=last_step,
      global_batch_size=config.data.batch_size,
      background=background_runner,
      pairing=paired_removal.from_config(config.run.paired_removal,
                                         config.run.paired_block_steps))
