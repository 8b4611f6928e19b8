"""The benchmarks run trainers through the comparison's one runner."""

import os

import pytest

from benchmarks import common
from overlap_compare import trainer_runs


def test_both_tools_start_the_same_trainer_modules():
  assert common.TRAINER_MODULES == {
      name: t.train_module for name, t in trainer_runs.TRAINERS.items()}
  assert common.LAUNCHER_MODULES["pytorch"] == "torch_parity.launch"
  assert common.QUIET_TRAINER_FLAGS == trainer_runs.QUIET_FLAGS


def test_a_refused_run_ends_the_benchmark_naming_command_and_cause(tmp_path):
  # A bad flag value: the trainer exits 2 before it imports its framework.
  model_dir = str(tmp_path / "run")
  with pytest.raises(common.BenchmarkError) as raised:
    common.run_trainer(["--prefetch=bogus"], model_dir,
                       module=common.TRAINER_MODULES["pytorch"])
  message = str(raised.value)
  assert message.startswith("unsupported (train.py: error: --prefetch=bogus")
  assert "-m torch_parity.train" in message and "--prefetch=bogus" in message
  assert "--prefetch=bogus: allowed:" in message.splitlines()[-1]
  # The run's output stays beside it, as the comparison keeps it.
  assert os.path.exists(os.path.join(model_dir, trainer_runs.STDERR_NAME))


def test_a_repeat_run_again_gets_a_directory_of_its_own(tmp_path):
  first = common.make_run_dir(str(tmp_path), "preset-side-0")
  with open(os.path.join(first, "ckpt"), "w", encoding="utf-8") as f:
    f.write("the discarded run's checkpoint")
  again = common.make_run_dir(str(tmp_path), "preset-side-0")
  assert again != first and os.path.isdir(again)
  assert os.listdir(again) == []


def test_a_process_that_exits_0_without_its_results_names_the_file(tmp_path):
  # What a baseline does when a passed-through flag only prints help.
  path = str(tmp_path / "plain.json")
  with pytest.raises(common.BenchmarkError) as raised:
    common.run_process_json(["-c", "print('usage: ...')"], path)
  message = str(raised.value)
  assert message.startswith("exit 0 but no plain.json written: -c")
  assert message.splitlines()[-1] == "usage: ..."
