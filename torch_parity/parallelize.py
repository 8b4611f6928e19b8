"""The one place a PyTorch run's parallelism is applied to its model.

`parallelize` takes the model (on this process's device) and its optimizer
and applies, in a fixed order (the same as `tfoverlap.parallelize`; why is
beside the code):

  1. pipeline stages: keep this rank's stage(s) of the model, cut at the
     plan's layers, under a torch.distributed.pipelining schedule
     (torch_parity.pipeline), which averages each stage's gradients over
     its replicas after every step;
  2. burst: a burst plan (`--burst_parallel`) in place of data
     parallelism: every layer runs on its own planned ranks
     (`torch_parity.burst.BurstModel`), which all-reduces each layer's
     gradients within its own group;
  3. data parallelism: DDP wraps the module, so gradient buckets are
     all-reduced while backward still runs; or Horovod wraps the optimizer,
     which all-reduces from backward hooks;
  4. offload: saved activations and/or each layer's weights live in host
     memory between uses (`torch_parity.offload.apply_offload`).
"""

from typing import Callable, NamedTuple, Optional

import torch
from torch import nn

from overlap_core.planning.dims import ParallelDims
from overlap_core.planning.burst import BurstPlan
from overlap_core.planning.profile import Profile
from overlap_core.runtime.config import (ConfigError, OffloadConfig,
                                         PipelineConfig)
from torch_parity import burst as burst_lib
from torch_parity import offload as offload_lib
from torch_parity import pipeline as pipeline_lib
from torch_parity.distribute import Strategy


class Parallelized(NamedTuple):
  """A model with the run's parallelism applied.

  Attributes:
    model: the module itself, on this process's device; its state_dict is
      what checkpoints save.
    train_model: what the train step calls (DDP's wrapper, or the module).
    optimizer: what the train step steps, and whose state checkpoints save:
      Horovod's DistributedOptimizer is a new optimizer of its own.
    dims: the run's degrees of parallelism.
    offload: the `Offloader` whose hooks move tensors, or None.
    pipeline: this rank's `PipelineRuntime` when pipelined (then `model`
      holds this rank's stages only, and the train step runs the
      schedule), else None.
    burst: the `BurstModel` that runs a burst plan (then `train_model` is
      it, and `model` the whole module it runs), else None.
  """
  model: nn.Module
  train_model: nn.Module
  optimizer: object
  dims: ParallelDims
  offload: Optional[offload_lib.Offloader] = None
  pipeline: Optional[pipeline_lib.PipelineRuntime] = None
  burst: Optional[burst_lib.BurstModel] = None


class PipelineSpec(NamedTuple):
  """What step 1 needs to cut the model: the flags' pipeline settings, a
  micro-batch to trace shapes with, the loss the last stage computes, and
  the layer profile that predicts stage times (None: no predictions)."""
  config: PipelineConfig
  example_input: torch.Tensor
  loss_fn: Callable
  profile: Optional[Profile] = None


class BurstSpec(NamedTuple):
  """What a burst plan needs: the plan, where it came from, and a small
  batch to trace the model's per-sample shapes with."""
  plan: BurstPlan
  plan_path: str
  example_input: torch.Tensor


def parallelize(strategy: Strategy, build_model: Callable[[], nn.Module],
                build_optimizer: Callable[[nn.Module], object],
                offload: OffloadConfig = OffloadConfig(),
                pipeline: Optional[PipelineSpec] = None,
                burst: Optional[BurstSpec] = None) -> Parallelized:
  """Builds the model and optimizer with the run's parallelism applied.

  Args:
    strategy: this process's part in the run's parallelism.
    build_model: makes the whole model (on the CPU; it is moved here).
    build_optimizer: makes its optimizer from the device-resident module.
    offload: what to keep in host memory between uses.
    pipeline: how to cut the model, when strategy.dims.pipeline > 1.
    burst: the burst plan to run in place of data parallelism, or None.
  """
  # The order is the same on both sides (tfoverlap.parallelize):
  # pipeline first, because a stage is the unit the other parallelisms
  # replicate, so the model is cut before anything is copied; burst next,
  # because it replaces data parallelism and must be chosen before DDP or
  # Horovod wraps the model (they would all-reduce every gradient over
  # the world); data parallelism then, because DDP and Horovod must wrap
  # the module a rank really runs; offload last, because it moves the
  # tensors of an already wrapped module, whose hooks must not see them
  # move underneath.
  # Pipeline, burst and offload do not combine with one another or with a
  # strategy's replicas; the compatibility table refuses those before
  # this runs (`trainer.check_supported`).
  dims = strategy.dims
  if dims.is_pipelined:
    if pipeline is None:
      raise ValueError(f"Invalid value for argument `pipeline`. Received: "
                       f"None with pipeline={dims.pipeline}; allowed: a "
                       "PipelineSpec")
    return apply_pipeline(strategy, build_model, build_optimizer, pipeline)
  if burst is not None:
    return apply_burst(strategy, build_model, build_optimizer, burst)
  model = build_model().to(strategy.device)
  optimizer = build_optimizer(model)
  train_model = strategy.wrap_model(model)
  optimizer = strategy.wrap_optimizer(optimizer, model)
  offloader = offload_lib.apply_offload(model, optimizer, offload,
                                        strategy.device)
  return Parallelized(model, train_model, optimizer, dims, offloader)


def apply_pipeline(strategy: Strategy, build_model: Callable[[], nn.Module],
                   build_optimizer: Callable[[nn.Module], object],
                   spec: PipelineSpec) -> Parallelized:
  """Step 1, then step 3 within it: cut, keep this rank's stages; with
  replicas, the runtime averages each stage's gradients over the ranks
  holding it, as backward finishes them or, with
  --pipeline_overlap_all_reduce=false, after every schedule step (no DDP
  wrapper: see `pipeline_allreduce`)."""
  cfg = spec.config
  model = build_model()
  split = pipeline_lib.plan_split(model, spec.example_input, cfg,
                                  profile=spec.profile)
  modules = pipeline_lib.build_stages(model, split.cuts)
  mesh = pipeline_lib.build_mesh_groups(strategy.dims, strategy.rank)
  runtime = pipeline_lib.build_runtime(
      modules, cfg, mesh, strategy.device, spec.loss_fn,
      bucket_mb=(strategy.cfg.all_reduce_pack_mb or
                 pipeline_lib.DEFAULT_BUCKET_MB),
      overlap_all_reduce=cfg.overlap_all_reduce)
  runtime.split = split
  runtime.has_predictions = spec.profile is not None
  own = nn.ModuleList(runtime.stage_modules)
  optimizer = build_optimizer(own)
  return Parallelized(own, own, optimizer, strategy.dims, None, runtime)


def apply_burst(strategy: Strategy, build_model: Callable[[], nn.Module],
                build_optimizer: Callable[[nn.Module], object],
                spec: BurstSpec) -> Parallelized:
  """Replaces step 3: every layer on its planned ranks.

  Raises:
    ConfigError: the plan does not fit the model (one line).
  """
  model = build_model().to(strategy.device)
  # Every rank starts from the same weights, as DDP's broadcast at wrap
  # time gives data parallelism; rank 0's seed decides them.
  try:
    burst = burst_lib.BurstModel(
        model, spec.plan.widths_by_layer(),
        global_batch=spec.plan.global_batch,
        example_input=spec.example_input.to(strategy.device),
        rank=strategy.rank, world_size=strategy.world_size)
  except ValueError as e:
    raise ConfigError("burst_parallel", spec.plan_path, str(e)) from None
  burst.share_first_rank_state(model)
  optimizer = build_optimizer(model)
  return Parallelized(model, burst, optimizer, strategy.dims, burst=burst)
