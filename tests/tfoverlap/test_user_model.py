"""The user's Keras model and tf.data dataset in the TensorFlow trainer.

One real training run of a user's regression model on the user's data
(module-scoped), the command line's refusals in one parametrized test, and
the rest in-process.
"""

import functools
import hashlib
import os

import keras
import pytest
import tensorflow as tf

from overlap_core.runtime.config import ConfigError
from tfoverlap import data, user_model
from tests import user_models, user_runs

config_of = functools.partial(user_runs.config_of, "tfoverlap.train")
# (args, the flag refused, what its one line says)
BAD_USER_INPUT = [
    (["--model=tests.no_such_module:build"], "--model",
     "does not import: ModuleNotFoundError"),
    (["--model=tests.user_models:raising_builder"], "--model",
     "raised RuntimeError: no weights here"),
    (["--model=tests.user_models:keras_classifier",
      "--dataset=tests.user_models:tf_regression"], "--model",
     "does not take the data's first batch (inputs [2, 6])"),
]


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
  return user_runs.train_record(
      "tfoverlap.train", tmp_path_factory.mktemp("user_regression"),
      "--model=tests.user_models:keras_regression",
      "--dataset=tests.user_models:tf_regression", "--checkpoint=sync")


def test_user_model_trains_on_user_data_under_mirrored(regression_run):
  record = regression_run
  assert record["model"]["name"] == "tests.user_models:keras_regression"
  assert record["model"]["source"] == {
      "source": "import", "value": "tests.user_models:keras_regression"}
  assert record["data"]["source"] == {
      "source": "import", "value": "tests.user_models:tf_regression"}
  assert record["strategy"]["num_replicas"] == 2
  # The Task declared regression: MSE loss, mean absolute error reported.
  final = record["final"]
  assert final["eval_examples"] == user_models.NUM_EXAMPLES["eval"]
  assert final["eval_mean_abs_error"] > 0
  assert record["checkpoint"]["last_persisted_step"] == 3


@pytest.mark.parametrize("args, flag, says", BAD_USER_INPUT)
def test_bad_user_input_is_one_line_and_writes_nothing(tmp_path, args, flag,
                                                       says):
  model_dir = user_runs.check_refused("tfoverlap.train", tmp_path, args, flag,
                                      says)
  # The directory lock at most: no checkpoint, trace or run.json.
  assert set(os.listdir(model_dir) if model_dir.exists() else []) <= {"LOCK"}


def _load(config, info, first_batch):
  return user_model.load_model(config, info, strategy=tf.distribute
                               .get_strategy(), first_batch=first_batch)


def test_keras_file_loads_and_a_broken_one_is_refused(tmp_path):
  saved = str(tmp_path / "net.keras")
  user_models.keras_classifier(8, 3, 10).save(saved)
  config = config_of(f"--model={saved}", "--image_size=8")
  info = data.describe(config.data)
  model, spec = _load(config, info,
                      lambda spec: user_model.zoo_batch(spec, info))
  assert spec.task == "classification" and model.name == "user_cnn"
  broken = tmp_path / "broken.keras"
  broken.write_bytes(b"not a zip")
  with pytest.raises(ConfigError, match=r"^--model=.*broken.keras: does "
                     "not load with keras.saving.load_model"):
    _load(config_of(f"--model={broken}", "--image_size=8"), info,
          lambda spec: user_model.zoo_batch(spec, info))


def test_user_dataset_of_the_wrong_structure_is_refused():
  config = config_of("--dataset=tests.user_models:tf_images_only")
  with pytest.raises(ConfigError, match=r"^--dataset=tests.user_models:"
                     r"tf_images_only: split 'train' yields TensorSpec"):
    data.describe(config.data)
  config = config_of("--dataset=tests.user_models:torch_images")
  with pytest.raises(ConfigError, match="returned a torch.utils.data"):
    data.describe(config.data)


def test_data_service_refuses_a_dataset_that_runs_python():
  args = ["--dataset=tests.user_models:tf_generator"]
  assert data.describe(config_of(*args).data).num_train_examples == 0
  with pytest.raises(ConfigError, match=r"^--data_service=local: --dataset="
                     r"tests.user_models:tf_generator cannot be sent to the "
                     r"service's workers \(.*PyFunc is stateful"):
    data.describe(config_of(*args, "--data_service=local").data)


def test_user_data_is_batched_and_described():
  config = config_of("--dataset=tests.user_models:tf_images",
                     "--image_size=8", "--batch_size=4",
                     "--shuffle_buffer=0")
  info = data.describe(config.data)
  assert (info.num_train_examples, info.num_eval_examples) == (64, 16)
  assert (info.image_size, info.channels) == (8, 3)
  input_fn = data.make_input_fn(config.data, split="train",
                                task="classification", seed=0)
  images, labels = next(iter(input_fn(None)))
  expected, expected_labels = user_models._images("train", 8, 3, 10)  # pylint: disable=protected-access
  assert images.shape == (4, 8, 8, 3)
  assert (images.numpy() == expected[:4]).all()
  assert (labels.numpy() == expected_labels[:4]).all()


def test_subclassed_model_refuses_pipeline_and_burst_but_trains_without():
  info = data.describe(config_of().data)
  first = lambda spec: user_model.zoo_batch(spec, info)  # pylint: disable=unnecessary-lambda-assignment
  config = config_of("--model=tests.user_models:keras_subclassed",
                     "--pipeline_stages=2", "--pipeline_split=even",
                     "--evaluate=false")
  with pytest.raises(ConfigError, match=r"^--pipeline_stages=2: "
                     r"--model=tests.user_models:keras_subclassed is "
                     r".*Net, a subclassed keras.Model"):
    _load(config, info, first)
  model, _ = _load(config_of("--model=tests.user_models:keras_subclassed"),
                   info, first)
  assert model.built and model.trainable_weights  # the probe built it
  assert isinstance(model, keras.Model)


def test_keras_file_digest_in_origin(tmp_path):
  saved = str(tmp_path / "net.keras")
  user_models.keras_classifier(8, 3, 10).save(saved)
  from overlap_core.runtime import user_code  # pylint: disable=g-import-not-at-top
  with open(saved, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  assert user_code.model_origin(saved).describe()["sha256"] == digest


def test_plan_command_reads_the_user_models_graph():
  # What tfoverlap.plan builds (less its thread setting, which a process
  # whose TensorFlow already started cannot change).
  from tfoverlap.planning.graph import build_layer_graph  # pylint: disable=g-import-not-at-top
  config = config_of("--model=tests.user_models:keras_classifier",
                     "--dataset=tests.user_models:tf_images",
                     "--image_size=8", "--pipeline_stages=2",
                     "--pipeline_split=even", "--num_devices=2")
  model, shape = user_model.load_for_planning(config)
  assert shape == (8, 8, 3)
  graph = build_layer_graph(model, batch_size=4, name=config.model.name)
  assert [n.name for n in graph.nodes] == ["conv", "pool", "logits"]
