"""Which features combine, as data: the features, then the rows that refuse.

A feature is a named predicate over the frozen `TrainConfig` (and, for the
host features, over the host), defined once here. A row names the features
that must all hold for it to refuse (a tuple inside `features` means any one
of them), the frameworks it applies to, the flag and value its message
names, the reason, and what is allowed instead. `compat.check_combinations`
raises the first row that matches; `compat.render_matrix` draws the docs'
feature-by-feature matrix from the same rows. Rows are in the order they are
checked: a framework's missing features first, then the combinations.

Each feature also carries `example`: flag values that make it hold, which
the tests merge to show that every row can match (no dead rows) and to
train the combinations no row refuses.
"""

import dataclasses
from typing import Callable, Dict, Optional, Tuple, Union

TF = "tensorflow"
PT = "pytorch"
BOTH = (TF, PT)
# A burst plan file stands in for this; the tests write one.
BURST_PLAN = "{burst_plan}"


@dataclasses.dataclass(frozen=True)
class Host:
  """What the host contributes to a combination."""
  num_gpus: int = 0


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  holds: Callable  # (TrainConfig, Host) -> bool
  example: Dict[str, str] = dataclasses.field(default_factory=dict)
  host: Optional[Host] = None  # set for the host's own features


@dataclasses.dataclass(frozen=True)
class Row:
  features: Tuple[Union[str, Tuple[str, ...]], ...]
  frameworks: Tuple[str, ...]
  flag: str
  reason: str
  allowed: str
  # Where the alternative applies ("with --burst_parallel"); "" for plain
  # "allowed:". May name {strategy}, as may `reason`.
  given: str = ""


def _strategy(name):
  return lambda c, h: c.distribute.strategy == name


def _offload(target):
  return lambda c, h: target in c.offload.targets


def _checkpoint(mode):
  return lambda c, h: c.checkpoint.mode == mode


def _paired(cause):
  return lambda c, h: c.run.paired_removal == cause


def _precision(name):
  return lambda c, h: c.model.precision == name


def _schedule(name):
  return lambda c, h: c.pipeline.stages > 1 and c.pipeline.schedule == name


def _all_reduce(name):
  return lambda c, h: c.distribute.all_reduce == name


def _data_parallel(c, h) -> bool:
  """More than one replica all-reduces gradients (a world of one does not
  need to, but multi_worker and horovod wrap the model all the same)."""
  d = c.distribute
  return (d.strategy in ("multi_worker", "horovod") or d.num_workers > 1 or
          (d.strategy == "mirrored" and d.num_devices > 1))


def _one_pipeline(c, h) -> bool:
  """Pipelined, and the world is the stages: no stage has a replica, so
  no stage's gradients are all-reduced (`ParallelDims.for_run` reckons
  the world; a world the stages do not divide counts as one pipeline
  until the trainer refuses it)."""
  # Lazily: dims reads this table's DATA_PARALLEL_REFUSAL.
  from overlap_core.planning.dims import ParallelDims  # pylint: disable=g-import-not-at-top
  return (c.pipeline.stages > 1 and
          ParallelDims.from_config(c, None).data_parallel == 1)


_PIPE = {"pipeline_stages": "2", "pipeline_split": "even",
         "strategy": "mirrored", "num_devices": "2"}
FEATURES = {f.name: f for f in (
    Feature("strategy=default", _strategy("default"),
            {"strategy": "default"}),
    Feature("strategy=one_device", _strategy("one_device"),
            {"strategy": "one_device"}),
    Feature("strategy=mirrored", _strategy("mirrored"),
            {"strategy": "mirrored", "num_devices": "2"}),
    Feature("strategy=multi_worker", _strategy("multi_worker"),
            {"strategy": "multi_worker"}),
    Feature("strategy=horovod", _strategy("horovod"),
            {"strategy": "horovod"}),
    Feature("data_parallel", _data_parallel,
            {"strategy": "mirrored", "num_devices": "2"}),
    Feature("num_workers>1", lambda c, h: c.distribute.num_workers > 1,
            {"strategy": "multi_worker", "num_workers": "2"}),
    Feature("all_reduce=ring", _all_reduce("ring"), {"all_reduce": "ring"}),
    Feature("all_reduce=nccl", _all_reduce("nccl"), {"all_reduce": "nccl"}),
    Feature("all_reduce=off", _all_reduce("off"), {"all_reduce": "off"}),
    Feature("all_reduce_pack_mb",
            lambda c, h: bool(c.distribute.all_reduce_pack_mb),
            {"all_reduce_pack_mb": "4"}),
    Feature("pipeline", lambda c, h: c.pipeline.stages > 1, _PIPE),
    Feature("schedule=1f1b", _schedule("1f1b"),
            {**_PIPE, "pipeline_schedule": "1f1b",
             "pipeline_microbatches": "2"}),
    Feature("schedule=interleaved_1f1b", _schedule("interleaved_1f1b"),
            {**_PIPE, "pipeline_schedule": "interleaved_1f1b",
             "pipeline_virtual_stages": "2", "pipeline_microbatches": "2"}),
    Feature("schedule=zero_bubble", _schedule("zero_bubble"),
            {**_PIPE, "pipeline_schedule": "zero_bubble",
             "pipeline_virtual_stages": "2", "pipeline_microbatches": "2"}),
    Feature("one_pipeline", _one_pipeline, _PIPE),
    Feature("no_all_reduce_overlap",
            lambda c, h: (c.pipeline.stages > 1 and
                          not c.pipeline.overlap_all_reduce),
            {**_PIPE, "pipeline_overlap_all_reduce": "false"}),
    Feature("pipeline_runtime=processes",
            lambda c, h: (c.pipeline.stages > 1 and
                          c.pipeline.runtime == "processes"),
            {**_PIPE, "pipeline_runtime": "processes"}),
    Feature("pipeline_runtime=devices",
            lambda c, h: (c.pipeline.stages > 1 and
                          c.pipeline.runtime == "devices"),
            {**_PIPE, "pipeline_runtime": "devices"}),
    Feature("stages_apart",
            lambda c, h: c.pipeline.stages > 1 and c.pipeline.stages_apart,
            {**_PIPE, "pipeline_stages_apart": "true"}),
    Feature("burst", lambda c, h: c.burst.enabled,
            {"burst_parallel": BURST_PLAN, "strategy": "mirrored",
             "num_devices": "2"}),
    Feature("background_job", lambda c, h: c.burst.background,
            {"background_job": "small_mlp"}),
    Feature("offload=activations", _offload("activations"),
            {"offload": "activations"}),
    Feature("offload=parameters", _offload("parameters"),
            {"offload": "parameters"}),
    Feature("offload_pin_memory", lambda c, h: c.offload.pin_memory,
            {"offload": "activations", "offload_pin_memory": "true"}),
    Feature("offload_non_blocking", lambda c, h: c.offload.non_blocking,
            {"offload": "activations", "offload_non_blocking": "true"}),
    Feature("offload_prefetch", lambda c, h: c.offload.prefetch,
            {"offload": "activations", "offload_non_blocking": "true",
             "offload_prefetch": "true"}),
    Feature("checkpoint=sync", _checkpoint("sync"), {"checkpoint": "sync"}),
    Feature("checkpoint=async", _checkpoint("async"), {"checkpoint": "async"}),
    Feature("checkpoint=tf_async", _checkpoint("tf_async"),
            {"checkpoint": "tf_async"}),
    Feature("steps_per_execution>1",
            lambda c, h: c.run.steps_per_execution > 1,
            {"steps_per_execution": "2", "train_steps": "2",
             "checkpoint_every": "2"}),
    Feature("checkpoint=none", _checkpoint("none"), {"checkpoint": "none"}),
    Feature("checkpoint_every=auto",
            lambda c, h: (c.checkpoint.mode != "none"
                          and c.checkpoint.every_steps == 0),
            {"checkpoint": "sync", "checkpoint_every": "auto"}),
    Feature("loop=fit", lambda c, h: c.run.loop == "fit", {"loop": "fit"}),
    # Blocks of 2 steps over 4: one counted step in each half.
    Feature("paired_removal=input", _paired("input"),
            {"paired_removal": "input", "paired_block_steps": "2",
             "train_steps": "4"}),
    Feature("paired_removal=offload", _paired("offload"),
            {"paired_removal": "offload", "paired_block_steps": "2",
             "train_steps": "4", "offload": "activations"}),
    Feature("paired_removal=all_reduce", _paired("all_reduce"),
            {"paired_removal": "all_reduce", "paired_block_steps": "2",
             "train_steps": "4"}),
    Feature("one_replica", lambda c, h: not _data_parallel(c, h),
            {"strategy": "default"}),
    Feature("offload=none", lambda c, h: not c.offload.targets,
            {"offload": "none"}),
    Feature("reference_steps=0", lambda c, h: c.run.reference_steps == 0,
            {"reference_steps": "0"}),
    # No pipeline flags here: the row that refuses it without a pipeline
    # needs an example where none is configured.
    Feature("paired_removal=pipeline_waits", _paired("pipeline_waits"),
            {"paired_removal": "pipeline_waits", "paired_block_steps": "2",
             "train_steps": "4"}),
    Feature("no_pipeline", lambda c, h: c.pipeline.stages <= 1,
            {"pipeline_stages": "1"}),
    Feature("paired_removal=checkpoint", _paired("checkpoint"),
            {"paired_removal": "checkpoint", "paired_block_steps": "2",
             "train_steps": "4", "checkpoint": "sync",
             "checkpoint_every": "2"}),
    Feature("precision=mixed_float16", _precision("mixed_float16"),
            {"precision": "mixed_float16"}),
    Feature("precision=mixed_bfloat16", _precision("mixed_bfloat16"),
            {"precision": "mixed_bfloat16"}),
    Feature("data_service", lambda c, h: bool(c.data.data_service),
            {"data_service": "local"}),
    Feature("synthetic_on_device", lambda c, h: c.data.synthetic_on_device,
            {"dataset": "synthetic", "synthetic_on_device": "true"}),
    Feature("deterministic", lambda c, h: c.run.deterministic,
            {"deterministic": "true"}),
    Feature("evaluate", lambda c, h: c.run.evaluate, {"evaluate": "true"}),
    Feature("gpu_host", lambda c, h: h is not None and h.num_gpus > 0,
            host=Host(num_gpus=1)),
    Feature("no_gpu", lambda c, h: h is not None and h.num_gpus == 0,
            host=Host(num_gpus=0)),
)}

# How a row's flag shows its value in the message.
FLAG_VALUES = {
    "strategy": lambda c: c.distribute.strategy,
    "num_workers": lambda c: c.distribute.num_workers,
    "all_reduce": lambda c: c.distribute.all_reduce,
    "all_reduce_pack_mb": lambda c: c.distribute.all_reduce_pack_mb,
    "pipeline_schedule": lambda c: c.pipeline.schedule,
    "pipeline_overlap_all_reduce": lambda c: c.pipeline.overlap_all_reduce,
    "pipeline_runtime": lambda c: c.pipeline.runtime,
    "pipeline_stages_apart": lambda c: c.pipeline.stages_apart,
    "burst_parallel": lambda c: c.burst.plan_path,
    "background_job": lambda c: c.burst.background_job,
    "offload": lambda c: ",".join(c.offload.targets),
    "offload_pin_memory": lambda c: c.offload.pin_memory,
    "offload_non_blocking": lambda c: c.offload.non_blocking,
    "offload_prefetch": lambda c: c.offload.prefetch,
    "checkpoint": lambda c: c.checkpoint.mode,
    "checkpoint_every": lambda c: ("auto" if c.checkpoint.every_steps == 0
                                   else c.checkpoint.every_steps),
    "paired_removal": lambda c: c.run.paired_removal,
    "reference_steps": lambda c: c.run.reference_steps,
    "steps_per_execution": lambda c: c.run.steps_per_execution,
    "loop": lambda c: c.run.loop,
    "precision": lambda c: c.model.precision,
    "data_service": lambda c: c.data.data_service,
    "synthetic_on_device": lambda c: c.data.synthetic_on_device,
    "evaluate": lambda c: c.run.evaluate,
}

_MIXED = ("precision=mixed_float16", "precision=mixed_bfloat16")
_OFFLOAD = ("offload=activations", "offload=parameters")
_SAVES = ("checkpoint=sync", "checkpoint=async", "checkpoint=tf_async")
_ONE_PROCESS = ("strategy=default", "strategy=one_device")
_NOT_DDP = ("strategy=default", "strategy=one_device", "strategy=horovod")
_PIPELINED = "with --pipeline_stages > 1"
_BURST = "with --burst_parallel"
_TF_SIDE = "on the TensorFlow side"
_NO_ALL_REDUCE = "with --all_reduce=off"
_STAGES_APART = "with --pipeline_stages_apart"
DATA_PARALLEL_REFUSAL = (
    "data parallelism across pipelines is not built in TensorFlow: a "
    "tf.distribute replica owns one device, so a replica cannot hold stages "
    "on several devices, and the stages' gradients would need an all-reduce "
    "outside the strategy")

ROWS = (
    # --- What one framework does not have at all.
    Row(("loop=fit",), (PT,), "loop",
        "model.fit is Keras'; PyTorch has no counterpart, and the PyTorch "
        "trainer's loop is the measured custom loop", "ctl"),
    # torch.compile cannot trace a loop that pulls from a DataLoader (a
    # graph break at every batch), and CUDA graphs need a GPU and inputs
    # copied into static buffers.
    Row(("steps_per_execution>1",), (PT,), "steps_per_execution",
        "PyTorch runs each step eagerly from Python and has no traced "
        "multi-step loop over a DataLoader (CUDA graphs would need a GPU and "
        "static input buffers)", "1"),
    Row(("data_service",), (PT,), "data_service",
        "the tf.data service has no PyTorch counterpart",
        "empty (--map_parallelism and --prefetch move preprocessing off the "
        "training thread instead)"),
    Row(("checkpoint=tf_async",), (PT,), "checkpoint",
        "TensorFlow's own asynchronous save has no PyTorch counterpart",
        "none, sync, async"),
    Row(("strategy=horovod",), (TF,), "strategy",
        "Horovod's TensorFlow extension does not build against TensorFlow "
        "2.21 and its Keras integration fails on Keras 3 "
        "(horovod/horovod#4290); run Horovod with python -m "
        "torch_parity.train", "default, one_device, mirrored, multi_worker"),
    Row(("offload_pin_memory",), (TF,), "offload_pin_memory",
        "TensorFlow allocates and pins host buffers itself and has no "
        "setting for it", "false", _TF_SIDE),
    Row(("offload_non_blocking",), (TF,), "offload_non_blocking",
        "TensorFlow's runtime schedules its copies and has no setting for "
        "it", "false", _TF_SIDE),
    Row(("offload_prefetch",), (TF,), "offload_prefetch",
        "TensorFlow places its copies inside the compiled step and has no "
        "side-stream prefetch of them", "false", _TF_SIDE),
    Row(("offload=parameters",), (TF,), "offload",
        "TensorFlow keeps a layer's weights where their variables live and "
        "has no per-layer move", "none or activations", _TF_SIDE),
    # Its step without the all-reduce is timed before training
    # (`tfoverlap.exposed_comm`) and trained in blocks of
    # --paired_removal=all_reduce; Keras' fit and the multi-step function
    # do not run it.
    Row(("all_reduce=off",), (TF,), "all_reduce",
        "the TensorFlow trainer has no run-long local step; it times its "
        "step without the all-reduce before training and derives "
        "exposed_comm from it (tfoverlap.exposed_comm)", "auto, ring or "
        "nccl (--paired_removal=all_reduce runs blocks of steps without "
        "the all-reduce)", _TF_SIDE),
    # --- Processes and all-reduce.
    Row(("num_workers>1", ("strategy=default", "strategy=one_device",
                           "strategy=mirrored")), BOTH, "num_workers",
        "more than 1 worker needs --strategy=multi_worker or horovod", "1",
        "with --strategy={strategy}"),
    Row((_ONE_PROCESS, ("all_reduce=ring", "all_reduce=nccl",
                        "all_reduce=off")), BOTH,
        "all_reduce", "--strategy={strategy} has no all-reduce", "auto"),
    # --all_reduce=off is DDP's no_sync for the whole run; nothing else
    # that all-reduces here has a switch for it.
    Row(("all_reduce=off", "strategy=horovod"), (PT,), "all_reduce",
        "Horovod's DistributedOptimizer all-reduces inside step() and has no "
        "run-long local step (DDP's no_sync)", "auto or ring",
        "with --strategy=horovod"),
    Row(("all_reduce=off", "pipeline"), (PT,), "all_reduce",
        "a stage's replicas all-reduce in the pipeline runtime, not in DDP "
        "(--pipeline_overlap_all_reduce=false measures what its overlap "
        "hides)", "auto", _PIPELINED),
    Row(("all_reduce=off", "burst"), (PT,), "all_reduce",
        "a burst plan all-reduces each layer over its own group, not in DDP",
        "auto", _BURST),
    # Replicas that train apart are as many models as there are replicas.
    Row(("all_reduce=off", _SAVES), (PT,), "checkpoint",
        "replicas that train apart have no one state to save: the "
        "checkpoint would hold rank 0's replica and a resume would hand it "
        "to every replica", "none", _NO_ALL_REDUCE),
    Row(("all_reduce=off", "evaluate"), (PT,), "evaluate",
        "replicas that train apart are different models, and an evaluation "
        "sharded over them scores none of them", "false", _NO_ALL_REDUCE),
    Row((_ONE_PROCESS, "all_reduce_pack_mb"), BOTH, "all_reduce_pack_mb",
        "--strategy={strategy} has no all-reduce", "0"),
    # Before mirrored's own: a pipeline's stages are not replicas.
    Row(("pipeline", ("all_reduce=ring", "all_reduce=nccl")), (TF,),
        "all_reduce", "one pipeline runs no all-reduce", "auto", _PIPELINED),
    Row(("strategy=mirrored", "all_reduce=ring"), (TF,), "all_reduce",
        "MirroredStrategy has no ring all-reduce", "auto or nccl (ring: "
        "multi_worker)", "with mirrored"),
    Row(("strategy=mirrored", "all_reduce_pack_mb"), (TF,),
        "all_reduce_pack_mb", "MirroredStrategy packs by count, not size",
        "0 (pack size: multi_worker)", "with mirrored"),
    Row(("all_reduce=nccl", "no_gpu"), BOTH, "all_reduce",
        "NCCL needs GPUs and this host has none", "auto or ring"),
    Row(("synthetic_on_device", "loop=fit"), (TF,), "synthetic_on_device",
        "model.fit reads a tf.data pipeline; device-resident batches need "
        "--loop=ctl", "false", "with --loop=fit"),
    # --- A cause removed in alternate blocks of steps.
    Row(("synthetic_on_device", "paired_removal=input"), BOTH,
        "paired_removal", "the batches are resident already: there is no "
        "input to remove", "none, checkpoint or offload",
        "with --synthetic_on_device"),
    Row(("loop=fit", "paired_removal=input"), (TF,), "paired_removal",
        "model.fit pulls its batches inside its compiled step, which "
        "cannot be handed a resident batch for some steps only",
        "none, checkpoint or offload", "with --loop=fit"),
    Row(("steps_per_execution>1", "paired_removal=input"), (TF,),
        "paired_removal", "a call of K steps reads the iterator inside its "
        "graph, which cannot be handed a resident batch for some steps "
        "only", "none, checkpoint or offload",
        "with --steps_per_execution > 1"),
    Row(("pipeline", "paired_removal=input"), BOTH, "paired_removal",
        "alternating the input of a pipeline's stages is not built yet",
        "none, checkpoint or offload", _PIPELINED),
    Row(("burst", "paired_removal=input"), BOTH, "paired_removal",
        "alternating the input of a burst plan's step is not built yet",
        "none, checkpoint or offload", _BURST),
    Row(("paired_removal=checkpoint", "checkpoint=none"), BOTH,
        "paired_removal", "there is no checkpoint to remove",
        "none, input or offload", "with --checkpoint=none"),
    # The cadence would adapt to saves the blocks without them removed.
    Row(("paired_removal=checkpoint", "checkpoint_every=auto"), BOTH,
        "checkpoint_every", "the adaptive cadence tunes itself to the "
        "saves' measured overhead, which blocks without saves would "
        "change", "a number of steps", "with --paired_removal=checkpoint"),
    Row(("paired_removal=offload", "offload=none"), BOTH, "paired_removal",
        "there is no offload to remove", "none, input or checkpoint",
        "with --offload=none"),
    Row(("paired_removal=offload", "offload=parameters"), (PT,),
        "paired_removal", "no step runs without parameters offload: the "
        "weights live on the host", "none, input or checkpoint",
        "with --offload=parameters"),
    # A step without offload is split against the step timed alone
    # without it, which only the custom loop at one step per call times.
    Row(("loop=fit", "paired_removal=offload"), (TF,), "paired_removal",
        "model.fit times no step alone, without offload or with it",
        "none, input or checkpoint", "with --loop=fit"),
    Row(("steps_per_execution>1", "paired_removal=offload"), (TF,),
        "paired_removal", "a call of K steps times no step alone, without "
        "offload or with it", "none, input or checkpoint",
        "with --steps_per_execution > 1"),
    Row(("strategy=multi_worker", "paired_removal=offload"), (TF,),
        "paired_removal", "a multi_worker job times no step alone (see "
        "--reference_steps)", "none, input or checkpoint",
        "with --strategy=multi_worker"),
    Row(("paired_removal=offload", "background_job", "gpu_host"), (PT,),
        "paired_removal", "on a GPU the background job's kernels run "
        "beside every step, so no step is timed alone",
        "none, input or checkpoint", "with --background_job on a GPU host"),
    Row(("paired_removal=offload", "reference_steps=0"), BOTH,
        "reference_steps", "a step without offload is split against the "
        "step timed alone without it", "1 or more",
        "with --paired_removal=offload"),
    # A step without its all-reduce: DDP's under no_sync, or TensorFlow's
    # local step, whose split needs the exposed all-reduce derived and the
    # step timed alone (`tfoverlap.trainer._split_without_all_reduce`).
    Row((_ONE_PROCESS, "paired_removal=all_reduce"), BOTH, "paired_removal",
        "--strategy={strategy} has no all-reduce to remove",
        "none, input, checkpoint or offload", "with --strategy={strategy}"),
    # A mirrored strategy of one device, say.
    Row(("one_replica", "paired_removal=all_reduce"), BOTH, "paired_removal",
        "a single replica shares no gradient: there is no all-reduce to "
        "remove", "none, input, checkpoint or offload",
        "without two replicas or more"),
    Row(("paired_removal=all_reduce", "all_reduce=off"), (PT,),
        "paired_removal", "the all-reduce is off in every step already",
        "none, input or checkpoint", _NO_ALL_REDUCE),
    Row(("paired_removal=all_reduce", "strategy=horovod"), (PT,),
        "paired_removal", "Horovod's DistributedOptimizer all-reduces inside "
        "step() and has no step without it (DDP's no_sync)",
        "none, input, checkpoint or offload", "with --strategy=horovod"),
    Row(("paired_removal=all_reduce", "pipeline"), BOTH, "paired_removal",
        "a stage's replicas all-reduce in the pipeline runtime, which has no "
        "step without it", "none or checkpoint", _PIPELINED),
    Row(("paired_removal=all_reduce", "burst"), BOTH, "paired_removal",
        "a burst plan all-reduces each layer over its own group and has no "
        "step without it", "none or checkpoint", _BURST),
    Row(("paired_removal=all_reduce", _OFFLOAD), BOTH, "paired_removal",
        "one cause at a time: offload's step alone is timed with the "
        "all-reduce, and a step without both has nothing to be split "
        "against", "none, input, checkpoint or offload",
        "with offload on"),
    Row(("loop=fit", "paired_removal=all_reduce"), (TF,), "paired_removal",
        "model.fit runs its own compiled step, which cannot go without the "
        "all-reduce for some steps only", "none or checkpoint",
        "with --loop=fit"),
    Row(("steps_per_execution>1", "paired_removal=all_reduce"), (TF,),
        "paired_removal", "a call of K steps is one traced function, which "
        "cannot go without the all-reduce for some steps only",
        "none or checkpoint", "with --steps_per_execution > 1"),
    Row(("strategy=multi_worker", "paired_removal=all_reduce"), (TF,),
        "paired_removal", "a multi_worker job times no step alone (see "
        "--reference_steps), against which a step without the all-reduce "
        "is split", "none, input or checkpoint",
        "with --strategy=multi_worker"),
    Row(("paired_removal=all_reduce", "reference_steps=0"), (TF,),
        "reference_steps", "a step without the all-reduce is split against "
        "the step timed alone less its derived exposed all-reduce",
        "1 or more", "with --paired_removal=all_reduce"),
    # Replicas that train apart, as under --all_reduce=off.
    Row(("paired_removal=all_reduce", _SAVES), BOTH, "checkpoint",
        "the replicas' weights part in the steps without the all-reduce, "
        "so there is no one state to save", "none",
        "with --paired_removal=all_reduce"),
    Row(("paired_removal=all_reduce", "evaluate"), BOTH, "evaluate",
        "the replicas' weights part in the steps without the all-reduce, "
        "and an evaluation sharded over them scores none of them", "false",
        "with --paired_removal=all_reduce"),
    # --- Burst parallelism.
    Row(("burst", "pipeline"), BOTH, "burst_parallel",
        "burst parallelism and pipeline stages do not combine",
        "--pipeline_stages=1", "with --burst_parallel"),
    # The idle-class process would share the CPU, not the GPU the
    # foreground runs on: it would say nothing about multiplexing a GPU.
    Row(("background_job", "gpu_host"), (TF,), "background_job",
        "TensorFlow exposes no CUDA stream priority, so a job on this host's "
        "GPUs could not be ranked below the foreground's kernels",
        "none (the PyTorch trainer runs it)", "on a GPU host"),
    Row(("burst", ("strategy=default", "strategy=one_device",
                   "strategy=multi_worker", "strategy=horovod")), (TF,),
        "strategy", "the plan's devices are this process's --num_devices",
        "mirrored", _BURST),
    Row(("burst", _NOT_DDP), (PT,), "strategy",
        "a burst plan runs on torch.distributed process groups",
        "mirrored, multi_worker", _BURST),
    Row(("burst", "loop=fit"), (TF,), "loop", "model.fit runs no burst step",
        "ctl", _BURST),
    Row(("burst", _MIXED), (TF,), "precision",
        "the burst step runs no loss scaling yet", "float32", _BURST),
    Row(("burst", _MIXED), (PT,), "precision",
        "the burst step runs no autocast or loss scaling yet", "float32",
        _BURST),
    Row(("burst", _OFFLOAD), (TF,), "offload",
        "offload does not follow a burst plan's parts yet", "none", _BURST),
    Row(("burst", _OFFLOAD), (PT,), "offload",
        "offload hooks do not follow a burst plan's layers yet", "none",
        _BURST),
    Row(("burst", "steps_per_execution>1"), (TF,), "steps_per_execution",
        "a burst step is traced per step", "1", _BURST),
    # --- Pipeline stages.
    Row(("schedule=1f1b",), (TF,), "pipeline_schedule",
        "1F1B frees a micro-batch's activations by running its backward "
        "before later forwards; in one traced function TensorFlow's executor "
        "orders ops by data dependence alone and keeps every activation a "
        "later gradient reads, so a 1F1B order frees nothing earlier "
        "without control edges this runtime does not add", "gpipe"),
    Row(("schedule=interleaved_1f1b",), (TF,), "pipeline_schedule",
        "virtual stages interleave 1F1B, which this runtime does not run "
        "(see 1f1b)", "gpipe"),
    Row(("schedule=zero_bubble",), (TF,), "pipeline_schedule",
        "zero-bubble splits backward into input and weight gradients, "
        "which one gradient tape per stage does not provide", "gpipe"),
    Row(("schedule=zero_bubble",), (PT,), "pipeline_schedule",
        "zero-bubble schedules split backward into input and weight "
        "gradients, which the fx stage modules here do not provide",
        "gpipe, 1f1b, interleaved_1f1b"),
    # The knob exists to measure what the overlap hides; where no stage
    # all-reduces, turning it off would change nothing.
    Row(("no_all_reduce_overlap",), (TF,), "pipeline_overlap_all_reduce",
        "a TensorFlow pipeline is one replica, whose stages all-reduce "
        "nothing", "true", _TF_SIDE),
    Row(("no_all_reduce_overlap", "one_pipeline"), (PT,),
        "pipeline_overlap_all_reduce",
        "the world is the stages, so no stage has replicas to all-reduce "
        "with", "true, or a world of stages x 2 or more replicas"),
    # Stages apart are an intervention that removes what a pipeline waits
    # for; they stand in for GPipe's order, and train on stand-ins.
    Row(("stages_apart", "pipeline_runtime=devices"), (TF,),
        "pipeline_stages_apart",
        "the devices runtime derives its bubble from the stages timed "
        "alone, which stages apart would check against itself",
        "false (--pipeline_runtime=processes stamps each stage's waits on "
        "its own process and runs its stages apart)",
        "with --pipeline_runtime=devices"),
    Row(("stages_apart", ("schedule=1f1b", "schedule=interleaved_1f1b",
                          "schedule=zero_bubble")), (PT,),
        "pipeline_stages_apart",
        "stages apart run GPipe's order, the forwards then the backwards, "
        "and are compared with a GPipe pipeline", "false",
        "with a schedule other than gpipe"),
    Row(("stages_apart", _SAVES), BOTH, "checkpoint",
        "stages apart train on stand-ins, a model the job does not train, "
        "which no checkpoint should hold", "none", _STAGES_APART),
    Row(("stages_apart", "evaluate"), BOTH, "evaluate",
        "stages apart train on stand-ins, a model the job does not train",
        "false", _STAGES_APART),
    # The same intervention in alternate blocks of one run.
    Row(("paired_removal=pipeline_waits", "no_pipeline"), BOTH,
        "paired_removal", "there are no pipeline stages to run apart",
        "none, input, checkpoint, offload or all_reduce",
        "without --pipeline_stages > 1"),
    Row(("paired_removal=pipeline_waits", "pipeline_runtime=devices"), (TF,),
        "paired_removal",
        "the devices runtime derives its bubble from the stages timed "
        "alone, which steps apart would check against itself",
        "none or checkpoint (--pipeline_runtime=processes runs its stages "
        "apart)", "with --pipeline_runtime=devices"),
    Row(("paired_removal=pipeline_waits", "stages_apart"), BOTH,
        "paired_removal", "every step runs its stages apart already",
        "none or checkpoint", _STAGES_APART),
    Row(("paired_removal=pipeline_waits",
         ("schedule=1f1b", "schedule=interleaved_1f1b",
          "schedule=zero_bubble")), (PT,),
        "paired_removal",
        "stages apart run GPipe's order, the forwards then the backwards, "
        "and are compared with a GPipe pipeline", "none or checkpoint",
        "with a schedule other than gpipe"),
    Row(("paired_removal=pipeline_waits", _SAVES), BOTH, "checkpoint",
        "the steps apart train on stand-ins, a model the job does not "
        "train, which no checkpoint should hold", "none",
        "with --paired_removal=pipeline_waits"),
    Row(("paired_removal=pipeline_waits", "evaluate"), BOTH, "evaluate",
        "the steps apart train on stand-ins, a model the job does not train",
        "false", "with --paired_removal=pipeline_waits"),
    Row(("pipeline", "strategy=multi_worker"), (TF,), "strategy",
        DATA_PARALLEL_REFUSAL, "mirrored", _PIPELINED),
    Row(("pipeline", _NOT_DDP), (TF,), "strategy",
        "pipeline stages run on the --num_devices local devices, one each",
        "mirrored", _PIPELINED),
    Row(("pipeline", _NOT_DDP), (PT,), "strategy",
        "pipeline stages are separate processes", "mirrored, multi_worker",
        _PIPELINED),
    # The choice exists on the TensorFlow side only: a PyTorch stage is
    # always a rank of its own (torch_parity.launch starts one per stage).
    Row(("pipeline_runtime=processes",), (PT,), "pipeline_runtime",
        "PyTorch's pipeline stages are always separate processes, one rank "
        "each; the flag chooses between TensorFlow's two runtimes",
        "devices (the default, which PyTorch runs as ranks)"),
    # A step's stage work is placed on remote tasks by one client; XLA
    # and the GPU's own streams are the devices runtime's.
    Row(("pipeline_runtime=processes", "gpu_host"), (TF,),
        "pipeline_runtime",
        "the process runtime is built and tested for CPU hosts, where "
        "logical devices share one thread pool; on GPUs each device "
        "already has its own streams", "devices", "on a GPU host"),
    Row(("pipeline", _SAVES), (PT,), "checkpoint",
        "each pipeline rank holds one stage, and a checkpoint of the whole "
        "model from stages is not built yet", "none", _PIPELINED),
    Row(("pipeline", "evaluate"), (PT,), "evaluate",
        "evaluation runs the whole model, which no pipeline rank holds",
        "false", _PIPELINED),
    Row(("pipeline", _MIXED), (TF,), "precision",
        "the pipelined step runs no loss scaling yet", "float32", _PIPELINED),
    Row(("pipeline", _MIXED), (PT,), "precision",
        "the pipeline schedules run no loss scaling or autocast yet",
        "float32", _PIPELINED),
    Row(("pipeline", _OFFLOAD), (TF,), "offload",
        "offload wraps layers the stages share", "none", _PIPELINED),
    Row(("pipeline", _OFFLOAD), (PT,), "offload",
        "the offload hooks do not follow a schedule's micro-batches yet",
        "none", _PIPELINED),
    Row(("pipeline", "loop=fit"), (TF,), "loop",
        "the trainer splits a pipelined step's time in its custom loop "
        "(your own model.fit pipelines through "
        "tfoverlap.pipelined_model.PipelinedModel)", "ctl", _PIPELINED),
    Row(("pipeline", "steps_per_execution>1"), (TF,), "steps_per_execution",
        "a pipelined step times its stages per step", "1", _PIPELINED),
    # --- Offload.
    Row(("offload_pin_memory", "no_gpu"), (PT,), "offload_pin_memory",
        "pinned host memory needs a CUDA device and this host has none",
        "false"),
    Row(("offload=parameters", "data_parallel"), (PT,), "offload",
        "parameters offload steps the optimizer on host gradients, which DDP "
        "and Horovod cannot all-reduce", "--offload=activations, or one "
        "replica (--strategy=default or one_device)"),
    Row(("offload=parameters", "precision=mixed_float16"), (PT,), "offload",
        "parameters offload unscales gradients on the host, which the loss "
        "scaler does not do", "--precision=float32 or mixed_bfloat16"),
    # Found by training the table's "yes" cells: the recompute in the
    # offloaded layer's gradient fails with "Input 'b' of 'MatMul' Op has
    # type float32 that does not match type bfloat16".
    Row((_OFFLOAD, _MIXED), (TF,), "precision",
        "an offloaded layer recomputes its forward in backward outside the "
        "mixed-precision cast and fails on mismatched dtypes", "float32",
        "with --offload"),
    Row((_OFFLOAD, "loop=fit"), (TF,), "loop",
        "Keras' fit may compile the step with XLA, which ignores host "
        "placement", "ctl", "with --offload"),
    # --- Several steps per traced call.
    # Keras 3's multi-step train function under a replicated strategy fails
    # at its first call with "You must feed a value for placeholder tensor"
    # (keras-team/keras#19246, open); plain Keras does the same.
    Row(("steps_per_execution>1", "loop=fit",
         ("strategy=mirrored", "strategy=multi_worker")), (TF,),
        "steps_per_execution",
        "Keras 3's model.fit fails with several steps per execution under a "
        "replicated strategy (keras-team/keras#19246)",
        "--loop=ctl, or 1 with --strategy={strategy}"),
)

# Features of one flag (or of the host) that cannot hold together.
EXCLUSIVE = (
    ("strategy=default", "strategy=one_device", "strategy=mirrored",
     "strategy=multi_worker", "strategy=horovod"),
    ("all_reduce=ring", "all_reduce=nccl", "all_reduce=off"),
    ("schedule=1f1b", "schedule=interleaved_1f1b", "schedule=zero_bubble"),
    ("checkpoint=sync", "checkpoint=async", "checkpoint=tf_async"),
    ("precision=mixed_float16", "precision=mixed_bfloat16"),
    ("gpu_host", "no_gpu"),
)

# What a planning command plans: it checks only the rows made of these,
# since the trainer it plans for checks the rest when it runs. The strategy
# is among them because it decides the processes, and so the threads, each
# stage gets, which the profile is measured on: a plan for a strategy the
# trainer refuses would profile a job that cannot run.
PLANNED_FEATURES = frozenset(
    {"pipeline", "schedule=1f1b", "schedule=interleaved_1f1b",
     "schedule=zero_bubble", "burst", "strategy=default",
     "strategy=one_device", "strategy=mirrored", "strategy=multi_worker",
     "strategy=horovod"})
