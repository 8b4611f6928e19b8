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


def test_each_side_runs_again_in_the_same_process_from_a_fresh_start(
    tmp_path):
  with in_process_sides.InProcessSides(
      FLAGS, str(tmp_path / "sides.log")) as sides:
    runs = [(side, sides.run(side, str(tmp_path / f"{side}-{i}")))
            for i in range(2) for side in in_process_sides.SIDES]
  pids = {result["side_process_pid"] for _, result in runs}
  assert len(pids) == 1 and os.getpid() not in pids
  by_side = {side: [r for s, r in runs if s == side]
             for side in in_process_sides.SIDES}
  for side, (first, second) in by_side.items():
    assert first["measured_steps"] == second["measured_steps"] == 5, side
    # The same seed trains to the same loss: nothing the first run left
    # in the process (weights, optimizer state, the loader's position)
    # reached the second.
    plain_loss = lambda r: r["train_loss"]
    trainer_loss = lambda r: r["final"]["train_loss"]
    loss = plain_loss if side == "plain_loop" else trainer_loss
    assert loss(first) == loss(second), side
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
    with pytest.raises(common.BenchmarkError, match="exited 2"):
      sides.run("torch_parity", str(tmp_path / "run"))
  lines = (tmp_path / "sides.log").read_text(encoding="utf-8").strip()
  assert lines.splitlines()[-1].endswith(
      "--strategy=mirrored: the plain loop runs in one process; allowed: "
      "default, one_device")


def test_an_unknown_side_is_refused_before_anything_starts(tmp_path):
  sides = in_process_sides.InProcessSides(FLAGS, str(tmp_path / "sides.log"))
  with pytest.raises(ValueError, match="side: got 'plain'; allowed: "
                     "plain_loop, torch_parity"):
    sides.run("plain", str(tmp_path / "run"))
  assert not (tmp_path / "sides.log").exists()
