"""What each framework side provides, in one place.

`tfoverlap/` (TensorFlow/Keras) and `torch_parity/` (PyTorch) each provide
the members of `FrameworkSide`, every one in the module `MODULE_OF` names
(`<side>.<module>.<member>`), with the parameters written here, in this
order. A framework's own extras come after them, keyword-only, and say
why beside them. `tests/test_symmetry.py` holds both sides to it.

The types are the frameworks' own (a Keras model, a torch module), so this
file names them `Any`: the contract is the names and the order. It imports
no framework; a side is checked against it by importing the side's modules:

  steps = importlib.import_module(f"{side}.{MODULE_OF['make_train_step']}")
  inspect.signature(steps.make_train_step)  # (model, optimizer, strategy, ...)
"""

from typing import Any, Callable, Mapping, Optional, Protocol

# Which module of a side holds each member of `FrameworkSide`.
MODULE_OF: Mapping[str, str] = {
    "build_model": "models",
    "build_optimizer": "steps",
    "make_train_step": "steps",
    "make_burst_train_step": "steps",
    "make_pipeline_loss": "steps",
    "evaluate": "steps",
    "build_strategy": "distribute",
    "make_agree": "distribute",
    "parallelize": "parallelize",
    "apply_pipeline": "parallelize",
    "apply_burst": "parallelize",
    "apply_offload": "offload",
    "build_stages": "pipeline",
    "plan_split": "pipeline",
    "check_pipeline_supported": "pipeline",
    "Checkpointer": "checkpoint",
    "check_supported": "trainer",
    "train": "trainer",
}


class FrameworkSide(Protocol):
  """The contract: one method per job, named as on both sides."""

  def build_model(self, name: str, *, image_size: int, num_classes: int,
                  channels: int = 3) -> Any:
    """The zoo's model `name`, untrained."""

  def build_optimizer(self, cfg: Any) -> Any:
    """The --optimizer of `cfg` (PyTorch also takes the parameters)."""

  def make_train_step(self, model: Any, optimizer: Any, strategy: Any, *,
                      task: str) -> Callable:
    """train_step(batch) -> the global mean loss."""

  def make_burst_train_step(self, burst: Any, *, task: str,
                            global_batch_size: int) -> Callable:
    """train_step(batch) -> the global mean loss, for a burst plan."""

  def make_pipeline_loss(self, task: str) -> Callable:
    """The last stage's loss of one micro-batch."""

  def evaluate(self, model: Any, batches: Any, strategy: Any, *,
               task: str) -> dict:
    """One pass over the eval data: eval_loss, eval_accuracy or
    eval_psnr_db, eval_examples."""

  def build_strategy(self, cfg: Any) -> Any:
    """The --strategy of a DistributeConfig."""

  def make_agree(self, strategy: Any) -> Callable:
    """agree(flag) -> whether every replica's flag is set."""

  def parallelize(self, strategy: Any, build_model: Callable,
                  build_optimizer: Callable, offload: Any = None,
                  pipeline: Optional[Any] = None,
                  burst: Optional[Any] = None) -> Any:
    """The model and optimizer with the run's parallelism applied, in the
    order both sides share: pipeline, burst, data parallelism, offload."""

  def apply_pipeline(self, strategy: Any, build_model: Callable,
                     build_optimizer: Callable, spec: Any) -> Any:
    """Pipeline stages."""

  def apply_burst(self, strategy: Any, build_model: Callable,
                  build_optimizer: Callable, spec: Any) -> Any:
    """A burst plan in place of data parallelism."""

  def apply_offload(self, model: Any, config: Any) -> Optional[Any]:
    """What --offload_* keeps in host memory; None when nothing."""

  def build_stages(self, model: Any, cut_layers: Any) -> list:
    """The model as len(cut_layers) + 1 stages sharing its weights."""

  def plan_split(self, model: Any, cfg: Any, *,
                 profile: Optional[Any] = None, name: str = "") -> Any:
    """The stages of the flags' split, on the model's layer graph."""

  def check_pipeline_supported(self, config: Any, *,
                               num_gpus: Optional[int] = None) -> None:
    """The pipeline's counts and profile (the compatibility table has
    already refused what does not combine)."""

  def Checkpointer(self, cfg: Any, directory: str, *, model: Any,  # pylint: disable=invalid-name
                   optimizer: Any) -> Any:
    """Saves and restores the model and optimizer (a class on both sides)."""

  def check_supported(self, config: Any, *,
                      num_gpus: Optional[int] = None) -> None:
    """Refuses, in one ConfigError, what this framework cannot honour."""

  def train(self, config: Any) -> Any:
    """Runs training as configured."""
