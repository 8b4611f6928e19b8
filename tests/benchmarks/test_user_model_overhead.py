"""benchmarks.user_model_overhead, and the plain baselines on a user model.

Smoke runs at a few steps: the numbers are not looked at, only that every
side trained the example's own model with its task's loss and that the
results file records what every one does.
"""

import json
import math
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, subprocess_env

KERAS_REGRESSION = ["--model=examples.keras_regression.model:build",
                    "--dataset=examples.keras_regression.data:load",
                    "--batch_size=16", "--strategy=default"]


def _run(*args, timeout_s=180):
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT,
                        env=subprocess_env(TF_CPP_MIN_LOG_LEVEL="2"),
                        capture_output=True, text=True, timeout=timeout_s,
                        check=False)


@pytest.mark.parametrize("sides_in", ["one_process", "processes"])
def test_quick_run_pairs_the_trainer_with_the_plain_loop_on_the_module(
    tmp_path, sides_in):
  output = tmp_path / "user_model_overhead.json"
  done = _run("benchmarks.user_model_overhead", "--quick",
              "--examples=torch_module", "--train_steps=4", "--redo_busy=0",
              f"--sides_in={sides_in}", f"--output={output}")
  assert done.returncode == 0, done.stderr[-3000:]
  payload = json.loads(output.read_text(encoding="utf-8"))
  assert payload["benchmark"] == "user_model_overhead"
  assert payload["command"].startswith(
      "python -m benchmarks.user_model_overhead --quick")
  assert payload["quick"] and payload["repeats"] == 1
  assert payload["machine"]["date"] and payload["machine"]["commit"]
  assert "load_average_at_start" in payload["machine"]
  # The paired harness recorded the host's load around the repeat.
  host = payload["harness"]["host"]["all"]
  assert len(host["host_by_repeat"]) == 1
  assert host["load_average_before"] is not None
  runs = {r["side"]: r["result"] for r in payload["runs"]}
  assert sorted(runs) == ["plain_loop", "torch_parity"]
  assert payload["sides_in"] == sides_in
  # One process served both sides, or each side ran in its own.
  pids = {r.get("side_process_pid") for r in runs.values()}
  assert len(pids) == 1 and (None in pids) == (sides_in == "processes")
  # The plain loop can only have built the example's module through the
  # trainer's loader: a zoo model would not have the same parameters.
  assert runs["plain_loop"]["num_params"] == runs["torch_parity"][
      "num_params"]
  assert runs["plain_loop"]["loss"] == "cross_entropy"
  (comparison,) = payload["summary"]["torch_module"]["comparisons"]
  assert (comparison["side"], comparison["plain_side"]) == (
      "torch_parity", "plain_loop")
  # One repeat gives no interval, so no verdict is declared.
  assert comparison["judged"]["verdict"] == "noisy"
  # Both sides timed their wait for the batch, so the gap splits into the
  # wait, the trainer's bookkeeping (its ledger's `other`) and the rest,
  # which add up to the mean step's difference.
  gap = payload["summary"]["torch_module"]["gap"]
  trainer, plain = runs["torch_parity"], runs["plain_loop"]
  assert gap["step"]["all_ms"] == [
      trainer["step"]["mean_ms"] - plain["step"]["mean_ms"]]
  assert gap["data_wait"]["all_ms"] == [
      trainer["data_wait"]["mean_ms"] - plain["data_wait"]["mean_ms"]]
  assert gap["bookkeeping"]["all_ms"] == [trainer["other"]["mean_ms"]]
  assert 0 < plain["data_wait"]["mean_ms"] < plain["step"]["mean_ms"]
  assert math.isclose(
      gap["step"]["median_ms"],
      sum(gap[p]["median_ms"]
          for p in ("data_wait", "bookkeeping", "step_work")),
      abs_tol=1e-9)


def test_plain_fit_trains_the_users_regression_with_mean_squared_error(
    tmp_path):
  result_json = tmp_path / "plain.json"
  done = _run("benchmarks.plain_keras_fit", *KERAS_REGRESSION,
              "--train_steps=4", f"--result_json={result_json}")
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(result_json.read_text(encoding="utf-8"))
  from examples.keras_regression import model  # pylint: disable=g-import-not-at-top
  built, _ = model.build(seed=0)
  assert result["num_params"] == built.count_params()
  assert (result["task"], result["loss"]) == ("regression",
                                              "MeanSquaredError")


def test_plain_loop_refuses_what_the_trainer_refuses_in_one_line(tmp_path):
  # A callable that builds no nn.Module: the trainer's loader refuses it.
  done = _run("benchmarks.plain_torch_loop",
              "--model=examples.torch_module.data:load",
              "--dataset=examples.torch_module.data:load", "--image_size=16",
              "--strategy=default", "--train_steps=4",
              f"--result_json={tmp_path / 'plain.json'}")
  assert done.returncode == 2, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, done.stderr
  assert lines[0].startswith(
      "plain_torch_loop.py: error: --model=examples.torch_module.data:load")
  assert not (tmp_path / "plain.json").exists()
