"""--background_job on a CUDA device: the lowest-priority stream, a CUDA
graph, and the numbers in run.json.

Running the job needs a GPU, and those tests skip without one; what a host
without CUDA can check runs everywhere.
"""

import json

import pytest
import torch

from torch_parity import background_cuda

from tests.helpers import run_module, wait_until
from tests.needs_cuda import needs_cuda
from tests.record_checks import assert_background_beside_foreground


def test_the_job_leaves_the_foregrounds_random_stream_alone():
  # On the CPU here: the same code as on a GPU, with the CPU's global
  # generator standing for the device's. A job drawing from it would move
  # the foreground's dropout and shuffling mid-run.
  before = torch.random.get_rng_state()
  step = background_cuda._SmallMlpStep(torch.device("cpu"), batch_size=8)
  step()
  assert torch.equal(torch.random.get_rng_state(), before)
  # ... and its weights still come from a seed, the same each run.
  first, second = (background_cuda._SmallMlpStep(torch.device("cpu"), 8)
                   for _ in range(2))
  assert torch.equal(first.model[0].weight, second.model[0].weight)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a host with CUDA")
def test_a_host_without_cuda_is_refused_in_one_line():
  with pytest.raises(RuntimeError) as raised:
    background_cuda.CudaBackgroundRunner("small_mlp", "cuda:0",
                                         start_after_step=1,
                                         global_batch_size=8)
  assert "needs a GPU" in str(raised.value)
  assert "\n" not in str(raised.value)


@needs_cuda
def test_the_job_runs_on_the_lowest_priority_stream():
  lowest, highest = torch.cuda.Stream.priority_range()
  runner = background_cuda.CudaBackgroundRunner(
      "small_mlp", "cuda:0", start_after_step=1, global_batch_size=8)
  x = torch.randn(512, 512, device="cuda:0")
  try:
    with torch.cuda.stream(runner.foreground_stream):
      runner.on_step_end(1, 0.01)  # starts the job
      wait_until(lambda: runner.stats()["steps"] >= 20, "20 job steps")
      for step in range(2, 5):
        (x @ x).sum().item()
        runner.on_step_end(step, 0.01)
  finally:
    runner.stop()
  stats = runner.stats()
  assert stats["error"] is None
  # Read back from the streams: what CUDA applies, not what was asked.
  assert stats["stream_priority"] == lowest
  assert stats["foreground_stream_priority"] == highest
  assert highest < lowest  # CUDA counts down: the foreground ranks above
  assert stats["policy_seen_by_foreground"] == (
      f"CUDA stream priority {lowest}")
  assert stats["cuda_graph"] is True, stats["cuda_graph_error"]
  assert stats["finished"] is True
  assert stats["steps"] >= 20 and stats["samples_per_second"] > 0
  # One fixed batch, learnt: the replays really train.
  assert stats["last_loss"] < stats["first_loss"]
  fg = stats["foreground"]
  assert (fg["steps_before"], fg["steps_with"]) == (1, 2)


@needs_cuda
def test_the_trainer_records_the_cuda_job_in_run_json(tmp_path):
  model_dir = tmp_path / "run"
  result = run_module(
      "torch_parity.train", "--strategy=default", "--model=small_cnn",
      "--background_job=small_mlp", "--train_steps=24", "--batch_size=16",
      "--evaluate=false", "--progress=false", f"--model_dir={model_dir}",
      timeout=600)
  assert result.returncode == 0, result.stderr
  assert ("background job small_mlp started: CUDA stream priority"
          in result.stdout), result.stdout
  with open(model_dir / "run.json", encoding="utf-8") as f:
    bg = json.load(f)["background"]
  lowest, highest = torch.cuda.Stream.priority_range()
  assert bg["stream_priority"] == lowest
  assert bg["foreground_stream_priority"] == highest
  assert bg["error"] is None
  assert_background_beside_foreground(bg)
