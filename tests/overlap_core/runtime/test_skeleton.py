"""The run's order, written once (`overlap_core.runtime.skeleton`), with a
side in plain Python: the hooks run in order, the worker directory is held
from before the build to after run.json, and a failure ends the same way."""

import json
import os
import types

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime import dir_lock, ledger as ledger_lib
from overlap_core.runtime import run_record, skeleton
from overlap_core.runtime.config import ConfigError
from overlap_core.runtime.loop_context import after_step

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()  # defaults, as a trainer sees them


def _config(model_dir: str):
  with flagsaver.as_parsed(model_dir=model_dir, train_steps="3",
                           progress="false", trace="false"):
    return tfo_flags.to_config()


def _held_by_another_writer(directory: str) -> bool:
  try:
    dir_lock.acquire(directory).release()
  except dir_lock.DirectoryInUseError:
    return True
  return False


class _Checkpointer:
  """Saves nothing; notes whether the directory is held at its final save."""

  def __init__(self, calls, out_dir):
    self._calls, self._out_dir = calls, out_dir

  def restore_latest(self):
    return None

  def is_due(self, step):
    return False

  def finish(self, step):
    self._calls.append(("finish", step,
                        _held_by_another_writer(self._out_dir)))

  def close(self):
    self._calls.append("close")

  def stats(self):
    return {}


class _PlainSide:
  """Every hook of `skeleton.Side`, recording its call; `fail` names a hook
  that raises the given error instead."""

  framework = "plain"

  def __init__(self, fail=None, error=None):
    self.calls = []
    self._fail, self._error = fail, error
    self.out_dir = None

  def _call(self, name):
    self.calls.append(name)
    if name == self._fail:
      raise self._error

  def check_supported(self, config):
    self._call("check_supported")

  def join(self, config):
    self._call("join")
    return skeleton.World()

  def leave(self):
    self._call("leave")

  def configure_host(self, config):
    self._call("configure_host")
    self.out_dir = config.run.model_dir
    return config

  def stop_services(self):
    self._call("stop_services")

  def describe_data(self, config):
    self._call("describe_data")
    return types.SimpleNamespace(num_train_examples=30, num_eval_examples=10)

  def parallelize(self, config, spec, info, plan):
    self._call("parallelize")
    return types.SimpleNamespace(model="model", optimizer="optimizer",
                                 offload=None)

  def make_checkpointer(self, config, built, world, describe_state):
    self._call("make_checkpointer")
    return _Checkpointer(self.calls, self.out_dir)

  def make_scalar_writer(self, logdir, every_steps, ledger):
    self._call("make_scalar_writer")
    write = lambda step, loss: None
    write.close = lambda: self.calls.append("close_scalars")
    return write

  def make_background(self, config, out_dir, *, first_step, last_step):
    self._call("make_background")

  def run_loop(self, ctx, config, spec, built):
    self._call("run_loop")
    # A second writer is refused while the steps run.
    assert _held_by_another_writer(self.out_dir)
    for step in range(ctx.first_step, ctx.last_step + 1):
      with ctx.ledger.phase(ledger_lib.COMPUTE):
        pass
      after_step(ctx, step, 0.5)
    return 0.5

  def after_training(self, config, built, ledger):
    self._call("after_training")

  def stage_conditions(self, config):
    self._call("stage_conditions")

  def evaluate(self, config, spec, model):
    self._call("evaluate")
    return {"eval_accuracy": 1.0}

  def cpu_of_processes(self, config, ledger):
    self._call("cpu_of_processes")

  def notes(self, config, built, restored_step):
    self._call("notes")
    return ["plain"]

  def phases_measured(self, config, built):
    self._call("phases_measured")
    return list(ledger_lib.PHASES)

  def phases_derived(self, config, built):
    self._call("phases_derived")
    return []

  def describe_environment(self):
    self._call("describe_environment")
    return {}

  def describe_strategy(self, config, built, plan, ledger):
    self._call("describe_strategy")
    return {"class": "plain"}

  def num_params(self, model):
    self._call("num_params")
    return 1

  def weights_digest(self, model):
    self._call("weights_digest")
    return "digest"


def test_hooks_run_in_order_and_the_lock_spans_the_final_save(tmp_path):
  side = _PlainSide()
  record = skeleton.run(side, _config(str(tmp_path)))
  assert side.calls == [
      "check_supported", "join", "configure_host", "describe_data",
      "parallelize", "make_checkpointer", "make_scalar_writer", "run_loop",
      # The final save, while this run still holds the directory.
      ("finish", 3, True), "close_scalars", "after_training", "evaluate",
      "cpu_of_processes", "stop_services", "notes", "describe_environment",
      "describe_strategy", "num_params", "weights_digest", "phases_measured",
      "phases_derived", "leave"]
  assert record["final"] == {"train_loss": 0.5, "eval_accuracy": 1.0}
  with open(os.path.join(tmp_path, run_record.RUN_RECORD_NAME)) as f:
    assert json.load(f)["steps"] == 3
  assert not _held_by_another_writer(str(tmp_path))


def test_a_failing_loop_closes_the_checkpointer_and_releases_the_lock(
    tmp_path):
  side = _PlainSide(fail="run_loop", error=RuntimeError("lost a peer"))
  with pytest.raises(RuntimeError, match="lost a peer"):
    skeleton.run(side, _config(str(tmp_path)))
  assert side.calls[-3:] == ["close", "stop_services", "leave"]
  assert not _held_by_another_writer(str(tmp_path))
  assert not os.path.exists(os.path.join(tmp_path,
                                         run_record.RUN_RECORD_NAME))


@pytest.mark.parametrize("hook", ["check_supported", "configure_host",
                                  "parallelize"])
def test_a_hooks_config_error_propagates_unchanged(tmp_path, hook):
  error = ConfigError("pipeline_stages", 3, "allowed: a divisor of 4")
  side = _PlainSide(fail=hook, error=error)
  with pytest.raises(ConfigError) as raised:
    skeleton.run(side, _config(str(tmp_path)))
  assert raised.value is error
  assert not _held_by_another_writer(str(tmp_path))
  # What was joined is left, whatever failed after it.
  assert ("leave" in side.calls) == (hook != "check_supported")
