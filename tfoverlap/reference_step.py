"""The step timed alone before training: TensorFlow's side of
`overlap_core.runtime.contention`.

The run's own step function is called on a resident copy of the run's
first batch (`data.make_resident_iterator`: the source's first batch
without its pipeline), before the training iterator exists. A tf.data
iterator starts filling its shuffle and prefetch buffers the moment it is
made, on the host's cores; timed after it, the reference took in that
fill, which the training steps no longer have beside them, and so hid
their contention: the mirrored job's data wait cell of the fidelity
benchmark (BENCHMARKS section 17) attributed less than removing the input
saved in every repeat. The variables of the model and the optimizer
(Keras keeps its dropout seeds among the model's) are snapshotted first
and put back after, so the run trains exactly as it would without the
calibration. The stages of a pipeline on stage servers
(`--pipeline_runtime=processes`) are timed one stage at a time
(`_one_stage_at_a_time`), each with the host to itself.

  reference = reference_step.calibrate(
      train_step, batch, model=model, optimizer=optimizer, num_steps=5)
"""

from typing import Callable, Optional, Sequence, Union

import tensorflow as tf

from overlap_core.runtime import contention, offload_cost


def snapshot(model, optimizer) -> Callable[[], None]:
  """A copy of every variable of `model` and `optimizer`; returns the
  function that puts it back.

  The optimizer's variables must exist (`optimizer.build`, or a step),
  or the ones a later step creates would not be put back.
  """
  variables = list(model.variables) + list(optimizer.variables)
  saved = [tf.identity(v.value) for v in variables]

  def restore() -> None:
    # In cross-replica context an assign sets every replica's copy, so
    # replicas a step parted (a local step) are one again.
    for variable, value in zip(variables, saved):
      variable.value.assign(value)
    wait_for_assigns(variables)

  return restore


def wait_for_assigns(variables: Sequence) -> None:
  """Returns once the assigns this client made to `variables` (Keras
  variables) are done, on whichever server holds each.

  An eager assign to a variable on another server (a pipeline's stage
  server) is queued there and returns at once, and the client's next
  traced step is not ordered after it: seen in tests/tfoverlap/
  test_pipeline_processes.py, where a step right after the client
  assigned a stage's variables read values not yet written. Reading each
  value back waits for its assign.
  """
  for variable in variables:
    if not _is_local(variable.value.device):
      variable.value.numpy()


def _is_local(device: str) -> bool:
  """Whether a variable's device is of a process with no cluster (job
  localhost). A cluster's client reads its own back too: a pipeline's
  client holds only the optimizer's few scalars."""
  return not device.startswith("/job:") or device.startswith(
      "/job:localhost/")


def make_step_without_offload(make_train_step: Callable, offloader):
  """A step function made anew by `make_train_step` and traced inside
  `Offloader.paused`, so its graph holds no offload: the step alone
  without offload, as `calibrate` times it and a run's blocks without
  offload (`--paired_removal=offload`) train it."""
  step = make_train_step()

  def step_without_offload(batch):
    # Only the first call traces; the context matters to that one.
    with offloader.paused():
      return step(batch)

  return step_without_offload


def _one_stage_at_a_time(pipeline, time_alone: Callable[[], object]
                         ) -> contention.StagesAlone:
  """`time_alone()` inside `pipeline.alone(stage)` for each stage in turn,
  the other stage servers idle.

  As PyTorch's `_one_rank_at_a_time`, for its reason: a pipeline's stages
  take turns in training, and timed side by side on a shared host each
  stage alone would hold the others' work beside it, which is contention
  in training (BENCHMARKS §17: TensorFlow's stages apart computed 3.45 ms
  longer than in the pipeline, slowing each other on 2 cores). PyTorch's
  ranks take turns at a barrier; here one client drives every stage, so
  the turns are its loop.
  """
  references = []
  for stage in range(pipeline.num_stages):
    with pipeline.alone(stage):
      references.append(time_alone())
  return contention.StagesAlone(tuple(references))


def calibrate(train_step, batch, *, model, optimizer, num_steps: int,
              offloader=None, make_train_step: Optional[Callable] = None,
              pipeline=None
              ) -> Union[contention.ReferenceStep, offload_cost.OffloadCost,
                         contention.StagesAlone]:
  """Times `train_step` on `batch`, a batch held resident.

  Args:
    offloader: the run's `offload.Offloader`, or None. With one, the step
      is timed with offload and without: a step function made anew by
      `make_train_step` and traced inside `Offloader.paused`.
    pipeline: the run's `pipeline_processes.ProcessPipelineRuntime`, one
      that `can_run_alone`, or None. With one, each stage is timed alone
      (`ProcessPipelineRuntime.alone`), on stand-ins for its neighbours'
      tensors, by its own stamps (`alone_seconds`), one stage at a time.

  Returns:
    The reference step, with offload the offload's cost, or with a
    pipeline every stage's reference.
  """
  restore = snapshot(model, optimizer)
  if pipeline is not None:

    def run_step_alone() -> float:
      train_step(batch)  # None but on the last stage; waits for the stage
      # The stage's busy time, stamped on its process as in training: the
      # client's span of the call would add its dispatch to the server.
      return pipeline.alone_seconds()

    return _one_stage_at_a_time(pipeline, lambda: contention.time_reference(
        run_step_alone, num_steps=num_steps, restore=restore,
        own_clock=True))
  if offloader is None:
    return contention.time_reference(
        # Reading the loss waits for the step's end.
        lambda: float(train_step(batch)), num_steps=num_steps,
        restore=restore)
  step_without_offload = make_step_without_offload(make_train_step,
                                                   offloader)

  def run_without_offload() -> None:
    float(step_without_offload(batch))

  reference = offload_cost.time_with_and_without(
      lambda: float(train_step(batch)), run_without_offload,
      num_steps=num_steps, restore=restore)
  offloader.discard_records()
  return reference
