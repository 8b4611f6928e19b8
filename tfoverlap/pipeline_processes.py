"""TensorFlow pipeline stages as separate processes, driven by one client.

On a CPU the devices runtime (`tfoverlap.pipeline`) puts its stages on
logical devices of one process, which share one thread pool: the stages
overlap in the graph but hardly in time. Here each stage is a TensorFlow
server process of its own, with its own threads:

- **A cluster of one client and S stage servers.** Stage k's server is task
  k of job "worker"; the client, which runs the training loop, data and
  checkpoints, is job "chief". The client connects to the cluster
  (`tf.config.experimental_connect_to_cluster`) and traces the same GPipe
  step as the devices runtime, with stage k under
  `tf.device("/job:worker/replica:0/task:k")`: TensorFlow cuts the step into
  one partition per task, and each server's executor runs its own. A
  micro-batch's activation and its gradient travel between tasks as
  TensorFlow's send/recv.
- **Stage k's variables live on task k** (and the optimizer's slots beside
  them, so the update of stage k runs there too); they stay the whole
  model's Keras variables, so a checkpoint has the names of an unpipelined
  one.
- **The bubble is measured.** `tf.timestamp()` ops on each stage's task,
  ordered by control dependencies, stamp when the step started there, when
  each micro-batch's input (or incoming gradient) arrived and its output
  (or outgoing gradient) existed, and the update; the step returns them,
  and each stage's busy time is their union, the rest of the step's span
  its bubble (`MEASURED_SOURCES`).
- **Each stage can be timed alone** (`alone`): before training, the
  trainer runs each stage's own work of a step on stand-ins for its
  neighbours' tensors, one stage at a time, the other servers idle
  (`reference_step.calibrate`), and times it by the same stamps; a
  stage's busy time in training beyond that is contention.

  cluster = cluster_lib.pipeline_cluster_from_env(os.environ)
  connect_client(cluster, intra_op_threads=1, inter_op_threads=1)
  runtime = ProcessPipelineRuntime(model, cuts, num_microbatches=4)
  optimizer.build(model.trainable_variables)   # slots beside the stages
  train_step = runtime.make_train_step(optimizer, loss_fn)
"""

import contextlib
import socket
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from overlap_core.runtime import cluster as cluster_lib
from overlap_core.runtime import pipeline_stats
from overlap_core.runtime.config import ConfigError
from tfoverlap import pipeline as pipeline_lib

CLIENT_JOB = "chief"
STAGE_JOB = "worker"
RUNTIME = "processes"
# How often a stage server looks whether its client is still there.
CLIENT_POLL_S = 0.5

MEASURED_SOURCES = {
    pipeline_stats.STAGE_COMPUTE:
        "measured: the union of the stage's busy intervals in each step, "
        "from tf.timestamp() ops on the stage's own process: each "
        "micro-batch's forward from its input's arrival to its output, each "
        "backward from the incoming gradient's arrival to the outgoing one "
        "and the summed weight gradients, and the stage's update",
    pipeline_stats.UPDATE:
        "measured: tf.timestamp() on the stage's process from its last "
        "weight gradient to its variables read back after the update",
    pipeline_stats.TRANSFER:
        "not timed apart: TensorFlow's send does not block the sender, and "
        "the time an activation or gradient is in flight is the receiver's "
        "wait, in its bubble",
    pipeline_stats.BUBBLE:
        "measured: the step's span less the stage's busy intervals; the "
        "stages' clocks are taken to agree (one host, or NTP) and aligned "
        "with the client's where the first stage started the step (the "
        "client's dispatch of the step counts as idle). Where the stages "
        "share cores, what removing the waits saves is the bubble and the "
        "change in contention together: run apart, the stages compute side "
        "by side and slow each other. Each stage is timed alone before "
        "training, one stage at a time, on stand-ins for its neighbours' "
        "tensors, and its stage_compute beyond that is contention, in the "
        "pipeline and apart alike (BENCHMARKS §17)",
}


def stage_devices(num_stages: int) -> List[str]:
  """Where stage k runs: task k of the stage servers' job."""
  return [f"/job:{STAGE_JOB}/replica:0/task:{k}" for k in range(num_stages)]


def _session_config(intra_op_threads: int, inter_op_threads: int):
  return tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=intra_op_threads,
      inter_op_parallelism_threads=inter_op_threads)


def check_cluster(found: Optional[cluster_lib.PipelineCluster],
                  num_stages: int) -> cluster_lib.PipelineCluster:
  """The cluster, if it has one server per stage.

  Raises:
    ConfigError: naming --pipeline_runtime, without a cluster or for one
      of another size.
  """
  if found is None:
    raise ConfigError(
        "pipeline_runtime", RUNTIME,
        "needs its stage servers: start it with python -m tfoverlap.launch, "
        'or give every process TF_CONFIG with one "chief" (this client) and '
        f"{num_stages} \"worker\" (the stages), or run an srun step of "
        f"{num_stages + 1} tasks")
  if len(found.stages) != num_stages:
    raise ConfigError(
        "pipeline_runtime", RUNTIME,
        f"the cluster ({found.source}) has {len(found.stages)} stage "
        f"server(s) for --pipeline_stages={num_stages}; allowed: one per "
        "stage")
  return found


def serve_stage(found: cluster_lib.PipelineCluster, *,
                intra_op_threads: int, inter_op_threads: int) -> None:
  """Runs stage `found.stage_index`'s server until the client has come and
  gone.

  A TensorFlow server never stops by itself; the client's own server
  (started when it connects) is what tells a stage that the job is over.
  """
  server = tf.distribute.Server(
      tf.train.ClusterSpec(found.cluster_spec()), job_name=STAGE_JOB,
      task_index=found.stage_index,
      config=_session_config(intra_op_threads, inter_op_threads),
      start=True)
  del server  # it serves on TensorFlow's threads until the process exits
  seen = False
  while True:
    up = _listening(found.client)
    if seen and not up:
      return
    seen = seen or up
    time.sleep(CLIENT_POLL_S)


def _listening(address: str) -> bool:
  host, port = address.rsplit(":", 1)
  try:
    with socket.create_connection((host.strip("[]"), int(port)),
                                  timeout=CLIENT_POLL_S):
      return True
  except OSError:
    return False


def connect_client(found: cluster_lib.PipelineCluster, *,
                   intra_op_threads: int, inter_op_threads: int) -> None:
  """Makes this process the cluster's client; before any TensorFlow op.

  Ops stay on this process unless placed on a stage
  (make_master_device_default=False): the data, the loss's sum and the
  checkpoints are the client's.
  """
  if intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
  if inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(found.cluster_spec()), task_type=CLIENT_JOB,
      task_id=0, rpc_layer="grpc")
  tf.config.experimental_connect_to_cluster(
      resolver, job_name=CLIENT_JOB, task_index=0,
      make_master_device_default=False)


def place_stage_variables(stages: Sequence[keras.Model],
                          devices: Sequence[str]) -> None:
  """Moves each stage's variables (weights, BatchNorm statistics, seed
  states) to its device, values kept.

  Keras creates a variable where the model is built, and the model is
  built whole before the plan can cut it; each Keras variable is given a
  new TensorFlow variable on its stage's device, so its name, path and
  the objects that track it (layers, checkpoints) stay the same. Build the
  optimizer after: its slots are made beside their variables.
  """
  for stage, device in zip(stages, devices):
    with tf.device(device):
      for variable in stage.variables:
        old = variable.value
        # Keras 3 keeps a variable's TensorFlow variable in `_value` and
        # has no public way to re-home it.
        variable._value = tf.Variable(  # pylint: disable=protected-access
            old, trainable=old.trainable, name=old.name.split(":")[0])


def _busy_intervals(vector: np.ndarray, shift_s: float = 0.0
                    ) -> List[Tuple[float, float]]:
  """A stage's (begin, end) busy intervals from the vector its step
  returns (the step's start there, then a (begin, end) pair per forward,
  backward and the update), shifted by `shift_s` onto the client's clock."""
  return [(float(b) + shift_s, float(e) + shift_s)
          for b, e in vector[1:].reshape(-1, 2)]


class StageClock:
  """Timestamps on one stage's task, ordered among that stage's alone.

  A `tf.timestamp` traced in a `tf.function` is chained by automatic
  control dependencies after every earlier stateful op that takes no
  resource, whatever its device. The step orders each micro-batch's work
  on a stage after the stamp that opens it, so with plain stamps the
  stages' work followed one global trace order: stage 0 could not start
  micro-batch k + 1 before stage 1 had finished micro-batch k, and the
  stages took turns. Here each stamp is a call of a small function that
  reads a variable on the stage's task: a call that takes a resource is
  ordered only against other uses of that resource, so a stage's stamps
  keep their own order and no other stage waits on them.
  """

  def __init__(self, device: str):
    with tf.device(device):
      self._probe = tf.Variable(0.0, trainable=False, name="stage_clock")

    @tf.function(autograph=False)
    def stamp(probe, tensors):
      with tf.control_dependencies(list(tensors) + [probe.read_value()]):
        return tf.timestamp()

    self._stamp = stamp

  def __call__(self, tensors) -> tf.Tensor:
    """A timestamp once `tensors` exist (on the stage's task, where the
    caller's device scope puts it)."""
    return self._stamp(self._probe, [t for t in tensors if t is not None])


class ProcessPipelineRuntime(pipeline_lib.PipelineRuntime):
  """`PipelineRuntime` with stage k in stage server k, its bubble measured
  (the devices runtime derives it from stages timed alone), and each
  stage able to run alone (`alone`) for the contention phase.

  Args:
    model, cut_layers, num_microbatches: as `PipelineRuntime`'s.
    stages_apart: every step runs the stages on stand-ins for their
      neighbours' tensors (`pipeline.StandIns`, --pipeline_stages_apart),
      made from the example batch `measure_stages` is given. Only here:
      the devices runtime derives its bubble from stages timed alone, so
      stages apart would check the derivation against itself, where here
      each stage's waits are stamped on its own process.
  """

  def __init__(self, model: keras.Model, cut_layers: Sequence[str], *,
               num_microbatches: int, stages_apart: bool = False):
    super().__init__(model, cut_layers,
                     devices=stage_devices(len(cut_layers) + 1),
                     num_microbatches=num_microbatches)
    place_stage_variables(self.stages, self.devices)
    self._clocks = [StageClock(device) for device in self.devices]
    self._last_stamps: Optional[List[np.ndarray]] = None
    self.stages_apart = stages_apart
    self._stand_ins: Optional[pipeline_lib.StandIns] = None
    # What `measure_stages` was given, for stand-ins made on first need.
    self._example: Optional[tuple] = None
    self._alone_stage: Optional[int] = None  # inside alone(): that stage
    self._alone_steps: Dict[int, Callable] = {}  # traced on first use
    self._alone_stamps: Optional[np.ndarray] = None

  @property
  def can_run_alone(self) -> bool:
    """Every stage can be timed by itself (`alone`): one client holds the
    stand-ins of them all."""
    return True

  @contextlib.contextmanager
  def alone(self, stage: int):
    """Runs the enclosed steps of `make_train_step`'s function as stage
    `stage`'s own work alone: its forwards and backwards on stand-ins for
    its neighbours' tensors, and its update, with no other stage's work,
    which `reference_step` times before training (`alone_seconds`).
    PyTorch's `alone()` takes no stage: a rank holds one; here one client
    drives every stage, one at a time. The stand-ins are made on first
    need, from the example batch of `measure_stages`, and stay until
    `release_stand_ins`.

    Raises:
      ValueError: a stage that is not one of this pipeline's.
    """
    if not 0 <= stage < self.num_stages:
      raise ValueError(f"Invalid value for argument `stage`. Received: "
                       f"{stage}; allowed: 0 to {self.num_stages - 1}")
    self._make_stand_ins()
    self._alone_stage = stage
    try:
      yield
    finally:
      self._alone_stage = None
      self._alone_stamps = None

  def alone_seconds(self) -> float:
    """The stage's busy time in the last step run `alone`, by its stamps
    on its own process, as `record_step` takes a stage's stage_compute."""
    if self._alone_stamps is None:
      raise RuntimeError("alone_seconds() before a step run alone")
    return pipeline_stats.busy_seconds(_busy_intervals(self._alone_stamps))

  def release_stand_ins(self) -> None:
    """Frees the stand-ins and the steps run alone on them, where no step
    will run apart again."""
    self._alone_steps.clear()
    if not self.stages_apart:
      self._stand_ins = None

  def _make_stand_ins(self) -> None:
    if self._stand_ins is not None:
      return
    if self._example is None:
      raise RuntimeError("stand-ins before measure_stages() gave the "
                         "example batch")
    self._stand_ins = pipeline_lib.make_stand_ins(self, *self._example)

  def _stamp(self, k: int, tensors) -> tf.Tensor:
    """Stage k's stamps come from its own clock (`StageClock`)."""
    return self._clocks[k](tensors)

  def make_train_step(self, optimizer: keras.optimizers.Optimizer,
                      loss_fn: Callable, *, apart: bool = False):
    """train_step((inputs, targets)) -> loss: one GPipe step, one update;
    keeps the step's stamps for `record_step`.

    Each stage returns one vector: the step's start on its process, then
    (begin, end) of every forward and backward of a micro-batch, then of
    its update. Inside `alone(k)` the step is stage k's work alone
    (`alone_seconds`), and returns None unless k is the last stage.

    Args:
      apart: every stage's work on the stand-ins, as under
        --pipeline_stages_apart, for the blocks of
        --paired_removal=pipeline_waits (PyTorch's rank runs its stage
        apart in `PipelineRuntime.apart`).
    """
    self._alone_steps.clear()  # traced with another optimizer, if any
    if apart:
      self._make_stand_ins()

    def make_stamped_step(stage_indices: Optional[Sequence[int]],
                          whole_step_apart: bool):
      """The step of `stage_indices`' work alone on the stand-ins, or of
      every stage (None), apart on them or not."""
      runs = (range(self.num_stages) if stage_indices is None
              else stage_indices)
      # Stand-ins made for a stage alone are not the whole step's input
      # unless the stages run apart.
      on_stand_ins = stage_indices is not None or whole_step_apart
      stand_ins = self._stand_ins if on_stand_ins else None
      if on_stand_ins and stand_ins is None:
        # Without them the step would run the pipeline, silently.
        raise RuntimeError("a step apart before its stand-ins were made")

      @tf.function
      def stamped_step(batch):
        inputs, targets = batch
        starts = {}
        for k in runs:
          with tf.device(self.devices[k]):
            starts[k] = self._stamp(k, [])
        stamps = [[] for _ in self.stages]
        loss, grads = self.forward_backward(inputs, targets, loss_fn,
                                            stamps=stamps,
                                            stand_ins=stand_ins,
                                            stage_indices=stage_indices)
        update_begins = {}
        for k in runs:
          with tf.device(self.devices[k]):
            update_begins[k] = self._stamp(
                k, [grads[i] for i in self._variable_index[k]])
        variables = self.model.trainable_variables
        pairs = (list(zip(grads, variables)) if stage_indices is None else
                 [(grads[i], variables[i]) for k in runs
                  for i in self._variable_index[k]])
        # In a replica's context Keras "all-reduces" the gradients through
        # one IdentityN of them all, so no stage's update could start
        # before the last stage's gradients existed, and a stage's stamped
        # update held that wait on its neighbours. The default strategy's
        # merge_call applies them in cross-replica context, where Keras
        # all-reduces nothing.
        tf.distribute.get_replica_context().merge_call(
            lambda _: optimizer.apply_gradients(pairs))
        vectors = []
        for k in runs:
          with tf.device(self.devices[k]):
            # Reads after the update (automatic control dependencies order
            # them after its assignments), so the stamp waits for it.
            update_end = self._stamp(k, [
                tf.identity(v) for v in self.stages[k].trainable_variables])
            flat = [starts[k]] + [t for pair in stamps[k] for t in pair]
            vectors.append(tf.stack(flat + [update_begins[k], update_end]))
        return loss, vectors

      return stamped_step

    if self.stages_apart and self._stand_ins is None:
      raise RuntimeError("stages apart before measure_stages() made their "
                         "stand-ins")
    stamped_step = make_stamped_step(None, apart or self.stages_apart)

    def train_step(batch):
      if self._alone_stage is not None:
        return self._step_alone(batch, make_stamped_step)
      loss, vectors = stamped_step(batch)
      # Reading every stage's stamps waits for every stage's update, so
      # the host's span of the step covers all of it.
      self._last_stamps = [v.numpy() for v in vectors]
      return loss

    return train_step

  def _step_alone(self, batch, make_stamped_step):
    """One step of the stage inside `alone`, its stamps kept."""
    stage = self._alone_stage
    if stage not in self._alone_steps:
      self._alone_steps[stage] = make_stamped_step((stage,), True)
    loss, (vector,) = self._alone_steps[stage](batch)
    # Reading the stamps waits for the stage's update.
    self._alone_stamps = vector.numpy()
    return loss

  def measure_stages(self, example_inputs, example_targets,
                     loss_fn: Callable, *,
                     optimizer: Optional[keras.optimizers.Optimizer] = None,
                     repeats: int = 3) -> None:
    """Nothing to time here: every step measures its stages. Stand-ins
    come from a step on the example batch: now for stages apart, on first
    need for a stage timed `alone`."""
    del optimizer, repeats
    self._example = (example_inputs, example_targets, loss_fn)
    if self.stages_apart:
      self._make_stand_ins()

  def record_step(self, start_s: float, end_s: float):
    """Records one step's measured bubble and update per stage; returns
    the ledger's three phases partitioning the span (the mean stage's)."""
    if self._last_stamps is None:
      raise RuntimeError("record_step() before a stamped train step")
    # The stages' wall clocks, shifted so that the step starts where the
    # first stage started it in the host's span: one shift for all, as
    # the stages' clocks agree (one host, or hosts kept in step by NTP).
    shift = start_s - min(float(v[0]) for v in self._last_stamps)
    idle_s = []
    for recorder, vector in zip(self.recorders, self._last_stamps):
      busy = _busy_intervals(vector, shift)
      bubbles = pipeline_stats.idle_intervals(start_s, end_s, busy)
      for interval in bubbles:
        recorder.record(*interval)
      recorder.record_update(*busy[-1])
      recorder.end_step(start_s, end_s)
      idle_s.append(sum(e - b for _, b, e in bubbles))
    mean_idle_s = sum(idle_s) / len(idle_s)
    return pipeline_stats.partition_span(
        start_s, end_s, [(pipeline_stats.BUBBLE, end_s - mean_idle_s, end_s)])

  RUNTIME = RUNTIME

  def _times_update(self) -> bool:
    return True  # every step stamps each stage's update

  def _sources(self) -> dict:
    return dict(MEASURED_SOURCES)
