"""benchmarks.in_process_sides: both PyTorch sides, run after run, in one
process, each run as fresh as a process of its own."""

import json
import os

import pytest

from benchmarks import common
from benchmarks import in_process_sides

# The example's own module and data at a few steps; one thread each way,
# as the overhead benchmarks run it, so that the inter-op pool is asked
# for once per run (torch refuses a second setting of it).
FLAGS = ["--model=examples.torch_module.model:build",
         "--dataset=examples.torch_module.data:load", "--image_size=8",
         "--batch_size=8", "--strategy=default", "--train_steps=6",
         "--intra_op_threads=1", "--inter_op_threads=1"]
KERAS_FLAGS = ["--model=examples.keras_regression.model:build",
               "--dataset=examples.keras_regression.data:load",
               "--batch_size=16", "--strategy=default", "--train_steps=6",
               "--intra_op_threads=1", "--inter_op_threads=1"]
TORCH_SIDES = ("plain_loop", "torch_parity")


def _loss(result: dict) -> float:
  """The last step's loss, as a plain side or a trainer records it."""
  return result["final"]["train_loss"] if "final" in result else result[
      "train_loss"]


def test_each_side_runs_again_in_the_same_process_from_a_fresh_start(
    tmp_path):
  with in_process_sides.InProcessSides(
      FLAGS, str(tmp_path / "sides.log")) as sides:
    runs = [(side, sides.run(side, str(tmp_path / f"{side}-{i}")))
            for i in range(2) for side in TORCH_SIDES]
  pids = {result["side_process_pid"] for _, result in runs}
  assert len(pids) == 1 and os.getpid() not in pids
  by_side = {side: [r for s, r in runs if s == side] for side in TORCH_SIDES}
  for side, (first, second) in by_side.items():
    assert first["measured_steps"] == second["measured_steps"] == 5, side
    # The same seed trains to the same loss: nothing the first run left
    # in the process (weights, optimizer state, the loader's position)
    # reached the second.
    assert _loss(first) == _loss(second), side
    # Each run carries its own costs, as a run in a process of its own.
    assert first["process_wall_s"] > 0 and first["process_cpu_s"] > 0
  # The trainer wrote a run record in each run's own directory.
  for i in range(2):
    with open(tmp_path / f"torch_parity-{i}" / "run.json",
              encoding="utf-8") as f:
      assert json.load(f)["framework"] == "pytorch"
  assert by_side["plain_loop"][0]["torch_threads"] == {"intra_op": 1,
                                                       "inter_op": 1}


def test_a_side_the_trainer_refuses_fails_with_the_refusal(tmp_path):
  # A callable that builds no nn.Module: both sides' loader refuses it.
  flags = ["--model=examples.torch_module.data:load",
           *[f for f in FLAGS if not f.startswith("--model=")]]
  with in_process_sides.InProcessSides(
      flags, str(tmp_path / "sides.log")) as sides:
    with pytest.raises(common.BenchmarkError,
                       match=r"plain_loop: ConfigError: "
                       r"--model=examples.torch_module.data:load"):
      sides.run("plain_loop", str(tmp_path / "plain"))


def test_a_strategy_of_several_processes_is_refused_in_one_line(tmp_path):
  flags = [f for f in FLAGS if not f.startswith("--strategy=")]
  flags.append("--strategy=mirrored")
  with in_process_sides.InProcessSides(
      flags, str(tmp_path / "sides.log")) as sides:
    # The trainer could launch replicas; the plain loop could not, so
    # neither side runs in this process.
    with pytest.raises(common.BenchmarkError,
                       match="torch_parity: ConfigError: --strategy=mirrored: "
                       "the plain loop runs in one process; allowed: "
                       "default, one_device"):
      sides.run("torch_parity", str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_keras_sides_run_again_in_one_process_and_other_frameworks_not(
    tmp_path):
  with in_process_sides.InProcessSides(
      KERAS_FLAGS, str(tmp_path / "sides.log")) as sides:
    runs = [(side, sides.run(side, str(tmp_path / f"{side}-{i}")))
            for i in range(2)
            for side in ("plain_fit", "tfoverlap_ctl", "tfoverlap_fit")]
    with pytest.raises(common.BenchmarkError,
                       match="side plain_loop: this process serves "
                       "tensorflow sides only"):
      sides.run("plain_loop", str(tmp_path / "plain"))
  assert len({result["side_process_pid"] for _, result in runs}) == 1
  for side in ("plain_fit", "tfoverlap_ctl", "tfoverlap_fit"):
    first, second = [r for s, r in runs if s == side]
    # Keras' global state is cleared between runs: the same seed trains
    # the same model to the same loss again.
    assert _loss(first) == _loss(second), side
  loops = {side: json.loads((tmp_path / f"{side}-0" / "run.json").read_text(
      encoding="utf-8"))["flags"]["run"]["loop"]
           for side in ("tfoverlap_ctl", "tfoverlap_fit")}
  assert loops == {"tfoverlap_ctl": "ctl", "tfoverlap_fit": "fit"}


def test_an_unknown_side_is_refused_before_anything_starts(tmp_path):
  sides = in_process_sides.InProcessSides(FLAGS, str(tmp_path / "sides.log"))
  with pytest.raises(ValueError, match="side: got 'plain'; allowed: "
                     "plain_loop, torch_parity"):
    sides.run("plain", str(tmp_path / "run"))
  assert not (tmp_path / "sides.log").exists()
