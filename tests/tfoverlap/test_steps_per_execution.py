"""--steps_per_execution: K optimizer steps per traced call, TensorFlow side.

The same steps in fewer calls must train the same weights, bit for bit
under --deterministic (the ops and their order do not change, only how
often Python dispatches them), and must stop, checkpoint and resume at
exactly the steps a run of one step per call does.
"""

import glob
import os
import re
import time

import keras
import pytest
import tensorflow as tf
from absl.testing import flagsaver

import flags as tfo_flags

from overlap_core.runtime.config import ConfigError
from overlap_core.runtime.zoo import CLASSIFICATION
from tfoverlap import steps, trainer
from tfoverlap.loops import execution_sizes

from tests.helpers import run_module
from tests.tfoverlap.train_here import train_here

EXACT = {"model": "mlp", "dataset": "digits", "batch_size": "32",
         "deterministic": "true", "log_every_steps": "5",
         "tensorboard": "false", "trace": "false", "evaluate": "false"}


tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()


def _train(model_dir, **flags):
  """Trains with EXACT and `flags` in this process (the test of the
  command's refusal below still runs it); returns the run record."""
  return train_here(model_dir=str(model_dir), **{**EXACT, **flags})


def test_calls_end_at_multiples_of_k_also_after_any_resume():
  assert list(execution_sizes(1, 10, 4)) == [(1, 4), (5, 4), (9, 2)]
  # Resumed after step 6: the first call only reaches step 8.
  assert list(execution_sizes(7, 12, 4)) == [(7, 2), (9, 4)]
  assert list(execution_sizes(3, 3, 4)) == [(3, 1)]
  assert not list(execution_sizes(11, 10, 4))
  assert list(execution_sizes(1, 3, 1)) == [(1, 1), (2, 1), (3, 1)]


@pytest.mark.parametrize("overrides, flag", [
    # Checkpoints fall between traced calls, and model.fit runs whole ones.
    ({"checkpoint": "async", "checkpoint_every": "6"}, "checkpoint_every"),
    ({"loop": "fit", "strategy": "default", "train_steps": "10"},
     "train_steps"),
])
def test_what_falls_inside_a_call_is_refused_naming_the_flag(overrides,
                                                             flag):
  with flagsaver.as_parsed(steps_per_execution="4", **overrides):
    config = tfo_flags.to_config()
  with pytest.raises(ConfigError) as error:
    trainer.check_supported(config, num_gpus=0)
  assert error.value.flag == flag
  assert str(error.value).startswith(f"--{flag}=")
  assert "--steps_per_execution=4" in str(error.value)


@pytest.mark.parametrize("every", ["8", "auto"])
def test_a_cadence_that_lands_between_calls_is_taken(every):
  with flagsaver.as_parsed(steps_per_execution="4", checkpoint="async",
                           checkpoint_every=every):
    trainer.check_supported(tfo_flags.to_config(), num_gpus=0)


# model.fit runs several steps per call on one replica only: Keras 3 fails
# to run them under a replicated strategy (refused, see test_train).
@pytest.mark.parametrize("loop, strategy", [("ctl", "mirrored"),
                                            ("fit", "default")])
def test_k_steps_per_call_train_the_weights_of_one_step_per_call(
    tmp_path, loop, strategy):
  args = {"loop": loop, "strategy": strategy, "train_steps": "12"}
  one = _train(tmp_path / "k1", **args)
  four = _train(tmp_path / "k4", **args, steps_per_execution="4")
  assert four["weights_digest"] == one["weights_digest"]
  # No step more or less: model.fit would run a whole last execution.
  assert four["steps"] == one["steps"] == 12
  assert four["steps_per_execution"] == 4
  assert one["steps_per_execution"] == 1
  # The input is read inside the call, and under --deterministic no clock
  # may be read in the graph, so no data wait is measured apart; the record
  # says how the per-step figures were made.
  assert "data_wait" not in four["phases_measured"]
  assert four["phases"]["compute"]["mean"] > 0
  if loop == "ctl":
    assert any("steps per traced call" in n and "op determinism" in n
               for n in four["notes"])


def test_the_custom_loop_times_each_calls_data_wait_in_the_graph(tmp_path):
  record = _train(tmp_path, deterministic="false", train_steps="8",
                  steps_per_execution="4")
  assert "data_wait" in record["phases_measured"]
  assert record["phases"]["data_wait"]["mean"] >= 0
  assert any("timed in the graph" in n for n in record["notes"])


def test_a_resume_between_calls_realigns_and_ends_like_an_uninterrupted_run(
    tmp_path):
  """Stopped after step 6 by a run of one step per call, resumed at K=4:
  the first call runs steps 7-8 only, so the cadence of 4 still lands on
  call ends (8 and 12), and the weights are the uninterrupted run's."""
  whole = _train(tmp_path / "whole", strategy="default", train_steps="12")
  model_dir = tmp_path / "resumed"
  _train(model_dir, strategy="default", train_steps="6", checkpoint="sync",
         checkpoint_every="3", checkpoint_keep="5")
  resumed = _train(model_dir, strategy="default", train_steps="12",
                   checkpoint="sync", checkpoint_every="4",
                   checkpoint_keep="5", steps_per_execution="4")
  assert resumed["steps"] == 6
  assert resumed["weights_digest"] == whole["weights_digest"]
  steps = sorted({int(re.match(r"ckpt-(\d+)", os.path.basename(p)).group(1))
                  for p in glob.glob(str(model_dir / "checkpoints" /
                                         "ckpt-*"))})
  assert steps == [3, 6, 8, 12]


def test_fit_refuses_a_resume_that_leaves_a_partial_execution(tmp_path):
  _train(tmp_path, strategy="default", train_steps="6", checkpoint="sync",
         checkpoint_every="3")
  result = run_module("tfoverlap.train", f"--model_dir={tmp_path}",
                      *(f"--{name}={value}" for name, value in EXACT.items()),
                      "--strategy=default", "--train_steps=12",
                      "--loop=fit", "--steps_per_execution=4",
                      "--checkpoint=sync", "--checkpoint_every=4",
                      timeout=600)
  assert result.returncode == 2, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert "--steps_per_execution=4" in last and "6 steps remain" in last


# The sleep here is the slow work under test (a slow input, a slow forward
# pass), not a stand-in for an event. A sleep lasts at least this long on
# any host, so the slow-input test holds for any length; the compute test
# needs only that it outlast handing over an in-memory batch (microseconds),
# so half a second is the margin against a host that stalls the process.
PAUSE_S = 0.5


def _pause(tensor):
  """`tensor`, after at least PAUSE_S of waiting in the graph."""
  def sleep():
    time.sleep(PAUSE_S)
    return 0.0
  pause = tf.py_function(sleep, [], tf.float32)
  pause.set_shape([])
  return tensor + tf.stop_gradient(pause)


class _PausingDense(keras.layers.Dense):
  """A Dense layer whose forward pass takes at least PAUSE_S."""

  def call(self, inputs):
    return _pause(super().call(inputs))


def _time_waits(model, dataset, num_steps=3):
  """Runs one call of `num_steps` steps; each step's measured data wait."""
  train_steps = steps.make_multi_step_train_step(
      model, keras.optimizers.SGD(0.1), tf.distribute.get_strategy(),
      task=CLASSIFICATION, global_batch_size=4, time_waits=True)
  _, waits = train_steps(iter(dataset), tf.constant(num_steps))
  return waits.numpy()


def _batches(produce=lambda batch: batch):
  inputs, labels = tf.ones((4, 3)), tf.zeros((4,), tf.int32)
  options = tf.data.Options()
  # No element may be made ahead of its request: each one's cost then
  # falls on the step that asks for it.
  options.autotune.enabled = False
  options.experimental_optimization.inject_prefetch = False
  return (tf.data.Dataset.range(100).map(lambda _: produce((inputs, labels)))
          .with_options(options))


def test_the_wait_timed_in_the_graph_holds_a_slow_input():
  """Each batch takes at least PAUSE_S to make and none is made ahead: a
  wait that starts where the step may begin and ends where its batch is in
  hand holds at least that."""
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  waits = _time_waits(model, _batches(
      lambda batch: (_pause(batch[0]), batch[1])))
  assert len(waits) == 3
  assert min(waits) >= PAUSE_S, waits


def test_the_wait_timed_in_the_graph_leaves_the_compute_out():
  """Each step's forward pass takes at least PAUSE_S and its batch is in
  memory: a wait that also held the step before it (a timestamp taken
  before the previous update ended) would hold at least PAUSE_S."""
  model = keras.Sequential([keras.Input((3,)), _PausingDense(2)])
  waits = _time_waits(model, _batches())
  assert len(waits) == 3
  assert 0 <= min(waits) and max(waits) < PAUSE_S, waits
