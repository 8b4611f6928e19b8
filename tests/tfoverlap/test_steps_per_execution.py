"""--steps_per_execution: K optimizer steps per traced call, TensorFlow side.

The same steps in fewer calls must train the same weights, bit for bit
under --deterministic (the ops and their order do not change, only how
often Python dispatches them), and must stop, checkpoint and resume at
exactly the steps a run of one step per call does.
"""

import glob
import os
import re

import pytest

from overlap_core.runtime import run_record
from tfoverlap.loops import execution_sizes

from tests.helpers import run_module

EXACT = ["--model=mlp", "--dataset=digits", "--batch_size=32",
         "--deterministic", "--log_every_steps=5", "--tensorboard=false",
         "--trace=false", "--evaluate=false"]


def _train(model_dir, *args):
  result = run_module("tfoverlap.train", f"--model_dir={model_dir}", *EXACT,
                      *args, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  return run_record.load_run_record(str(model_dir))


def test_calls_end_at_multiples_of_k_also_after_any_resume():
  assert list(execution_sizes(1, 10, 4)) == [(1, 4), (5, 4), (9, 2)]
  # Resumed after step 6: the first call only reaches step 8.
  assert list(execution_sizes(7, 12, 4)) == [(7, 2), (9, 4)]
  assert list(execution_sizes(3, 3, 4)) == [(3, 1)]
  assert not list(execution_sizes(11, 10, 4))
  assert list(execution_sizes(1, 3, 1)) == [(1, 1), (2, 1), (3, 1)]


# model.fit runs several steps per call on one replica only: Keras 3 fails
# to run them under a replicated strategy (refused, see test_train).
@pytest.mark.parametrize("loop, strategy", [("ctl", "mirrored"),
                                            ("fit", "default")])
def test_k_steps_per_call_train_the_weights_of_one_step_per_call(
    tmp_path, loop, strategy):
  args = [f"--loop={loop}", f"--strategy={strategy}", "--train_steps=12"]
  one = _train(tmp_path / "k1", *args)
  four = _train(tmp_path / "k4", *args, "--steps_per_execution=4")
  assert four["weights_digest"] == one["weights_digest"]
  # No step more or less: model.fit would run a whole last execution.
  assert four["steps"] == one["steps"] == 12
  assert four["steps_per_execution"] == 4
  assert one["steps_per_execution"] == 1
  # The input is read inside the call, so no data wait is measured apart,
  # and the record says how the per-step figures were made.
  assert "data_wait" not in four["phases_measured"]
  assert four["phases"]["compute"]["mean"] > 0
  if loop == "ctl":
    assert any("steps per traced call" in n for n in four["notes"])


def test_a_resume_between_calls_realigns_and_ends_like_an_uninterrupted_run(
    tmp_path):
  """Stopped after step 6 by a run of one step per call, resumed at K=4:
  the first call runs steps 7-8 only, so the cadence of 4 still lands on
  call ends (8 and 12), and the weights are the uninterrupted run's."""
  whole = _train(tmp_path / "whole", "--strategy=default", "--train_steps=12")
  model_dir = tmp_path / "resumed"
  _train(model_dir, "--strategy=default", "--train_steps=6",
         "--checkpoint=sync", "--checkpoint_every=3", "--checkpoint_keep=5")
  resumed = _train(model_dir, "--strategy=default", "--train_steps=12",
                   "--checkpoint=sync", "--checkpoint_every=4",
                   "--checkpoint_keep=5", "--steps_per_execution=4")
  assert resumed["steps"] == 6
  assert resumed["weights_digest"] == whole["weights_digest"]
  steps = sorted({int(re.match(r"ckpt-(\d+)", os.path.basename(p)).group(1))
                  for p in glob.glob(str(model_dir / "checkpoints" /
                                         "ckpt-*"))})
  assert steps == [3, 6, 8, 12]


def test_fit_refuses_a_resume_that_leaves_a_partial_execution(tmp_path):
  _train(tmp_path, "--strategy=default", "--train_steps=6",
         "--checkpoint=sync", "--checkpoint_every=3")
  result = run_module("tfoverlap.train", f"--model_dir={tmp_path}", *EXACT,
                      "--strategy=default", "--train_steps=12",
                      "--loop=fit", "--steps_per_execution=4",
                      "--checkpoint=sync", "--checkpoint_every=4",
                      timeout=600)
  assert result.returncode == 2, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert "--steps_per_execution=4" in last and "6 steps remain" in last
