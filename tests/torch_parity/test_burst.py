"""The PyTorch burst runtime on 2 gloo processes against one process."""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from overlap_core.runtime import processes
from torch_parity import burst
from torch_parity.launch import torchrun_env

from tests.helpers import REPO_ROOT, subprocess_env
from tests.needs_cuda import needs_cuda
from tests.torch_parity import burst_rank

WORLD = 2
RANK_TIMEOUT_S = 300
# float32: the same per-sample terms summed in two parts and then across
# ranks instead of in one batch; a few ulps per reduction, far below 1e-5
# relative on gradients of order 1e-3 to 1.
RTOL, ATOL = 1e-5, 1e-6


def _reference():
  module = burst_rank.build_model()
  x, y = burst_rank.batch()
  optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
  losses, grads = [], None
  for _ in range(2):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(module(x), y)
    loss.backward()
    losses.append(float(loss.detach()))
    if grads is None:
      grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    optimizer.step()
  return losses, grads


def _run_ranks(out_dir):
  port = processes.free_ports(1)[0]
  env = subprocess_env()
  procs = [subprocess.Popen(
      [sys.executable, "-m", "tests.torch_parity.burst_rank", str(out_dir)],
      cwd=REPO_ROOT, env=torchrun_env(env, rank=r, world_size=WORLD,
                                      master_port=port),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for r in range(WORLD)]
  try:
    outputs = [p.communicate(timeout=RANK_TIMEOUT_S)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out
  return [torch.load(os.path.join(out_dir, f"rank{r}.pt"))
          for r in range(WORLD)]


def test_two_ranks_train_like_one_process(tmp_path):
  ranks = _run_ranks(tmp_path)
  ref_losses, ref_grads = _reference()
  for record in ranks:
    assert record["losses"] == pytest.approx(ref_losses, rel=RTOL)
  # Rank 0 takes part in every layer, so it holds every summed gradient.
  grads = ranks[0]["grads"]
  assert sorted(grads) == sorted(ref_grads)
  for name, ref in ref_grads.items():
    torch.testing.assert_close(grads[name], ref, rtol=RTOL, atol=ATOL)
  # Rank 1 ran only the width-2 layers, on its half, and got their sums.
  for name in ("0.weight", "0.bias", "5.weight", "5.bias"):
    torch.testing.assert_close(ranks[1]["grads"][name], ref_grads[name],
                               rtol=RTOL, atol=ATOL)
  assert "3.weight" not in ranks[1]["grads"]
  half = burst_rank.BATCH // 2
  assert ranks[1]["seen"] == {"0": [half, half], "1": [half, half],
                              "4": [half, half], "5": [half, half]}
  assert ranks[0]["seen"]["3"] == [burst_rank.BATCH] * 2
  assert ranks[0]["seen"]["0"] == [half, half]


def _idle_rank(dtype: torch.dtype, device: str):
  """Rank 1 of 2 under a plan that puts every layer on rank 0 alone: it
  runs no layer and holds only idle parts. No layer changes width, so no
  exchange runs and this process needs no process group."""
  module = burst_rank.build_model().to(device=device, dtype=dtype)
  x = burst_rank.batch()[0].to(device=device, dtype=dtype)
  model = burst.BurstModel(module, {name: 1 for name in burst_rank.WIDTHS},
                           global_batch=burst_rank.BATCH,
                           example_input=x[:2], rank=1, world_size=2)
  return model, x


def test_an_idle_rank_holds_parts_of_the_layers_dtype():
  model, x = _idle_rank(torch.float64, "cpu")
  out = model(model.local_input(x))
  # The next exchange receives into a buffer shaped like this part: a
  # float32 part would take float64 rows in the wrong dtype.
  assert out.shape == (0, 10)
  assert out.dtype == torch.float64
  assert out.device == x.device


@needs_cuda
def test_an_idle_rank_on_cuda_holds_cuda_parts():
  model, x = _idle_rank(torch.float32, "cuda:0")
  out = model(model.local_input(x))
  # NCCL sends and receives device buffers only.
  assert out.device == x.device and out.is_cuda


def _nested_model() -> nn.Module:
  # Module paths with dots ("0.0"), as every zoo model but the flat ones.
  return nn.Sequential(nn.Sequential(nn.Linear(4, 3), nn.ReLU()),
                       nn.Linear(3, 2))


def _burst(module, widths):
  return burst.BurstModel(module, widths, global_batch=4,
                          example_input=torch.zeros(2, 4), rank=1,
                          world_size=2)


def test_a_plan_names_layers_neutrally():
  model = _burst(_nested_model(), {"0_0": 1, "0_1": 1, "1": 1})
  assert model(model.local_input(torch.ones(4, 4))).shape == (0, 2)


@pytest.mark.parametrize("widths, message", [
    # PyTorch's own spelling is not what plans use.
    ({"0.0": 1, "0_1": 1, "1": 1}, "layer '0_0' of the model has no width"),
    ({"0_0": 1, "0_1": 1, "1": 1, "2": 1},
     "the plan names layer '2', which the model lacks"),
    ({"0_0": 3, "0_1": 1, "1": 1}, "layer '0_0' has width 3; allowed: 1 to 2"),
])
def test_a_plan_that_does_not_fit_the_model_is_refused(widths, message):
  with pytest.raises(ValueError, match=message) as raised:
    _burst(_nested_model(), widths)
  assert "\n" not in str(raised.value)
