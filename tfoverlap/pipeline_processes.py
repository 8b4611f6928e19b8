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

  cluster = cluster_lib.pipeline_cluster_from_env(os.environ)
  connect_client(cluster, intra_op_threads=1, inter_op_threads=1)
  runtime = ProcessPipelineRuntime(model, cuts, num_microbatches=4)
  optimizer.build(model.trainable_variables)   # slots beside the stages
  train_step = runtime.make_train_step(optimizer, loss_fn)
"""

import socket
import time
from typing import Callable, List, Optional, Sequence

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
        "share cores it bounds what removing the waits saves: run apart, "
        "the stages compute side by side and slow each other, which no "
        "stage timed alone carves out here (BENCHMARKS §17)",
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
  (the devices runtime derives it from stages timed alone).

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

  def _stamp(self, k: int, tensors) -> tf.Tensor:
    """Stage k's stamps come from its own clock (`StageClock`)."""
    return self._clocks[k](tensors)

  def make_train_step(self, optimizer: keras.optimizers.Optimizer,
                      loss_fn: Callable):
    """train_step((inputs, targets)) -> loss: one GPipe step, one update;
    keeps the step's stamps for `record_step`.

    Each stage returns one vector: the step's start on its process, then
    (begin, end) of every forward and backward of a micro-batch, then of
    its update.
    """

    @tf.function
    def stamped_step(batch):
      inputs, targets = batch
      starts = []
      for k, device in enumerate(self.devices):
        with tf.device(device):
          starts.append(self._stamp(k, []))
      stamps = [[] for _ in self.stages]
      loss, grads = self.forward_backward(inputs, targets, loss_fn,
                                          stamps=stamps,
                                          stand_ins=self._stand_ins)
      update_begins = []
      for k, device in enumerate(self.devices):
        with tf.device(device):
          update_begins.append(self._stamp(
              k, [grads[i] for i in self._variable_index[k]]))
      optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
      vectors = []
      for k, device in enumerate(self.devices):
        with tf.device(device):
          # Reads after the update (automatic control dependencies order
          # them after its assignments), so the stamp waits for it.
          update_end = self._stamp(
              k, [tf.identity(v) for v in self.stages[k].trainable_variables])
          flat = [starts[k]] + [t for pair in stamps[k] for t in pair]
          vectors.append(tf.stack(flat + [update_begins[k], update_end]))
      return loss, vectors

    if self.stages_apart and self._stand_ins is None:
      raise RuntimeError("stages apart before measure_stages() made their "
                         "stand-ins")

    def train_step(batch):
      loss, vectors = stamped_step(batch)
      # Reading every stage's stamps waits for every stage's update, so
      # the host's span of the step covers all of it.
      self._last_stamps = [v.numpy() for v in vectors]
      return loss

    return train_step

  def measure_stages(self, example_inputs, example_targets,
                     loss_fn: Callable, *,
                     optimizer: Optional[keras.optimizers.Optimizer] = None,
                     repeats: int = 3) -> None:
    """Nothing to time alone: every step measures its stages. Stages
    apart take their stand-ins from a step on the example batch."""
    del optimizer, repeats
    if self.stages_apart:
      self._stand_ins = pipeline_lib.make_stand_ins(
          self, example_inputs, example_targets, loss_fn)

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
      busy = [(float(b) + shift, float(e) + shift)
              for b, e in vector[1:].reshape(-1, 2)]
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
