"""The user's model and data by import path: parsing, importing, calling,
and the flags' refusals, framework-free and in-process."""

import functools
import hashlib
import os

import pytest

from overlap_core.runtime import run_record, user_code, zoo
from overlap_core.runtime.config import ConfigError

from tests import user_runs
from tests.helpers import one_line_error

config_of = functools.partial(user_runs.config_of, "tfoverlap.train")


def test_model_flag_forms(tmp_path):
  saved = tmp_path / "net.keras"
  saved.write_bytes(b"not really a model")
  assert user_code.model_kind("resnet18") == user_code.ZOO
  assert user_code.model_kind("pkg.mod:build") == user_code.IMPORT
  assert user_code.model_kind("pkg.mod:Factory.build") == user_code.IMPORT
  assert user_code.model_kind(str(saved)) == user_code.KERAS_FILE
  for bad in ("resnet", "pkg.mod", "pkg.mod:", "pkg mod:build"):
    message = one_line_error(user_code.model_kind, bad, error=ConfigError)
    assert message.startswith(f"--model={bad}: allowed: a zoo model"), bad
  assert "no such .keras file" in one_line_error(
      user_code.model_kind, str(tmp_path / "gone.keras"), error=ConfigError)


def test_load_callable_names_what_is_wrong():
  assert user_code.load_callable("model", "tests.user_models:raising_builder")
  missing = one_line_error(user_code.load_callable, "model",
                           "tests.no_such_module:build", error=ConfigError)
  assert missing.startswith("--model=tests.no_such_module:build: module "
                            "'tests.no_such_module' does not import: "
                            "ModuleNotFoundError: No module named")
  no_attr = one_line_error(user_code.load_callable, "dataset",
                           "tests.user_models:nothing", error=ConfigError)
  assert no_attr == ("--dataset=tests.user_models:nothing: module "
                     "'tests.user_models' has no attribute 'nothing'")
  not_callable = one_line_error(user_code.load_callable, "model",
                                "tests.user_models:FEATURES",
                                error=ConfigError)
  assert "'FEATURES' is a int, not a callable" in not_callable


def test_builder_gets_only_the_settings_it_names():
  settings = {name: name.upper() for name in user_code.SETTINGS}
  seen = {}

  def build(channels, seed, other=None):
    seen.update(channels=channels, seed=seed, other=other)

  user_code.call_with_settings("model", "p:b", build, settings)
  assert seen == {"channels": "CHANNELS", "seed": "SEED", "other": None}

  def load(split, **kwargs):
    return split, kwargs

  assert user_code.call_with_settings("dataset", "p:l", load, settings,
                                      "eval") == ("eval", settings)


def test_builder_that_raises_is_one_line_with_type_and_message():
  def build():
    raise ValueError("bad width\nsecond line")

  message = one_line_error(user_code.call_with_settings, "model", "p:b",
                           build, {}, error=ConfigError)
  assert message == "--model=p:b: p:b raised ValueError: bad width"


def test_result_is_a_model_or_model_and_task():
  model, task = user_code.split_model_result("p:b", 3, int, "an int")
  assert (model, task) == (3, user_code.Task())
  regression = user_code.Task.regression()
  assert user_code.split_model_result("p:b", (3, regression), int,
                                      "an int") == (3, regression)
  message = one_line_error(user_code.split_model_result, "p:b", "3", int,
                           "an int", error=ConfigError)
  assert message == ("--model=p:b: returned a builtins.str; allowed: an "
                     "int, or (an int, Task)")


def test_task_spec_and_refusals():
  assert user_code.Task.super_resolution(2).spec() == zoo.ModelSpec(
      zoo.SUPER_RESOLUTION, 1, upscale=2)
  with pytest.raises(ValueError, match="kind='ranking'"):
    user_code.Task("ranking")
  with pytest.raises(ValueError, match="upscale=0"):
    user_code.Task.super_resolution(0)
  message = one_line_error(user_code.check_task_and_data, "p:b",
                           user_code.Task.regression(), "digits",
                           error=ConfigError)
  assert message.startswith("--dataset=digits: --model=p:b declares a "
                            "regression task")
  user_code.check_task_and_data("p:b", user_code.Task.regression(), "p:d")


def test_origin_records_a_keras_files_digest(tmp_path):
  saved = tmp_path / "net.keras"
  saved.write_bytes(b"weights")
  origin = user_code.model_origin(str(saved)).describe()
  assert origin == {"source": "keras_file", "value": str(saved),
                    "sha256": hashlib.sha256(b"weights").hexdigest()}
  assert user_code.model_origin("small_cnn").describe() == {
      "source": "zoo", "value": "small_cnn"}
  assert user_code.data_origin("p.m:load").describe() == {
      "source": "import", "value": "p.m:load"}


def test_flags_take_import_paths_and_refuse_what_cannot_act():
  config = config_of("--model=tests.user_models:keras_regression",
                     "--dataset=tests.user_models:tf_regression",
                     "--image_size=1")
  assert config.model.name == "tests.user_models:keras_regression"
  assert config.data.dataset == "tests.user_models:tf_regression"
  with pytest.raises(ConfigError, match=r"^--cache=True: --dataset=p.m:d "
                     "returns its own decoded samples"):
    config_of("--dataset=p.m:d", "--cache")
  with pytest.raises(ConfigError, match=r"^--preprocess_cost_ms=0.5: adds "
                     "work to the zoo's decoding"):
    config_of("--dataset=p.m:d", "--preprocess_cost_ms=0.5")
  with pytest.raises(ConfigError, match=r"^--dataset=mnist: allowed: "
                     "digits, synthetic, tfds, image_folder, or "
                     "package.module:callable"):
    config_of("--dataset=mnist")
  with pytest.raises(ConfigError, match=r"^--model=resnet: allowed"):
    config_of("--model=resnet")


def test_default_model_dir_of_an_import_path_is_one_directory():
  path = run_record.default_model_dir("pytorch", "my.pkg:build")
  assert os.path.dirname(path) == "runs"
  assert os.path.basename(path).startswith("pytorch-my.pkg-build-")
