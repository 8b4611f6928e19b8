"""The campaign's parts, as data: what each runs on a GPU and in a dry run.

A part is a few commands of the existing benchmark drivers with GPU-sized
settings; the drivers measure, the campaign only composes them. Every part
must end within PART_LIMIT_MIN on one H200 and the whole table within
CAMPAIGN_LIMIT_MIN (the GPU machine lends 10-minute commands, 30 minutes in
all). The minutes are estimates until a campaign has measured them.

A dry run (a CPU host) runs the first command of every part with tiny
sizes (`dry_args`); a command that needs CUDA to mean anything has none.
"""

import dataclasses
from typing import Optional, Tuple

from overlap_core.runtime import zoo

PART_LIMIT_MIN = 8.0
CAMPAIGN_LIMIT_MIN = 25.0
# Result formats: the flag that tells a command where to write, and the
# file's extension.
OUTPUT_FLAGS = {"json": ("--output", ".json"),
                "junit": ("--junitxml", ".xml")}

# Every test module holding a `tests.needs_cuda` test; none imports
# TensorFlow (the GPU machine has none). tests/benchmarks/
# test_gpu_campaign.py checks that this list names them all.
CUDA_TEST_FILES = (
    "tests/torch_parity/test_background_cuda.py",
    "tests/torch_parity/test_burst.py",
    "tests/torch_parity/test_checkpoint.py",
    "tests/torch_parity/test_data_cuda.py",
    "tests/torch_parity/test_offload_cuda.py",
)
RESNET50 = "resnet50_synthetic224_resident_default"  # common.GPU_TRAINER_PRESETS
# The dry run's sizes: a step takes well under a second on a CPU.
TINY_TRAINER = ("--image_size=32", "--batch_size=2")
# The dry runs of the input and checkpoint parts train the small CNN: on a
# CPU a ResNet-50 step takes 150 ms at the tiny size, and each of their
# trainer processes times 36 of them alone before training, most of the
# suite's slowest test. The throughput part's dry run still builds and
# trains ResNet-50, so the model is checked there.
DRY_MODEL = ("--model=small_cnn",)
ONE_REPEAT = ("--repeats=1", "--redo_busy=0")


@dataclasses.dataclass(frozen=True)
class Command:
  """One benchmark command of a part.

  Attributes:
    label: names its result inside the part's file.
    module: run as `python -m module`.
    args: on a GPU.
    dry_args: on a CPU host with tiny sizes; None where it needs CUDA.
    output: a key of OUTPUT_FLAGS.
  """
  label: str
  module: str
  args: Tuple[str, ...]
  dry_args: Optional[Tuple[str, ...]]
  output: str = "json"


@dataclasses.dataclass(frozen=True)
class Part:
  """A part: commands that end within PART_LIMIT_MIN on one H200.

  Attributes:
    name: --part=name.
    minutes: expected minutes on one H200 (an estimate until measured).
    goal: what it measures, and its target.
    commands: run in order.
    models: zoo models it trains (checked against the zoo).
    notes: what its results file must say besides its numbers.
    requires: modules that must be importable on the GPU machine.
  """
  name: str
  minutes: float
  goal: str
  commands: Tuple[Command, ...]
  models: Tuple[str, ...] = ()
  notes: Tuple[str, ...] = ()
  requires: Tuple[str, ...] = ("absl",)


def _throughput(precision: str, label: str) -> Command:
  args = (f"--configs={RESNET50}", "--repeats=3", f"--precision={precision}")
  return Command(label, "benchmarks.torch_trainer_overhead", args,
                 (f"--configs={RESNET50}", *ONE_REPEAT, "--train_steps=3",
                  f"--precision={precision}", *TINY_TRAINER))


def _offload_table(label: str, models: Tuple[str, ...]) -> Command:
  model_flag = "--models=" + ",".join(models)
  return Command(label, "benchmarks.offload",
                 ("--device=cuda", model_flag, "--steps=10", "--repeats=3",
                  "--max_batch=0"),
                 # The dry run builds one model at the smallest size it
                 # takes (--list checks the names against the zoo), in the
                 # baseline every ratio needs and the row that runs the most
                 # offload machinery: a CPU step of each costs seconds.
                 ("--device=cpu", f"--models={models[0]}",
                  f"--image_size={zoo.MODELS[models[0]].min_image_size}",
                  "--modes=baseline,prefetch", "--batch_size=2", "--steps=1",
                  *ONE_REPEAT, "--max_batch=0"))


def _offload_batch_search(label: str, models: Tuple[str, ...]) -> Command:
  # One repeat of two steps gives the offloaded bytes that cap the search
  # by host memory; the search itself is the cost.
  model_flag = "--models=" + ",".join(models)
  return Command(label, "benchmarks.offload",
                 ("--device=cuda", model_flag, "--steps=2", *ONE_REPEAT,
                  "--max_batch=1024"), None)


# One process: the few CUDA tests share the one GPU, and the GPU host's
# pytest may lack the worker plugin that pytest.ini's addopts name.
_CUDA_TEST_ARGS = ("-o", "addopts=-ra", "-m", "cuda", "-q", "-p",
                   "no:cacheprovider", *CUDA_TEST_FILES)
_CKPT_BASE = ("--framework=pytorch", "--model=resnet50", "--cadences=auto")
_INPUT_BASE = ("--framework=pytorch", "--model=resnet50",
               "--cost_multiples=0")
_STUDY_MODELS = ("vgg19", "resnet50", "inception_v3", "wide_resnet50_2")

PARTS = (
    Part("cuda_tests", 1.5,
         "every test that skips without CUDA (pytest -m cuda), run",
         (Command("pytest", "pytest", _CUDA_TEST_ARGS, _CUDA_TEST_ARGS,
                  output="junit"),),
         requires=("absl", "pytest")),
    Part("throughput", 4.5,
         "ResNet-50 224x224, synthetic batches on the device: the trainer "
         "against a plain loop, paired and interleaved, bfloat16 autocast "
         "and float32; target: overhead <= 2%",
         (_throughput("float32", "float32"),
          _throughput("mixed_bfloat16", "bfloat16")),
         models=("resnet50",)),
    Part("input", 3.0,
         "ResNet-50 224x224 fed by DataLoader workers, pinned memory and "
         "prefetch to the device, against batches resident on the device; "
         "target: data wait <= 2% of the step",
         (Command("data_wait", "benchmarks.data_wait",
                  (*_INPUT_BASE, "--image_size=224", "--batch_size=128",
                   "--modes=autotune,to_device", "--train_steps=100",
                   "--repeats=3"),
                  (*_INPUT_BASE, *DRY_MODEL, *TINY_TRAINER,
                   "--modes=to_device",
                   "--train_steps=4", "--calibration_runs=1",
                   *ONE_REPEAT)),),
         models=("resnet50",)),
    Part("checkpoint", 3.5,
         "ResNet-50 224x224: async at the auto cadence against no "
         "checkpoints, with sync at auto as the baseline; total overhead "
         "and stall per checkpoint; target: async within its 3% bound",
         (Command("checkpoint_overhead", "benchmarks.checkpoint_overhead",
                  (*_CKPT_BASE, "--modes=sync,async", "--image_size=224",
                   "--batch_size=128", "--train_steps=150", "--repeats=3"),
                  (*_CKPT_BASE, *DRY_MODEL, "--modes=async", *TINY_TRAINER,
                   "--train_steps=4", *ONE_REPEAT)),),
         models=("resnet50",),
         notes=("tf_async is not run: TensorFlow's "
                "CheckpointOptions(enable_async=True) has no PyTorch "
                "equivalent, and the GPU machine has no TensorFlow",)),
    Part("offload_a", 3.0,
         "the large-image offload table at 224x224, batch 32: baseline, "
         "naive, pinned, non_blocking, both, prefetch",
         (_offload_table("table", _STUDY_MODELS[:2]),),
         models=_STUDY_MODELS[:2], requires=()),
    Part("offload_b", 4.0,
         "the large-image offload table at 224x224, batch 32 (as offload_a)",
         (_offload_table("table", _STUDY_MODELS[2:]),),
         models=_STUDY_MODELS[2:], requires=()),
    Part("offload_c", 4.0,
         "the largest batch without offload and with it (pinned, "
         "non-blocking), up to 1024, for the four study models",
         (_offload_batch_search("batch_search", _STUDY_MODELS),),
         models=_STUDY_MODELS, requires=(),
         notes=("a search that reaches 1024 records the limit as not "
                "found",)),
    Part("multiplex", 1.5,
         "a VGG-16 foreground alone and beside the CUDA background job "
         "(CUDA graph, lowest-priority stream), and the job alone; "
         "targets: foreground <= 5% slower, job >= half its rate alone",
         (Command("gpu_multiplex", "benchmarks.burst",
                  ("--gpu_multiplex", "--repeats=5"), None),),
         models=("vgg16",), requires=()),
)

PARTS_BY_NAME = {part.name: part for part in PARTS}


def command_line(command: Command, output_path: str, *, dry_run: bool
                 ) -> list:
  """`python -m` arguments of one command, writing to `output_path`; a
  dry run of a command without dry_args shows its GPU arguments."""
  use_dry = dry_run and command.dry_args is not None
  args = command.dry_args if use_dry else command.args
  flag, _ = OUTPUT_FLAGS[command.output]
  return ["-m", command.module, *args, f"{flag}={output_path}"]
