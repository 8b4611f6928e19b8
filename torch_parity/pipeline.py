"""PyTorch pipeline stages: the plan's split, run by torch.distributed.pipelining.

The model is traced once with torch.fx (the graph the planner read), every
node is assigned to the stage its cut layers put it in, and
`torch.fx.passes.split_module` makes one `GraphModule` per stage: stage k
runs exactly the fx nodes of stage k, and takes and returns the one tensor
that crosses its cut (the planner's cut points guarantee there is one).

Each rank keeps its own stage (or stages, with virtual stages) and hands it
to a `PipelineStage` whose point-to-point traffic runs on the stage-to-stage
group of its data-parallel column. The schedule splits the batch into
micro-batches: the first stage reads the inputs, the last computes the loss.
With replicas, each stage's gradients are then averaged over the ranks
holding that stage, bucket by bucket as the last micro-batch's backward
makes them final (`torch_parity.pipeline_allreduce`). Every step's bubble,
transfer and exposed all-reduce are timed (`torch_parity.pipeline_timing`),
and the bytes each stage saves for backward counted
(`torch_parity.pipeline_memory`).

  split = plan_split(model, example, cfg)
  modules = build_stages(model, split.cuts)
  runtime = build_runtime(modules, cfg, mesh, device, loss_fn)
  losses = runtime.step(inputs, targets)   # the last stage gets the losses
"""

import contextlib
import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import fx
from torch import nn
from torch.fx.passes.split_module import split_module

from overlap_core.planning import command as command_lib
from overlap_core.planning import conditions as conditions_lib
from overlap_core.planning import partition as partition_lib
from overlap_core.planning import split as split_lib
from overlap_core.planning.dims import ParallelDims
from overlap_core.planning.profile import Profile
from overlap_core.runtime import compat_table, pipeline_stats
from overlap_core.runtime.config import (ConfigError, PipelineConfig,
                                         TrainConfig)
from torch_parity.pipeline_allreduce import OverlappedGradientReduce
from torch_parity.pipeline_memory import SavedTensorMeter, stage_state
from torch_parity.pipeline_timing import P2PTimer
from torch_parity.planning.graph import build_layer_graph, layer_names

# Schedules that run on gloo here, by their class in
# torch.distributed.pipelining; zero_bubble is refused by the compatibility
# table (overlap_core.runtime.compat_table).
_SCHEDULES = {
  "gpipe": "ScheduleGPipe",
  "1f1b": "Schedule1F1B",
  "interleaved_1f1b": "ScheduleInterleaved1F1B",
}
# DDP's default bucket: gradients are all-reduced in flat buckets this big.
DEFAULT_BUCKET_MB = 25.0
# Steps whose saved tensors are counted: the schedule and the shapes are
# the same every step, so its peak is too; counting costs a Python call
# per saved tensor, which later steps (the ones timed) are spared.
MEMORY_STEPS = 2


PLAN_PROGRAM = "torch_parity.plan"
# How the profiles this side writes name their framework (its first word).
PROFILE_FRAMEWORK = "torch"


def stage_conditions(config: TrainConfig, *, num_gpus: Optional[int] = None
                     ) -> conditions_lib.StageConditions:
  """What each stage runs under: a stage is a process of its own, one of
  the world's on this host, with the threads the launcher gives each
  (TensorFlow differs: one process holds every stage), on its GPU or the
  CPU."""
  if num_gpus is None:
    num_gpus = torch.cuda.device_count()
  return command_lib.stage_conditions(
      config, framework=PROFILE_FRAMEWORK,
      device="cuda" if num_gpus else "cpu",
      num_processes=ParallelDims.from_config(config, None).world_size)


def check_profile(config: TrainConfig, *,
                  num_gpus: Optional[int] = None) -> str:
  """`command.check_stage_profile` for this run's stages."""
  return command_lib.check_stage_profile(
      config, lambda: stage_conditions(config, num_gpus=num_gpus),
      PLAN_PROGRAM)


def check_pipeline_supported(config: TrainConfig, *,
                             num_gpus: Optional[int] = None) -> None:
  """The pipeline's counts: stages x replicas must be the world, and a
  usable profile.

  Which features combine with stages is the compatibility table's
  (`overlap_core.runtime.compat_table`, checked first by the trainer).

  Raises:
    ConfigError: naming the flag, the value and why.
  """
  cfg = config.pipeline
  if cfg.stages == 1:
    check_profile(config)
    return
  # Refuses a world the stages do not divide, with its one line.
  ParallelDims.from_config(config, compat_table.PT)
  check_profile(config, num_gpus=num_gpus)


def plan_split(model: nn.Module, example: torch.Tensor, cfg: PipelineConfig,
               *, profile: Optional[Profile] = None,
               name: str = "") -> partition_lib.StagePlan:
  """The S*V stages of the flags' split (`split.plan_split`), on the fx
  graph, at the micro-batch `example` holds.

  Raises:
      ConfigError: naming pipeline_split (or plan_profile), for a split
    the graph or the profile cannot take.
  """
  if cfg.split == "auto" and profile is None:
    # Before the trace: the refusal needs no graph.
    raise ConfigError("pipeline_split", "auto", split_lib.AUTO_NEEDS_PROFILE)
  graph = build_layer_graph(model, example, name=name)
  return split_lib.plan_split(graph, cfg, microbatch_size=example.shape[0],
                              profile=profile,
                              framework=PROFILE_FRAMEWORK)


def plan_cut_layers(model: nn.Module, example: torch.Tensor,
                    cfg: PipelineConfig, *, name: str = "") -> List[str]:
  """The layers the first S*V - 1 stages end with (no profile)."""
  return list(plan_split(model, example, cfg, name=name).cuts)


def build_stages(model: nn.Module, cut_layers: Sequence[str]
                 ) -> List[fx.GraphModule]:
  """The model as len(cut_layers) + 1 stage modules, in order.

  A stage's parameters and buffers are the model's own tensors (shared,
  not copied), so a stage module's state_dict keys are the model's.

  Raises:
      ValueError: a cut layer is not a node of the traced model.
  """
  traced = fx.symbolic_trace(model)
  names = layer_names(traced)
  by_name = {layer: node for node, layer in names.items()}
  missing = [c for c in cut_layers if c not in by_name]
  if missing:
    raise ValueError(f"cut layers {missing} are not layers of the model")
  stage_of: Dict[fx.Node, int] = {}
  stage = 0
  cuts = set(cut_layers)
  for node in traced.graph.nodes:
    if node.op in ("placeholder", "output"):
      continue
    stage_of[node] = stage
    if names[node] in cuts:
      stage += 1
  split = split_module(traced, model, lambda node: stage_of[node],
                       keep_original_order=True)
  stages = [getattr(split, f"submod_{k}") for k in range(len(cut_layers) + 1)]
  for stage in stages[1:]:
    _make_input_users_out_of_place(stage)
  return stages


def _make_input_users_out_of_place(stage: fx.GraphModule) -> None:
  """A stage's input arrives as a leaf tensor that needs its gradient
  (the one sent back); an in-place op on it (VGG's ReLU(inplace=True)) is
  an autograd error, so the ops that read it write a new tensor instead."""
  modules = dict(stage.named_modules())
  for placeholder in (n for n in stage.graph.nodes if n.op == "placeholder"):
    for user in placeholder.users:
      if user.op == "call_module" and getattr(modules[user.target],
                                              "inplace", False):
        modules[user.target].inplace = False
      elif user.kwargs.get("inplace"):
        user.update_kwarg("inplace", False)
  stage.recompile()


@dataclasses.dataclass(frozen=True)
class PipelineMesh:
  """This rank's process groups on the pipeline x data-parallel mesh.

  Attributes:
      dims: the validated degrees.
      stage: this rank's pipeline coordinate (its first stage).
      replica: its data-parallel coordinate.
      pipeline_group: the ranks of its data-parallel column, one per stage,
    in stage order (the point-to-point group).
      replica_group: the ranks holding the same stage (the gradient
    all-reduce's group).
  """
  dims: ParallelDims
  stage: int
  replica: int
  pipeline_group: object
  replica_group: object

  @property
  def is_first(self) -> bool:
    return self.stage == 0

  @property
  def is_last(self) -> bool:
    return self.stage == self.dims.pipeline - 1


def build_mesh_groups(dims: ParallelDims, rank: int) -> PipelineMesh:
  """Creates every mesh group (a collective: all ranks call it in order)."""
  dp, pp = dims.data_parallel, dims.pipeline
  pipeline_group = replica_group = None
  # new_group must be called by every rank for every group, same order.
  for replica in range(dp):
    ranks = [stage * dp + replica for stage in range(pp)]
    group = dist.new_group(ranks)
    if rank in ranks:
      pipeline_group = group
  for stage in range(pp):
    ranks = [stage * dp + replica for replica in range(dp)]
    group = dist.new_group(ranks)
    if rank in ranks:
      replica_group = group
  coords = dims.coordinates(rank)
  return PipelineMesh(dims, coords.pipeline, coords.data_parallel,
            pipeline_group, replica_group)


def average_stage_gradients(modules: Sequence[nn.Module], group,
                            replicas: int, *,
                            bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
  """Makes each gradient of these stages its mean over the stage's
  replicas: flat buckets of up to `bucket_mb`, one all-reduce each.

  After the schedule's step every gradient is final, so one bucketed
  all-reduce per step is exact; it does not overlap backward. The runtime
  uses it when asked not to overlap (`overlap_all_reduce=False`), as the
  baseline the overlapped all-reduce (`OverlappedGradientReduce`, which
  says why not DDP) is measured against.
  """
  if replicas == 1:
    return
  grads = [p.grad for m in modules for p in m.parameters()
           if p.grad is not None]
  bucket_bytes = max(1, int(bucket_mb * 2**20))
  bucket: List[torch.Tensor] = []
  size = 0
  for grad in grads + [None]:
    full = grad is None or (bucket and size + grad.numel() *
                            grad.element_size() > bucket_bytes)
    if full and bucket:
      flat = torch.cat([g.reshape(-1) for g in bucket])
      dist.all_reduce(flat, group=group)
      flat /= replicas
      offset = 0
      for g in bucket:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
      bucket, size = [], 0
    if grad is not None:
      bucket.append(grad)
      size += grad.numel() * grad.element_size()


class StandIns:
  """Stand-ins for what one stage's neighbours send it, and the stage's
  GPipe work on them.

  The activations the stage would receive and the gradients it would be
  sent back, for each micro-batch of one batch, made by running every
  stage of the unsplit model on it. On them the stage computes what it
  computes in a GPipe step, the forwards of the M micro-batches and then
  their backwards, without waiting for or sending to a neighbour.

  They are made with every stage in eval mode, so that making them
  changes no BatchNorm statistics: their values differ from the
  training-mode ones, their shapes do not, and a step's cost depends on
  the shapes. On a model without BatchNorm or dropout, the first batch's
  stand-ins are what the neighbours send on it, to the bit.
  """

  def __init__(self, all_stages: Sequence[nn.Module], index: int, *,
               microbatches: int, loss_fn: Callable,
               microbatch_loss: Callable):
    self._all_stages = list(all_stages)
    self._index = index
    self._microbatches = microbatches
    self._loss_fn = loss_fn
    self._microbatch_loss = microbatch_loss
    self._inputs: Optional[List[torch.Tensor]] = None
    self._grads: Optional[List[torch.Tensor]] = None

  @property
  def _is_first(self) -> bool:
    return self._index == 0

  @property
  def _is_last(self) -> bool:
    return self._index == len(self._all_stages) - 1

  def run(self, inputs: torch.Tensor, targets: torch.Tensor,
          losses: Optional[list]) -> None:
    """The stage's forwards, then its backwards, on the stand-ins made
    from this batch the first time (`losses` collects the last stage's
    micro-batch losses, as the schedule's do)."""
    if self._inputs is None:
      self._make(inputs, targets)
    stage = self._all_stages[self._index]
    targets = targets.chunk(self._microbatches)
    outputs = []
    for mb, stand_in in enumerate(self._inputs):
      # A leaf of its own each step: a stage past the first computes the
      # gradient of its input, which it would send back.
      outputs.append(stage(stand_in.detach().requires_grad_(
          not self._is_first)))
      if self._is_last:
        losses.append(self._microbatch_loss(outputs[-1], targets[mb]))
    for mb, output in enumerate(outputs):
      if self._is_last:
        losses[mb].backward()
      else:
        output.backward(self._grads[mb])

  def _make(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    modes = [m.training for m in self._all_stages]
    for module in self._all_stages:
      module.to(inputs.device).eval()
    try:
      self._inputs, self._grads = [], []
      for mb_inputs, mb_targets in zip(inputs.chunk(self._microbatches),
                                       targets.chunk(self._microbatches)):
        with torch.no_grad():
          for module in self._all_stages[:self._index]:
            mb_inputs = module(mb_inputs)
        self._inputs.append(mb_inputs)
        if not self._is_last:
          self._grads.append(self._output_grad(mb_inputs, mb_targets))
    finally:
      for module, training in zip(self._all_stages, modes):
        module.train(training)
      # The other stages are no part of this rank's work.
      for i, module in enumerate(self._all_stages):
        if i != self._index:
          module.to("cpu")

  def _output_grad(self, stage_input: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor:
    """The gradient of the micro-batch's loss at this stage's output."""
    with torch.no_grad():
      output = self._all_stages[self._index](stage_input)
    output.requires_grad_(True)
    later = output
    for module in self._all_stages[self._index + 1:]:
      later = module(later)
    loss = self._loss_fn(later, targets) / self._microbatches
    (grad,) = torch.autograd.grad(loss, output)
    return grad


class PipelineRuntime:
  """This rank's stages under one schedule, with what each step spent.

  Attributes:
      stage_modules: the modules this rank trains (virtual stages: several).
      mesh: this rank's place on the mesh.
      stage_indices: the global indices of those stages.
      split: the plan the stages were cut by (its predictions are zero
    without a profile).
      recorder: bubble, transfer and (with replicas) exposed all-reduce
    intervals per step, and the totals.
      memory: the bytes of tensors this rank's stages saved for backward
    (`SavedTensorMeter`), counted in steps 2 to MEMORY_STEPS + 1.
      stages_apart: every step runs on stand-ins for the neighbours'
    tensors (`StandIns`, --pipeline_stages_apart); otherwise only the
    steps inside `alone()` do.
  """

  def __init__(self, stage_modules: List[nn.Module], schedule,
               mesh: PipelineMesh, stage_indices: List[int], *,
               bucket_mb: float = DEFAULT_BUCKET_MB,
               overlap_all_reduce: bool = True,
               stand_ins: Optional[StandIns] = None,
               stages_apart: bool = False):
    self.stage_modules = stage_modules
    self.schedule = schedule
    self.mesh = mesh
    self.stage_indices = stage_indices
    self.bucket_mb = bucket_mb
    self.split: Optional[partition_lib.StagePlan] = None
    self.has_predictions = False
    replicas = mesh.dims.data_parallel
    self.recorder = pipeline_stats.StageRecorder(
        times_all_reduce=replicas > 1)
    self.timer = P2PTimer(self.recorder)
    self.memory = SavedTensorMeter(stage_state(*stage_modules))
    self._num_steps = 0
    self._stand_ins = stand_ins
    # --pipeline_stages_apart: every step on the stand-ins.
    self.stages_apart = stages_apart
    self._alone = False  # inside alone(): the stage timed by itself
    self._apart = False  # inside apart(): a step of the stages apart
    # With replicas, gradients are all-reduced as the last micro-batch's
    # backward makes them final (overlap_all_reduce), or after the step.
    self.reducer = None
    if replicas > 1 and overlap_all_reduce:
      self.reducer = OverlappedGradientReduce(
          stage_modules, mesh.replica_group, replicas=replicas,
          num_microbatches=schedule._n_microbatches,  # pylint: disable=protected-access
          bucket_mb=bucket_mb)

  @property
  def cut_layers(self) -> List[str]:
    return list(self.split.cuts) if self.split else []

  @property
  def holds_first_stage(self) -> bool:
    return 0 in self.stage_indices

  @property
  def holds_last_stage(self) -> bool:
    return self.mesh.dims.pipeline * self._virtual - 1 in self.stage_indices

  @property
  def _virtual(self) -> int:
    return len(self.stage_indices)

  @property
  def can_run_alone(self) -> bool:
    """Whether this rank's stage can be timed by itself (`alone`)."""
    return self._stand_ins is not None

  @property
  def waits_for_loss(self) -> bool:
    """Whether the step ends in the wait for the last stage's loss
    (`steps.make_pipeline_train_step`); not while the stage is timed
    alone, which is all its own work."""
    return not self._alone

  @contextlib.contextmanager
  def alone(self):
    """Runs the enclosed steps on the stand-ins, without the closing wait
    for the loss and without the replicas' gradient all-reduce: the
    stage's own work, which `reference_step` times before training. (The
    all-reduce's wait is `exposed_comm`; what its buckets cost backward
    beside it is then contention, as under DDP.) What those steps recorded
    is dropped after; the stand-ins stay until `release_stand_ins`."""
    if not self.can_run_alone:
      raise RuntimeError("this pipeline's stages cannot run alone: "
                         "stand-ins cover one stage per rank")
    self._alone = True
    if self.reducer is not None:
      self.reducer.paused = True
    try:
      yield
    finally:
      self._alone = False
      if self.reducer is not None:
        self.reducer.paused = False
      self.recorder.discard_pending()

  @contextlib.contextmanager
  def apart(self):
    """Runs the enclosed steps as --pipeline_stages_apart runs every step:
    this rank's stage on the stand-ins, with the closing wait for the loss
    and the replicas' all-reduce, as in the pipeline
    (--paired_removal=pipeline_waits; every rank's steps apart are the
    same steps, numbered alike). What they record is the step's."""
    if not self.can_run_alone:
      raise RuntimeError("this pipeline's stages cannot run apart: "
                         "stand-ins cover one stage per rank")
    self._apart = True
    try:
      yield
    finally:
      self._apart = False

  def release_stand_ins(self) -> None:
    """Frees the stand-ins and the other stages they were made with,
    where no step will run apart again."""
    if not self.stages_apart:
      self._stand_ins = None

  def step(self, inputs: Optional[torch.Tensor],
             targets: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Forward and backward of one batch over every micro-batch.

    Gradients are left in the stage modules' .grad, averaged over the
    micro-batches (each micro-batch's loss divided by M) and, with
    replicas, over them (`average_stage_gradients`). Waits and transfers
    are recorded in `recorder` for the caller to close the step with.

    Returns:
          On the rank holding the last stage, this batch's mean loss over
          its micro-batches; elsewhere None.
    """
    losses: List[torch.Tensor] = []
    args = (inputs,) if self.holds_first_stage else ()
    kwargs = {}
    if self.holds_last_stage:
      kwargs = dict(target=targets, losses=losses)
    # Not the first step: torch's stages infer shapes with an extra
    # forward there, which no later step runs.
    counting = (self.memory.counting(inputs, targets)
                if 1 <= self._num_steps <= MEMORY_STEPS and not self._alone
                else contextlib.nullcontext())
    if not self._alone:
      self._num_steps += 1
    with counting:
      if self._alone or self._apart or self.stages_apart:
        self._stand_ins.run(inputs, targets, losses)
      else:
        with self.timer.timing():
          self.schedule.step(*args, return_outputs=False, **kwargs)
    if self.mesh.dims.data_parallel > 1 and not self._alone:
      # The step waits here for whatever all-reduce backward did not hide:
      # with the overlap, the buckets still in flight; without it, all.
      start = time.perf_counter()
      if self.reducer is not None:
        self.reducer.finish()
      else:
        average_stage_gradients(self.stage_modules, self.mesh.replica_group,
                                self.mesh.dims.data_parallel,
                                bucket_mb=self.bucket_mb)
      self.recorder.record(pipeline_stats.EXPOSED_COMM, start,
                           time.perf_counter())
    if not self.holds_last_stage:
      return None
    # The micro-batches' losses were divided by M: their sum is the mean.
    return torch.stack([l.detach() for l in losses]).sum()

  def describe(self) -> dict:
    """run.json's strategy.pipeline: the split and this rank's place."""
    return {
        "stages": self.mesh.dims.pipeline,
        "data_parallel": self.mesh.dims.data_parallel,
        "stage_indices": list(self.stage_indices),
        "replica": self.mesh.replica,
        "cut_layers": self.cut_layers,
        "schedule": type(self.schedule).__name__,
        "num_microbatches": self.schedule._n_microbatches,  # pylint: disable=protected-access
        "all_reduce_overlapped": self.reducer is not None,
        "stages_apart": self.stages_apart,
        "measured": {"steps": len(self.recorder.steps)},
    }


def average_stage_buffers(runtime: PipelineRuntime) -> None:
  """Makes every replica's BatchNorm statistics of a stage their mean
  over that stage's replicas (as `Strategy.average_buffers` does over the
  world for a model that is not split)."""
  replicas = runtime.mesh.dims.data_parallel
  if replicas == 1:
    return
  with torch.no_grad():
    for module in runtime.stage_modules:
      for buffer in module.buffers():
        if buffer.is_floating_point():
          dist.all_reduce(buffer, group=runtime.mesh.replica_group)
          buffer /= replicas


def _stage_indices(cfg: PipelineConfig, stage: int) -> List[int]:
  """Virtual stages loop: rank s holds stages s, s + S, s + 2S, ..."""
  return [stage + v * cfg.stages for v in range(cfg.virtual_stages)]


def build_runtime(stage_modules: Sequence[nn.Module], cfg: PipelineConfig,
                  mesh: PipelineMesh, device: torch.device,
                  loss_fn: Callable, *, bucket_mb: float = DEFAULT_BUCKET_MB,
                  overlap_all_reduce: bool = True) -> PipelineRuntime:
  """Keeps this rank's stages and puts them under the configured schedule.

  Args:
      stage_modules: every stage of the model (S * V), from
    `build_stages`.
      cfg: the pipeline configuration (stages, micro-batches, schedule).
      mesh: this rank's groups.
      device: where this rank computes.
      loss_fn: loss_fn(outputs, targets) -> scalar mean loss of one
    micro-batch; the runtime divides it by M, so the M add up to the mean.
      bucket_mb: the replicas' gradient all-reduce bucket.
      overlap_all_reduce: with replicas, all-reduce each bucket as the
    last micro-batch's backward finishes it (`OverlappedGradientReduce`);
    False all-reduces after the schedule's step.
  """
  indices = _stage_indices(cfg, mesh.stage)
  total = cfg.stages * cfg.virtual_stages
  mine = [stage_modules[i].to(device) for i in indices]
  # Imported here, not with this module: it costs about a second of every
  # trainer's start-up (torch.distributed.tensor, dynamo), and only a
  # pipelined run needs it.
  from torch.distributed import pipelining  # pylint: disable=g-import-not-at-top
  stages = [pipelining.PipelineStage(module, i, total, device,
                                     group=mesh.pipeline_group)
            for module, i in zip(mine, indices)]
  schedule_class = getattr(pipelining, _SCHEDULES[cfg.schedule])
  # Each micro-batch's loss is divided by M, so its gradients land in .grad
  # already scaled and the M of them sum to the batch's, as the TensorFlow
  # runtime does; the schedule's own scale_grads would instead divide every
  # gradient by M after the step, one more pass over all of them.
  runtime_box = []

  def microbatch_loss(outputs, targets):
    start = time.perf_counter()
    loss = loss_fn(outputs, targets) / cfg.microbatches
    # Timed apart inside stage_compute: a part of the bubble's causes
    # (`bubble_parts`), only the last stage's.
    runtime_box[0].recorder.record_loss(start, time.perf_counter())
    return loss

  stage_or_stages = (stages if cfg.schedule == "interleaved_1f1b"
                     else stages[0])
  schedule = schedule_class(stage_or_stages, n_microbatches=cfg.microbatches,
                            loss_fn=microbatch_loss, scale_grads=False)
  # Stand-ins cover one stage per rank, which every schedule but the
  # interleaved ones has.
  stand_ins = (StandIns(stage_modules, indices[0],
                        microbatches=cfg.microbatches, loss_fn=loss_fn,
                        microbatch_loss=microbatch_loss)
               if len(indices) == 1 else None)
  runtime = PipelineRuntime(mine, schedule, mesh, indices,
                            bucket_mb=bucket_mb,
                            overlap_all_reduce=overlap_all_reduce,
                            stand_ins=stand_ins,
                            stages_apart=cfg.stages_apart)
  runtime_box.append(runtime)
  return runtime
