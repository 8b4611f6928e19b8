"""The two framework sides read side by side.

For every public function and class that tfoverlap/X.py and
torch_parity/X.py both define, the parameters both have come in the same
order and are of the same kind (positional or keyword-only); a parameter
only one side has is listed below with the reason the framework forces it.
Every public name only one side has is listed too, with its reason, so a
job cannot drift under two names unnoticed. And both sides provide
`overlap_core.runtime.framework_side.FrameworkSide`.
"""

import importlib
import inspect

import pytest

from overlap_core.runtime import framework_side

SIDES = ("tfoverlap", "torch_parity")
MODULES = ("steps", "parallelize", "pipeline", "offload", "burst",
           "distribute", "trainer", "ledger", "user_model")

# (module, name) -> {side: parameters only that side has}. Why each:
ONE_SIDED_PARAMETERS = {
    # A torch optimizer is made from the parameters it steps; a Keras one
    # is built on its variables later (`optimizer.build`).
    ("steps", "build_optimizer"): {"torch_parity": {"parameters"}},
    # TensorFlow scales each replica's loss by the global batch
    # (compute_average_loss) and reads --precision from Keras' global
    # policy; PyTorch's DDP averages, and autocast takes the precision.
    ("steps", "make_train_step"): {"tfoverlap": {"global_batch_size"},
                                   "torch_parity": {"precision"}},
    ("steps", "evaluate"): {"torch_parity": {"precision"}},
    # A TensorFlow burst is a function over the Keras model's variables
    # under the default strategy; PyTorch's BurstModel holds its module and
    # sums the loss over the ranks with the strategy.
    ("steps", "make_burst_train_step"): {"tfoverlap": {"model"},
                                         "torch_parity": {"strategy"}},
    # TensorFlow's micro-batch loss sums over the global batch; torch's
    # pipelining runtime divides a mean by the micro-batches itself.
    ("steps", "make_pipeline_loss"): {"tfoverlap": {"global_batch_size"}},
    # A step without the all-reduce: TensorFlow traces one of its own, its
    # optimizer made to keep the gradients local; torch wraps the run's
    # step in DDP's no_sync().
    ("steps", "make_local_train_step"): {
        "tfoverlap": {"model", "optimizer", "task", "global_batch_size"},
        "torch_parity": {"train_step"}},
    # TensorFlow's logical devices and their collectives are set before
    # TensorFlow starts, from the distribute flags; torch needs only the
    # run's host settings there.
    ("distribute", "configure_host"): {"tfoverlap": {"distribute"}},
    # TensorFlow times offload copies in the graph (refused under op
    # determinism) and counts them per local replica in one process;
    # PyTorch offloads the optimizer's state too, to a device per process.
    ("offload", "apply_offload"): {"tfoverlap": {"time_copies",
                                                 "num_replicas"},
                                   "torch_parity": {"optimizer", "device"}},
    ("offload", "Offloader"): {"tfoverlap": {"time_copies", "num_replicas"},
                               "torch_parity": {"config", "device"}},
    ("parallelize", "parallelize"): {"tfoverlap": {"time_offload_copies"}},
    # A Keras model's variables are made under the strategy's scope; a
    # torch module is built on the CPU and moved later.
    ("user_model", "load_model"): {"tfoverlap": {"strategy"}},
    # One TensorFlow process holds every stage or burst part, each on a
    # device of its own; a torch process is one rank on one device, and
    # torch.fx traces shapes from an example input where Keras knows them.
    ("parallelize", "PipelineSpec"): {"tfoverlap": {"microbatch_size",
                                                    "devices"},
                                      "torch_parity": {"example_input",
                                                       "loss_fn"}},
    ("parallelize", "BurstSpec"): {"tfoverlap": {"devices"},
                                   "torch_parity": {"example_input"}},
    # Where each layer's burst parts really computed: TensorFlow places ops
    # itself and this records where it did; a torch rank knows its device.
    ("parallelize", "Parallelized"): {"tfoverlap": {"burst_placements"}},
    # Keras reads the layer graph at a batch size; torch.fx needs an
    # example tensor to trace shapes with.
    ("pipeline", "plan_split"): {"tfoverlap": {"batch_size"},
                                 "torch_parity": {"example"}},
    ("pipeline", "plan_cut_layers"): {"tfoverlap": {"batch_size"},
                                      "torch_parity": {"example"}},
    # The runtimes differ in how stages meet: one TensorFlow process places
    # stage k on devices[k] and runs GPipe; each torch rank holds its own
    # stages in a mesh under the --pipeline_schedule, stage modules already
    # cut, and can run them on stand-ins for their neighbours.
    # A torch rank's stand-ins run its own stage on tensors it makes from
    # the first batch; TensorFlow's are variables on each stage's device,
    # made from what crossed each cut in one traced step.
    ("pipeline", "StandIns"): {
        "tfoverlap": {"activations", "gradients"},
        "torch_parity": {"all_stages", "index", "microbatches", "loss_fn",
                         "microbatch_loss"}},
    ("pipeline", "PipelineRuntime"): {
        "tfoverlap": {"model", "cut_layers", "devices", "num_microbatches"},
        "torch_parity": {"stage_modules", "schedule", "mesh",
                         "stage_indices", "bucket_mb",
                         "overlap_all_reduce", "stand_ins",
                         "stages_apart"}},
}

# module -> {side: public names only that side has}. Why each:
ONE_SIDED_NAMES = {
    # torch's mirrored supervisor checks the user's model before it starts
    # replicas; a TensorFlow run's replicas share one process, which
    # checks it once anyway.
    "trainer": {"torch_parity": {"check_user_model"}},
    "steps": {
        # Keras' precision is a global policy; torch's is autocast and a
        # gradient scaler per step. TensorFlow's pipeline step, and its
        # step with the stages apart, are its runtime's method
        # (`make_train_step(apart=True)`); Keras' steps_per_execution has
        # no torch twin.
        "tfoverlap": {"apply_precision_policy", "example_batch",
                      "make_multi_step_train_step"},
        "torch_parity": {"autocast", "build_grad_scaler",
                         "make_apart_train_step",
                         "make_pipeline_train_step"},
    },
    # A tf.distribute strategy has no degrees of its own; torch's Strategy
    # carries its ParallelDims.
    "parallelize": {"tfoverlap": {"parallel_dims"}},
    # Stages on ranks need a mesh of process groups and their own gradient
    # averaging; TensorFlow's stages share one process or one traced step.
    # Inside that step a stage's work is timed by timestamps on its own
    # device, ordered by control dependencies; torch's ranks time theirs
    # on the host. Both run stages apart on stand-ins for their
    # neighbours' tensors (`StandIns`): torch's rank makes its own from the
    # first batch; TensorFlow's traced step gathers what crosses each cut
    # (`Crossings`) once, in a step of its own (`make_stand_ins`).
    "pipeline": {"torch_parity": {"PipelineMesh",
                                  "average_stage_buffers",
                                  "average_stage_gradients",
                                  "build_mesh_groups", "build_runtime"},
                 "tfoverlap": {"Crossings", "after", "make_stand_ins",
                               "stamp_after"}},
    # torch saves activations through autograd's saved-tensor hooks; Keras
    # wraps the layers instead (`Offloader`).
    "offload": {"torch_parity": {"ActivationOffload"}},
    # TensorFlow splits each layer over devices inside one graph; torch
    # runs the plan as a module over rank groups.
    "burst": {"tfoverlap": {"chain_layers", "check_plan",
                            "make_burst_forward", "placements_of_step",
                            "record_first_step_placements",
                            "widths_for_model"},
              "torch_parity": {"BurstModel", "build_groups"}},
    # The step ledger in the user's own loop: Keras' model.fit calls back a
    # Callback (whose timing the trainer's fit loop uses too); a
    # hand-written torch loop has nothing to call back from, so it marks
    # its phases itself, inside a context manager.
    "ledger": {"tfoverlap": {"FitStepTimer", "LedgerCallback"},
               "torch_parity": {"LoopLedger"}},
    # tf.distribute provides the strategies and reads TF_CONFIG; torch's
    # are written here (DDP, Horovod) over torchrun's environment.
    "distribute": {"tfoverlap": {"cluster_from_env", "cluster_resolver",
                                 "communication_options", "default_device",
                                 "describe_strategy", "is_default_strategy",
                                 "mirrored_devices", "mirrored_strategy",
                                 "replica_devices"},
                   "torch_parity": {"DDPStrategy", "HorovodStrategy",
                                    "Strategy", "apply_pipeline_dims",
                                    "check_strategy", "horovod_env",
                                    "is_launched"}},
}


def _public(module):
  return {name: obj for name, obj in vars(module).items()
          if not name.startswith("_")
          and (inspect.isfunction(obj) or inspect.isclass(obj))
          and obj.__module__ == module.__name__}


def _parameters(obj):
  """[(name, kind)] without self, *args and **kwargs."""
  kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional",
           inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
           inspect.Parameter.KEYWORD_ONLY: "keyword-only"}
  return [(p.name, kinds[p.kind])
          for p in inspect.signature(obj).parameters.values()
          if p.kind in kinds and p.name != "self"]


def _modules(name):
  return [importlib.import_module(f"{side}.{name}") for side in SIDES]


def _drift(module_name):
  """Every way the module's two sides differ that no list above allows."""
  found = []
  tf_mod, torch_mod = _modules(module_name)
  tf_names, torch_names = _public(tf_mod), _public(torch_mod)
  allowed_names = ONE_SIDED_NAMES.get(module_name, {})
  for side, own, other in (("tfoverlap", tf_names, torch_names),
                           ("torch_parity", torch_names, tf_names)):
    extra = set(own) - set(other)
    if extra != allowed_names.get(side, set()):
      found.append(f"{side}.{module_name}: one-sided names "
                   f"{sorted(extra)}, listed "
                   f"{sorted(allowed_names.get(side, set()))}")
  for name in sorted(set(tf_names) & set(torch_names)):
    tf_params = _parameters(tf_names[name])
    torch_params = _parameters(torch_names[name])
    tf_set = {p for p, _ in tf_params}
    torch_set = {p for p, _ in torch_params}
    common = tf_set & torch_set
    in_order = [[p for p in params if p[0] in common]
                for params in (tf_params, torch_params)]
    if in_order[0] != in_order[1]:
      found.append(f"{module_name}.{name}: shared parameters differ in "
                   f"order or kind: {in_order[0]} vs {in_order[1]}")
    allowed = ONE_SIDED_PARAMETERS.get((module_name, name), {})
    for side, own in (("tfoverlap", tf_set - torch_set),
                      ("torch_parity", torch_set - tf_set)):
      if own != allowed.get(side, set()):
        found.append(f"{side}.{module_name}.{name}: one-sided parameters "
                     f"{sorted(own)}, listed "
                     f"{sorted(allowed.get(side, set()))}")
  return found


@pytest.mark.parametrize("module_name", MODULES)
def test_both_sides_name_and_order_alike(module_name):
  assert _drift(module_name) == []


def test_every_allowance_names_a_module_compared():
  listed = {module for module, _ in ONE_SIDED_PARAMETERS} | set(
      ONE_SIDED_NAMES)
  assert listed <= set(MODULES)


@pytest.mark.parametrize("side", SIDES)
def test_each_side_provides_the_framework_side_protocol(side):
  """Each member of FrameworkSide is in the named module, with the
  Protocol's parameters in its order and kind (extras between or after
  are the framework's own, listed above)."""
  contract = framework_side.FrameworkSide
  members = [name for name, obj in vars(contract).items()
             if inspect.isfunction(obj) and not name.startswith("_")]
  assert set(members) == set(framework_side.MODULE_OF)
  for name in members:
    module = importlib.import_module(
        f"{side}.{framework_side.MODULE_OF[name]}")
    assert hasattr(module, name), f"{module.__name__} has no {name}"
    wanted = _parameters(getattr(contract, name))
    have = _parameters(getattr(module, name))
    wanted_names = {p for p, _ in wanted}
    assert [p for p in have if p[0] in wanted_names] == wanted, (
        f"{module.__name__}.{name}{inspect.signature(getattr(module, name))}"
        f" against the Protocol's {wanted}")


def test_the_drift_check_sees_a_reordered_signature():
  """The check above would fail for the drift this file exists to stop."""

  def tf_side(strategy, model, optimizer, *, task):
    del strategy, model, optimizer, task

  def torch_side(model, optimizer, strategy, *, task):
    del strategy, model, optimizer, task

  orders = [[p for p in _parameters(f)] for f in (tf_side, torch_side)]
  assert orders[0] != orders[1]
