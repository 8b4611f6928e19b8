"""The user's nn.Module and torch Dataset in the PyTorch trainer.

One real DDP run of a user's classifier on the user's map-style dataset
(module-scoped), the command line's refusals in one parametrized test, and
the rest in-process.
"""

import functools

import pytest
import torch

from overlap_core.runtime.config import ConfigError
from torch_parity import data, user_model
from tests import user_models, user_runs

config_of = functools.partial(user_runs.config_of, "torch_parity.train")
# (args, the flag refused, what its one line says)
BAD_USER_INPUT = [
    (["--model=tests.user_models:keras_classifier"], "--model",
     "returned a keras.src.models.functional.Functional; allowed: a "
     "torch.nn.Module"),
    (["--model=tests.user_models:torch_classifier",
      "--dataset=tests.user_models:torch_images_only"], "--dataset",
     "split 'train' yields a 1-tuple"),
]


def test_user_module_trains_on_user_dataset_under_ddp(tmp_path):
  record = user_runs.train_record(
      "torch_parity.train", tmp_path,
      "--model=tests.user_models:torch_classifier",
      "--dataset=tests.user_models:torch_images", "--image_size=8")
  assert record["model"]["source"] == {
      "source": "import", "value": "tests.user_models:torch_classifier"}
  assert record["data"]["source"] == {
      "source": "import", "value": "tests.user_models:torch_images"}
  assert record["strategy"]["parallel_dims"]["data_parallel"] == 2
  assert record["final"]["eval_examples"] == user_models.NUM_EXAMPLES["eval"]
  assert "eval_accuracy" in record["final"]


@pytest.mark.parametrize("args, flag, says", BAD_USER_INPUT)
def test_bad_user_input_is_one_line_and_writes_nothing(tmp_path, args, flag,
                                                       says):
  model_dir = user_runs.check_refused("torch_parity.train", tmp_path, args, flag,
                                      says)
  # Refused by the supervisor, before any replica held the directory.
  assert not model_dir.exists()


def _load(config):
  info = data.describe(config.data)

  def first_batch(spec):
    if ":" in config.data.dataset:
      source = data.sources.load_source(config.data)
      return user_model.first_batch_of(config.data.dataset,
                                       source.read("train")[0])
    return user_model.zoo_batch(spec, info)

  return user_model.load_model(config, info, first_batch=first_batch)


def test_regression_task_and_shape_mismatch(tmp_path):
  model, spec = _load(config_of(
      "--model=tests.user_models:torch_regression",
      "--dataset=tests.user_models:torch_regression_data"))
  assert spec.task == "regression" and model.training
  with pytest.raises(ConfigError, match=r"^--model=tests.user_models:"
                     r"torch_classifier: does not take the data's first "
                     r"batch \(inputs \[2, 6\]\): RuntimeError"):
    _load(config_of("--model=tests.user_models:torch_classifier",
                    "--dataset=tests.user_models:torch_regression_data"))
  saved = tmp_path / "net.keras"
  saved.write_bytes(b"")
  with pytest.raises(ConfigError, match="a .keras file is a Keras model"):
    user_model.load_model(config_of(f"--model={saved}"), None,
                          first_batch=None)


def test_untraceable_module_refuses_pipeline_and_burst_only():
  args = ["--model=tests.user_models:torch_untraceable",
          "--dataset=tests.user_models:torch_regression_data"]
  with pytest.raises(ConfigError, match=r"^--pipeline_stages=2: --model="
                     r"tests.user_models:torch_untraceable is .*Branchy: "
                     r"torch.fx cannot trace it \(TraceError"):
    _load(config_of(*args, "--pipeline_stages=2", "--pipeline_split=even",
                    "--evaluate=false"))
  model, _ = _load(config_of(*args))
  assert isinstance(model, torch.nn.Module)


def test_iterable_dataset_is_sharded_shuffled_and_resumed():
  config = config_of("--dataset=tests.user_models:torch_regression_stream",
                     "--batch_size=4", "--shuffle_buffer=8")

  def batches(rank, skip=0, count=16):
    loader = data.make_loader(config.data, split="train", task="regression",
                              seed=1, rank=rank, world_size=2,
                              skip_batches=skip)
    stream = iter(loader)
    return [next(stream) for _ in range(count)]

  rank0, rank1 = batches(0), batches(1)
  x, _ = user_models._regression_arrays("train")  # pylint: disable=protected-access
  seen0 = {tuple(r.tolist()) for b in rank0 for r in b[0]}
  # 16 batches of 2 (the global 4 over 2 ranks) are one epoch of rank 0's
  # 32 examples: each exactly once.
  assert seen0 == {tuple(r) for r in torch.from_numpy(x[0::2]).tolist()}
  assert not seen0 & {tuple(r.tolist()) for b in rank1 for r in b[0]}
  assert not torch.equal(rank0[0][0], torch.from_numpy(x[0:4:2]))  # shuffled
  resumed = batches(0, skip=5, count=3)
  for a, b in zip(resumed, rank0[5:8]):
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_plan_commands_trace_the_user_module_at_its_datas_shape():
  from torch_parity import plan  # pylint: disable=g-import-not-at-top
  config = config_of("--model=tests.user_models:torch_regression",
                     "--dataset=tests.user_models:torch_regression_data",
                     "--pipeline_stages=2", "--pipeline_split=even",
                     "--num_devices=2", "--evaluate=false")
  _, graph = plan.build_graph(config, 4)
  assert len(graph.nodes) == 3  # Linear, ReLU, Linear
  assert tuple(plan.make_input(config, 4).shape) == (4, user_models.FEATURES)
