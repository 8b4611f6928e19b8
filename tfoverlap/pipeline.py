"""TensorFlow pipeline stages: GPipe micro-batching across devices, in one
tf.function.

TensorFlow 2 has no pipeline-parallel API. This module builds one from what
it has:

- **Stages are sub-models of the model itself.** A functional model is cut
  at the plan's cut layers, where exactly one tensor crosses; stage k is
  `keras.Model(crossing tensor k, crossing tensor k+1)`, built from the
  model's own layer objects. Weights, optimizer slots and checkpoints stay
  the whole model's: a pipelined checkpoint is an unpipelined one.
- **Stage k runs on device k** (GPU k, or logical CPU k on a host without
  GPUs): its forward and its backward are traced under `tf.device`.
- **A GPipe step is one tf.function.** The batch is split into M
  micro-batches; every micro-batch goes forward through every stage, each
  stage under a gradient tape of its own, then backward stage by stage,
  handing the gradient of the crossing tensor to the stage before. Weight
  gradients are summed over micro-batches and applied once, after the
  pipeline has drained. TensorFlow's
  executor runs any op whose inputs are ready, so stage k on micro-batch i
  overlaps stage k+1 on micro-batch i-1: the schedule is the data flow.

On a CPU the logical devices share one thread pool, so the stages overlap
in the graph but hardly in time; on GPUs each device has its own streams.

  cuts = plan_cut_layers(model, cfg, batch_size=8)
  runtime = PipelineRuntime(model, cuts, devices=["/cpu:0", "/cpu:1"],
                         num_microbatches=4)
  train_step = runtime.make_train_step(optimizer, loss_fn)
"""

import statistics
from typing import Callable, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from overlap_core.planning import command as command_lib
from overlap_core.planning import conditions as conditions_lib
from overlap_core.planning import partition as partition_lib
from overlap_core.planning import split as split_lib
from overlap_core.planning.dims import ParallelDims
from overlap_core.planning.profile import Profile
from overlap_core.runtime import pipeline_stats
from overlap_core.runtime.config import (ConfigError, PipelineConfig,
                                         TrainConfig)
from tfoverlap import pipeline_timing, reference_step
from tfoverlap.planning.graph import (build_layer_graph, node_names,
                                      ordered_nodes)

PLAN_PROGRAM = "tfoverlap.plan"
# How the profiles this side writes name their framework (its first word).
PROFILE_FRAMEWORK = "tensorflow"


def stage_conditions(config: TrainConfig, *, num_gpus: Optional[int] = None
                     ) -> conditions_lib.StageConditions:
  """What each stage runs under: one process holds every stage, so a stage
  has that process's intra-op pool (logical CPU devices share it), on
  the first GPUs or the CPU."""
  if num_gpus is None:
    num_gpus = len(tf.config.list_physical_devices("GPU"))
  return command_lib.stage_conditions(
      config, framework=PROFILE_FRAMEWORK, device="gpu" if num_gpus else "cpu",
      num_processes=config.distribute.num_workers)


def check_profile(config: TrainConfig, *,
                  num_gpus: Optional[int] = None) -> str:
  """`command.check_stage_profile` for this run's stages."""
  return command_lib.check_stage_profile(
      config, lambda: stage_conditions(config, num_gpus=num_gpus),
      PLAN_PROGRAM)


def check_pipeline_supported(config: TrainConfig, *,
                             num_gpus: Optional[int] = None) -> None:
  """The pipeline's counts: one device per stage (`ParallelDims.for_run`),
  and a usable profile.

  Which features combine with stages is the compatibility table's
  (`overlap_core.runtime.compat_table`, checked first by the trainer).

  Raises:
    ConfigError: naming the flag, the value and why.
  """
  cfg = config.pipeline
  if cfg.stages == 1:
    check_profile(config)
    return
  ParallelDims.from_config(config, "tensorflow")
  check_profile(config, num_gpus=num_gpus)


def plan_split(model: keras.Model, cfg: PipelineConfig, *,
               batch_size: int, profile: Optional[Profile] = None,
               name: str = "") -> partition_lib.StagePlan:
  """The S stages of the flags' split (`split.plan_split`), on the Keras
  layer graph read at `batch_size` (the micro-batch).

  Raises:
    ConfigError: naming pipeline_split (or plan_profile), for a split the
      graph or the profile cannot take.
  """
  if cfg.split == "auto" and profile is None:
    raise ConfigError("pipeline_split", "auto", split_lib.AUTO_NEEDS_PROFILE)
  graph = build_layer_graph(model, batch_size=batch_size, name=name)
  return split_lib.plan_split(graph, cfg, microbatch_size=batch_size,
                              profile=profile,
                              framework=PROFILE_FRAMEWORK)


def plan_cut_layers(model: keras.Model, cfg: PipelineConfig, *,
                    batch_size: int, name: str = "") -> List[str]:
  """The layers the first S - 1 stages end with (no profile)."""
  return list(plan_split(model, cfg, batch_size=batch_size, name=name).cuts)


def build_stages(model: keras.Model,
                 cut_layers: Sequence[str]) -> List[keras.Model]:
  """The model as len(cut_layers) + 1 stage sub-models, in order.

  Each stage is built from the model's own layers (shared, not copied), so
  its variables are the model's.

  Raises:
    ValueError: a model with other than one input and one output, or a
      cut layer that is not a layer of the model, or not a place where
      exactly one tensor crosses.
  """
  num_inputs = len(getattr(model, "inputs", None) or ())
  num_outputs = len(getattr(model, "outputs", None) or ())
  if num_inputs != 1 or num_outputs != 1:
    # A stage hands one tensor to the next; the first stage would drop all
    # inputs but one, the last all outputs but one.
    raise ValueError(f"Invalid value for argument `model`. Received: "
                     f"{model.name!r} with {num_inputs} inputs and "
                     f"{num_outputs} outputs; allowed: a functional model "
                     "with one input and one output")
  nodes = ordered_nodes(model)
  names = node_names(nodes)
  by_name = {names[id(node)]: node for node in nodes}
  missing = [c for c in cut_layers if c not in by_name]
  if missing:
    raise ValueError(f"cut layers {missing} are not layers of the model")
  graph = build_layer_graph(model, batch_size=1)
  cuts = set(graph.cut_points())
  bad = [c for c in cut_layers if graph.index(c) not in cuts]
  if bad:
    raise ValueError(f"cut layers {bad} are not cut points: more than one "
                     "tensor crosses after them")
  order = sorted(cut_layers, key=graph.index)
  if list(order) != list(cut_layers) or len(set(order)) != len(order):
    raise ValueError(f"cut layers {list(cut_layers)} must be distinct and "
                     "in model order")
  bounds = ([model.inputs[0]] + [by_name[c].outputs[0] for c in cut_layers] +
            [model.outputs[0]])
  return [keras.Model(bounds[k], bounds[k + 1], name=f"{model.name}_stage{k}")
          for k in range(len(bounds) - 1)]


class PipelineRuntime:
  """A model's stages on their devices, and the GPipe step over them (the
  same job as `torch_parity.pipeline.PipelineRuntime`, whose schedule is
  chosen by --pipeline_schedule).

  Attributes:
    model: the whole model; its variables are the stages' variables.
    stages: the stage sub-models, in order.
    devices: stage k runs on devices[k].
    cut_layers: the layers stages 0..S-2 end with.
    num_microbatches: M, micro-batches per step.
    recorders: per stage, the phases of every step (`record_step`).
  """

  def __init__(self, model: keras.Model, cut_layers: Sequence[str], *,
               devices: Sequence[str], num_microbatches: int):
    if len(devices) != len(cut_layers) + 1:
      raise ValueError(f"Invalid value for argument `devices`. Received: "
                       f"{list(devices)}; allowed: one device per stage "
                       f"({len(cut_layers) + 1})")
    if num_microbatches < 1:
      raise ValueError(f"Invalid value for argument `num_microbatches`. "
                       f"Received: {num_microbatches}; allowed: >= 1")
    self.model = model
    self.cut_layers = list(cut_layers)
    self.stages = build_stages(model, cut_layers)
    self.devices = list(devices)
    self.num_microbatches = num_microbatches
    self.recorders = [pipeline_stats.StageRecorder() for _ in self.stages]
    index = {id(v): i for i, v in enumerate(model.trainable_variables)}
    self._variable_index = [[index[id(v)] for v in stage.trainable_variables]
                            for stage in self.stages]
    self._stage_s: Optional[List[float]] = None
    self._transfer_s: Optional[List[float]] = None
    self._update_s: Optional[List[float]] = None
    # The plan the stages were cut by, set when a profile predicted it:
    # run.json puts its stage times beside the measured ones.
    self.predicted_by: Optional[partition_lib.StagePlan] = None
    # Whether every step runs the stages on stand-ins for their
    # neighbours' tensors (`StandIns`); only the processes runtime does.
    self.stages_apart = False

  @property
  def can_run_alone(self) -> bool:
    """Whether each stage can be timed by itself before training, for the
    contention phase (`pipeline_processes.ProcessPipelineRuntime.alone`).
    Not here: this runtime's stage_compute is its stages timed alone
    already (`measure_stages`), so there is nothing beyond it to carve."""
    return False

  @property
  def num_stages(self) -> int:
    return len(self.stages)

  def stage_layers(self) -> List[List[str]]:
    """Per stage, the names of the layers it runs."""
    return [list(node_names(ordered_nodes(stage)).values())
            for stage in self.stages]

  def forward_backward(self, inputs, targets, loss_fn: Callable, *,
                       return_outputs: bool = False,
                       stamps: Optional[List[List]] = None,
                       stand_ins: Optional["StandIns"] = None,
                       crossings: Optional["Crossings"] = None,
                       stage_indices: Optional[Sequence[int]] = None
                       ) -> Tuple:
    """The GPipe schedule of one batch, for use inside a tf.function.

    Args:
      inputs, targets: the batch; its size must divide by M.
      loss_fn: (targets, outputs) -> the scalar loss of one micro-batch,
        scaled so that the micro-batches' losses add up to the batch's.
      stamps: None, or one list per stage, to which each forward and
        backward of a micro-batch appends its (begin, end) `tf.timestamp`
        pair, taken on the stage's device (`_stamp`).
      stand_ins: None, or the stages run apart: every stage but the first
        takes its input from `stand_ins`, every stage but the last its
        output's gradient, so that no stage waits for another.
      crossings: None, or where each micro-batch's crossing activations
        and gradients are gathered (`make_stand_ins`).
      stage_indices: None (every stage), or the only stages whose work is
        traced: on `stand_ins`, a stage timed alone
        (`pipeline_processes.ProcessPipelineRuntime.alone`).

    Returns:
      (the batch's loss, gradients aligned with model.trainable_variables,
      summed over the micro-batches), and the model's outputs for the
      batch third when `return_outputs`. Where `stage_indices` leaves a
      stage out, its gradients are zeros, and the loss is None without
      the last stage.

    Raises:
      ValueError: `stage_indices` without `stand_ins` (a stage's input is
        its neighbour's output), or with `return_outputs`.
    """
    if stage_indices is not None and (stand_ins is None or return_outputs):
      raise ValueError(f"Invalid value for argument `stage_indices`. "
                       f"Received: {list(stage_indices)}; allowed: None, "
                       "or a subset of the stages with stand_ins and "
                       "without return_outputs")
    runs = (set(range(self.num_stages)) if stage_indices is None
            else set(stage_indices))
    micro_inputs = tf.split(inputs, self.num_microbatches)
    micro_targets = tf.split(targets, self.num_microbatches)
    held = stand_ins.split(self) if stand_ins is not None else None
    forwards = [self._forward(x, y, loss_fn, stamps,
                              held and held.activations[i], crossings, runs)
                for i, (x, y) in enumerate(zip(micro_inputs, micro_targets))]
    chains = [chain for chain, _ in forwards]
    sums: List = [None] * len(self.model.trainable_variables)
    for i, chain in enumerate(chains):
      self._backward(chain, sums, stamps, held and held.gradients[i],
                     crossings)
    grads = [tf.zeros_like(v) if g is None else g
             for g, v in zip(sums, self.model.trainable_variables)]
    loss = (tf.add_n([chain[-1][2] for chain in chains])
            if self.num_stages - 1 in runs else None)
    if return_outputs:
      return loss, grads, tf.concat([out for _, out in forwards], axis=0)
    return loss, grads

  def _stamp(self, k: int, tensors) -> tf.Tensor:
    """A timestamp on stage k's device once `tensors` exist. These chain
    in traced order across stages (`stamp_after`); a runtime whose stages
    must not wait on each other's stamps gives each its own clock
    (`pipeline_processes.ProcessPipelineRuntime`)."""
    del k
    return stamp_after(tensors)

  def _forward(self, x, y, loss_fn, stamps=None, held_inputs=None,
               crossings=None, runs=None):
    """One micro-batch through every stage: (tape, input, output) per
    stage (the last one's output is the loss), and the model's output.
    `held_inputs[k - 1]`, where given, is stage k's input in place of
    stage k - 1's output. A stage not in `runs` (None: all) is left out,
    None in the chain."""
    chain, h, outputs = [], x, None
    last = self.num_stages - 1
    activations = []
    for k, stage in enumerate(self.stages):
      if k:
        activations.append(h)
        if held_inputs is not None:
          h = held_inputs[k - 1]
      if runs is not None and k not in runs:
        chain.append(None)
        h = None
        continue
      with tf.device(self.devices[k]):
        if stamps is not None:
          begin = self._stamp(k, [h])
          h = after(begin, h)
        with tf.GradientTape() as tape:
          if k:
            tape.watch(h)
          out = stage(h, training=True)
          if k == last:
            outputs, out = out, loss_fn(y, out)
        if stamps is not None:
          stamps[k].append((begin, self._stamp(k, [out])))
      chain.append((tape, h, out))
      h = out
    if crossings is not None:
      crossings.activations.append(activations)
    return chain, outputs

  def _backward(self, chain, sums: List, stamps=None, held_gradients=None,
                crossings=None) -> None:
    """Gradients stage by stage, last first, each on its stage's device.
    `held_gradients[k]`, where given, is the gradient of stage k's output
    in place of stage k + 1's."""
    upstream = None
    gradients = [None] * (self.num_stages - 1)
    for k in reversed(range(self.num_stages)):
      if k < self.num_stages - 1:
        gradients[k] = upstream
        if held_gradients is not None:
          upstream = held_gradients[k]
      if chain[k] is None:
        # Left out: the stage before takes its held gradient instead.
        upstream = None
        continue
      tape, stage_input, out = chain[k]
      variables = self.stages[k].trainable_variables
      sources = list(variables) + ([stage_input] if k else [])
      with tf.device(self.devices[k]):
        # The last stage's backward can start once its loss exists; the
        # others', once the gradient from the stage after has arrived.
        if stamps is not None:
          begin = self._stamp(k, [out if upstream is None else upstream])
          # The same gradient; starting from it orders the backward after
          # the stamp.
          upstream = after(begin, tf.ones_like(out) if upstream is None
                           else upstream)
        grads = tape.gradient(out, sources, output_gradients=upstream)
        for i, g in zip(self._variable_index[k], grads[:len(variables)]):
          if g is not None:
            sums[i] = g if sums[i] is None else sums[i] + g
        if stamps is not None:
          done = [sums[i] for i in self._variable_index[k]
                  if sums[i] is not None]
          stamps[k].append(
              (begin, self._stamp(k, done + grads[len(variables):])))
      upstream = grads[-1] if k else None
    if crossings is not None:
      crossings.gradients.append(gradients)

  def make_train_step(self, optimizer: keras.optimizers.Optimizer,
                      loss_fn: Callable):
    """train_step((inputs, targets)) -> loss: one GPipe step, one update."""

    @tf.function
    def train_step(batch):
      inputs, targets = batch
      loss, grads = self.forward_backward(inputs, targets, loss_fn)
      optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
      return loss

    return train_step

  def measure_stages(self, example_inputs, example_targets,
                     loss_fn: Callable, *,
                     optimizer: Optional[keras.optimizers.Optimizer] = None,
                     repeats: int = 3) -> None:
    """Times every stage and cut alone (`pipeline_timing.time_stages`),
    and with `optimizer` each stage's update (`time_updates`);
    `record_step` splits each step's span with these times. Without an
    optimizer the update is left in the derived bubble."""
    self._stage_s, self._transfer_s = pipeline_timing.time_stages(
        self, example_inputs, example_targets, loss_fn, repeats=repeats)
    self._update_s = (None if optimizer is None else
                      pipeline_timing.time_updates(self, optimizer,
                                                   repeats=repeats))

  def stage_seconds(self) -> Tuple[List[float], List[float]]:
    """Per stage, (compute, transfer) seconds of one step: M times one
    micro-batch's, as `measure_stages` timed them, the compute with the
    stage's update when it was timed."""
    if self._stage_s is None:
      raise RuntimeError("measure_stages() has not run")
    m = self.num_microbatches
    update_s = self.update_seconds() or [0.0] * self.num_stages
    return ([m * s + u for s, u in zip(self._stage_s, update_s)],
            [m * s for s in self._transfer_s])

  def update_seconds(self) -> Optional[List[float]]:
    """Per stage, the seconds of its update in a step, or None when
    `measure_stages` was given no optimizer."""
    return None if self._update_s is None else list(self._update_s)

  def record_step(self, start_s: float, end_s: float
                  ) -> List[Tuple[str, float, float]]:
    """Records one step's compute span per stage; returns the ledger's
    three phases partitioning it (the mean stage's view).

    Each stage's step is taken as the schedule implies: its own compute
    (measured alone, the update included when timed) first, then its
    transfers (measured alone), waiting for the rest of the span (derived).
    """
    compute_s, transfer_s = self.stage_seconds()
    update_s = self.update_seconds()
    for k, recorder in enumerate(self.recorders):
      for interval in _derived_intervals(start_s, end_s, compute_s[k],
                                         transfer_s[k]):
        recorder.record(*interval)
      if update_s is not None:
        # Its duration is what counts (a part of stage_compute); the
        # update runs at the step's end, after the pipeline drains.
        recorder.record_update(end_s - update_s[k], end_s)
      recorder.end_step(start_s, end_s)
    return pipeline_stats.partition_span(start_s, end_s, _derived_intervals(
        start_s, end_s, statistics.mean(compute_s),
        statistics.mean(transfer_s)))

  # run.json's pipeline.runtime: the stages are this process's devices.
  RUNTIME = "devices"

  def _times_update(self) -> bool:
    """Whether each stage's update is in its measured compute."""
    return self._update_s is not None

  def _sources(self) -> dict:
    """Which figures of run.json's section are measured, which derived."""
    return dict(pipeline_timing.MEASUREMENT_SOURCES if self._times_update()
                else pipeline_timing.SOURCES_WITHOUT_UPDATE)

  def describe(self, cfg: PipelineConfig, *, skip_steps: int = 0) -> dict:
    """run.json's `pipeline` section, with `runtime` (where the stages
    ran) and `sources`: which figures are measured and which derived."""
    per_stage = []
    # The measured compute holds the update only where it was timed; the
    # prediction it is held against does the same.
    with_update = self._times_update()
    for k, layers in enumerate(self.stage_layers()):
      predicted_ms, predicted_update_ms, predicted_mb = (
          split_lib.stage_predictions(
              self.predicted_by.stages[k:k + 1] if self.predicted_by else (),
              num_microbatches=self.num_microbatches,
              with_update=with_update))
      per_stage.append(pipeline_stats.stage_entry(
          k, layers=layers, device=self.devices[k],
          medians_ms=self.recorders[k].medians_ms(skip_steps),
          predicted_ms=predicted_ms,
          predicted_update_ms=(predicted_update_ms if with_update
                               else None),
          predicted_memory_mb=predicted_mb))
    section = pipeline_stats.pipeline_section(
        schedule=cfg.schedule, stages=self.num_stages,
        micro_batches=self.num_microbatches,
        virtual_stages=cfg.virtual_stages, replicas=1, split=cfg.split,
        cut_layers=self.cut_layers, per_stage=per_stage)
    section["runtime"] = self.RUNTIME
    section["sources"] = self._sources()
    section["stages_apart"] = self.stages_apart
    return section


class Crossings:
  """Per micro-batch, the tensors that crossed each cut in one traced
  step: `activations[i][c]`, cut c's output going forward, and
  `gradients[i][c]`, its gradient coming back."""

  def __init__(self):
    self.activations: List[List[tf.Tensor]] = []
    self.gradients: List[List[tf.Tensor]] = []


class StandIns:
  """Resident copies of what crosses each cut, for stages run apart
  (--pipeline_stages_apart): cut c's activations of the M micro-batches
  as one variable on the stage after it, their gradients as one on the
  stage before it, taken from one real step on the example batch
  (`make_stand_ins`).

  A stage apart computes the same forwards and backwards as in the
  pipeline, on these instead of its neighbours' tensors, so it neither
  waits for them nor receives them: what the pipeline's step loses to
  waiting is the difference. Each micro-batch keeps a copy of its own, so
  no two of a stage's forwards see the same input, which TensorFlow
  could fold into one.
  """

  def __init__(self, activations: Sequence[tf.Variable],
               gradients: Sequence[tf.Variable]):
    self._activations = list(activations)
    self._gradients = list(gradients)

  def split(self, runtime: "PipelineRuntime") -> Crossings:
    """The stand-ins as `runtime`'s micro-batches (in a tf.function), each
    read on the stage that takes it."""
    m, devices = runtime.num_microbatches, runtime.devices
    held = Crossings()
    per_cut_acts, per_cut_grads = [], []
    for c, (act, grad) in enumerate(zip(self._activations, self._gradients)):
      with tf.device(devices[c + 1]):
        per_cut_acts.append(tf.split(act.read_value(), m))
      with tf.device(devices[c]):
        per_cut_grads.append(tf.split(grad.read_value(), m))
    held.activations = [list(a) for a in zip(*per_cut_acts)]
    held.gradients = [list(g) for g in zip(*per_cut_grads)]
    return held


def make_stand_ins(runtime: PipelineRuntime, inputs, targets,
                   loss_fn: Callable) -> StandIns:
  """What crosses each cut in a step on (inputs, targets), held on the
  stages that take it. The step applies no gradient, and the variables
  its forward moves (BatchNorm's statistics, dropout's seed states) are
  put back after."""

  @tf.function
  def crossing_tensors(inputs, targets):
    crossings = Crossings()
    runtime.forward_backward(inputs, targets, loss_fn, crossings=crossings)
    return ([tf.concat(cut, 0) for cut in zip(*crossings.activations)],
            [tf.concat(cut, 0) for cut in zip(*crossings.gradients)])

  before = [v.numpy() for v in runtime.model.variables]
  activations, gradients = crossing_tensors(inputs, targets)
  for variable, value in zip(runtime.model.variables, before):
    variable.assign(value)
  # The first step must not read statistics not yet put back.
  reference_step.wait_for_assigns(runtime.model.variables)
  devices = runtime.devices
  held_activations, held_gradients = [], []
  for c, (act, grad) in enumerate(zip(activations, gradients)):
    with tf.device(devices[c + 1]):
      held_activations.append(tf.Variable(act, trainable=False,
                                          name=f"stand_in_activation_{c}"))
    with tf.device(devices[c]):
      held_gradients.append(tf.Variable(grad, trainable=False,
                                        name=f"stand_in_gradient_{c}"))
  return StandIns(held_activations, held_gradients)


def stamp_after(tensors) -> tf.Tensor:
  """`tf.timestamp()` taken, on the current device, once `tensors` exist.

  Inside a `tf.function`, automatic control dependencies also chain it
  after every stateful op traced before it that takes no resource (other
  stamps among them): where the work of several devices is ordered after
  their stamps, that chain orders their work too. Stage processes take
  their stamps from `pipeline_processes.StageClock` instead."""
  with tf.control_dependencies([t for t in tensors if t is not None]):
    return tf.timestamp()


def after(stamp: tf.Tensor, tensor: tf.Tensor) -> tf.Tensor:
  """`tensor`, for ops that must not start before `stamp` was taken: the
  executor may run a ready timestamp after the work ready beside it."""
  with tf.control_dependencies([stamp]):
    return tf.identity(tensor)


def _derived_intervals(start_s: float, end_s: float, compute_s: float,
                       transfer_s: float) -> List[Tuple[str, float, float]]:
  """A stage's transfer and bubble intervals within a step's span."""
  transfer_start_s = start_s + compute_s
  bubble_start_s = transfer_start_s + transfer_s
  return [(pipeline_stats.TRANSFER, transfer_start_s, bubble_start_s),
          (pipeline_stats.BUBBLE, bubble_start_s, end_s)]
