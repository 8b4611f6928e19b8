"""PyTorch pipeline stages: split modules, and real stages over gloo.

The equivalence test runs a 2-stage x 4-micro-batch pipeline (GPipe, 1F1B,
and interleaved 1F1B with 2 stages per rank) in two real processes
(torch.multiprocessing.spawn, inside a subprocess with a timeout: gloo
point-to-point has hung in earlier torch releases, pytorch/pytorch#132644)
and compares every loss and gradient with the
unsplit model trained here on the same micro-batches. Every schedule runs
ResNet-18 (BatchNorm, residual cuts); VGG-16 (a plain chain, the largest
activations sent) runs under GPipe, whose split and sends the other
schedules share. One spawn trains all the cases in turn, one process group,
so the ranks pay torch's start-up once.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from overlap_core.runtime import processes
from overlap_core.runtime.config import ConfigError, PipelineConfig
from torch_parity import pipeline, rendezvous
from torch_parity.models import build_model

from tests.fixtures import float64_image_batches
from tests.helpers import REPO_ROOT, run_module, subprocess_env

IMAGE_SIZE = 32
BATCH = 8
MICROBATCHES = 4
STEPS = 2
LEARNING_RATE = 0.05
# Two ranks on a loaded 2-core host: VGG-16 at 32 px takes seconds a step.
PIPELINE_TIMEOUT_S = 300
# (model, schedule) cases the spawned ranks train, in this order.
CASES = (("vgg16", "gpipe"), ("resnet18", "gpipe"), ("resnet18", "1f1b"),
         ("resnet18", "interleaved_1f1b"))


def _model(name: str) -> nn.Module:
  torch.manual_seed(0)
  model = build_model(name, image_size=IMAGE_SIZE, num_classes=10)
  # Dropout's masks come from each process's own random stream, which no
  # split reproduces; without it, the comparison is of arithmetic alone.
  for module in model.modules():
    if isinstance(module, nn.Dropout):
      module.p = 0.0
  # float64: ResNet's last BatchNorms normalize 2 values per channel at a
  # micro-batch of 2 and 1x1 pixels, which amplifies float32 rounding (a
  # different summation order) into 1e-3 relative gradient differences;
  # in float64 the same amplification stays far below the tolerance.
  return model.double()


def _batches():
  return float64_image_batches(BATCH, IMAGE_SIZE, STEPS)


def _loss(outputs, targets):
  return F.cross_entropy(outputs, targets)


def _config(schedule: str) -> PipelineConfig:
  # Interleaved 1F1B: each of the 2 ranks holds 2 of the 4 stages.
  virtual = 2 if schedule == "interleaved_1f1b" else 1
  return PipelineConfig(stages=2, microbatches=MICROBATCHES,
                        schedule=schedule, split="even",
                        virtual_stages=virtual)


def _cut_layers(model: nn.Module, schedule: str):
  return pipeline.plan_cut_layers(model, _batches()[0][0][:2],
                                  _config(schedule))


def _case_dir(out_dir: str, name: str, schedule: str) -> str:
  return os.path.join(out_dir, f"{name}-{schedule}")


def _worker(rank: int, port: int, out_dir: str):
  """One rank: trains its stage of every case in CASES, in turn."""
  import torch.distributed as dist  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  rendezvous.init_process_group("gloo",
                                init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=2)
  for name, schedule in CASES:
    _train_stage(rank, name, schedule, _case_dir(out_dir, name, schedule))
  dist.destroy_process_group()


def _train_stage(rank: int, name: str, schedule: str, out_dir: str):
  """One stage: trains STEPS steps, saves its losses and gradients."""
  from overlap_core.planning.dims import ParallelDims  # pylint: disable=g-import-not-at-top
  model = _model(name)
  names = {id(p): n for n, p in model.named_parameters()}
  cfg = _config(schedule)
  modules = pipeline.build_stages(model, _cut_layers(model, schedule))
  mesh = pipeline.build_mesh_groups(ParallelDims(2, 1, 2), rank)
  runtime = pipeline.build_runtime(modules, cfg, mesh, torch.device("cpu"),
                                   _loss)
  stage = nn.ModuleList(runtime.stage_modules)
  optimizer = torch.optim.SGD(stage.parameters(), lr=LEARNING_RATE)
  record = {"losses": [], "grads": []}
  for inputs, targets in _batches():
    optimizer.zero_grad()
    loss = runtime.step(inputs, targets)
    record["losses"].append(loss)
    record["grads"].append({names[id(p)]: p.grad.clone()
                            for p in stage.parameters()})
    optimizer.step()
  os.makedirs(out_dir, exist_ok=True)
  torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))


def _reference(name: str):
  """The unsplit model on the same micro-batches, gradients accumulated."""
  model = _model(name)
  optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
  losses, grads = [], []
  for inputs, targets in _batches():
    optimizer.zero_grad()
    step_losses = []
    for x, y in zip(inputs.chunk(MICROBATCHES), targets.chunk(MICROBATCHES)):
      loss = _loss(model(x), y)
      (loss / MICROBATCHES).backward()
      step_losses.append(loss.detach())
    losses.append(torch.stack(step_losses).mean())
    grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    optimizer.step()
  return losses, grads


@pytest.fixture(scope="module")
def pipeline_runs(tmp_path_factory):
  """The directory where the two ranks left each case's records."""
  out_dir = str(tmp_path_factory.mktemp("pipelines"))
  (port,) = processes.free_ports(1)
  subprocess.run([sys.executable, __file__, str(port), out_dir], check=True,
                 cwd=REPO_ROOT, env=subprocess_env(),
                 timeout=len(CASES) * PIPELINE_TIMEOUT_S)
  return out_dir


@pytest.fixture(scope="module")
def references():
  """_reference(name), computed once per model for all its schedules
  (the tests only read it)."""
  made = {}

  def reference(name):
    if name not in made:
      made[name] = _reference(name)
    return made[name]

  return reference


@pytest.mark.parametrize("name, schedule", CASES)
def test_two_stages_train_like_the_unsplit_model(name, schedule,
                                                 pipeline_runs, references):
  case_dir = _case_dir(pipeline_runs, name, schedule)
  first, last = [torch.load(os.path.join(case_dir, f"rank{r}.pt"))
                 for r in (0, 1)]
  want_losses, want_grads = references(name)
  assert first["losses"] == [None] * STEPS  # the loss lives on the last stage
  # Each micro-batch runs the same kernels on the same values as the
  # unsplit model; a pipeline changes only the order in which the four
  # micro-batch gradients are summed (and the division by M happens after
  # the sum, not per micro-batch), and the two processes' thread counts
  # may pick other reduction orders inside a convolution. All of that is
  # float64 rounding, ~1e-16 relative. The losses agree to 1e-8. The
  # gradients of the first layers come back through every BatchNorm, whose
  # backward subtracts means and divides by batch deviations: that
  # amplified the rounding to 2e-8 of conv1's gradient scale on an AMD EPYC
  # host, where kernels other than an Intel host's ran. 1e-6 of a
  # gradient's scale leaves a margin of 50, and a wrong split or schedule
  # (a micro-batch lost, counted twice, or not divided by M) moves
  # gradients by a quarter of their scale or more.
  for step in range(STEPS):
    torch.testing.assert_close(last["losses"][step], want_losses[step],
                               rtol=1e-8, atol=1e-10)
    got = {**first["grads"][step], **last["grads"][step]}
    assert got.keys() == want_grads[step].keys()
    assert first["grads"][step].keys().isdisjoint(last["grads"][step])
    for param, want in want_grads[step].items():
      scale = want.abs().max().item() + 1e-12
      torch.testing.assert_close(
          got[param], want, rtol=1e-6, atol=1e-6 * scale,
          msg=lambda message, param=param: f"{param}: {message}")


def test_stage_modules_compose_to_the_model():
  model = _model("resnet18").eval()
  x = _batches()[0][0][:2]
  cuts = ["layer1.1.relu_4", "layer3.1.relu_12"]
  stages = pipeline.build_stages(model, cuts)
  assert len(stages) == 3
  y = x
  for stage in stages:
    y = stage(y)
  torch.testing.assert_close(y, model(x), rtol=0, atol=0)


def test_auto_split_without_a_profile_is_refused_with_a_reason():
  # (zero_bubble's refusal is the compatibility table's: test_compat.py.)
  model = _model("vgg16")
  with pytest.raises(ConfigError, match="pipeline_split"):
    pipeline.plan_cut_layers(model, _batches()[0][0][:2],
                             PipelineConfig(stages=2, microbatches=4))


TRAIN_FLAGS = ["--model=resnet18", "--dataset=synthetic", "--image_size=32",
               "--batch_size=8", "--train_steps=2", "--strategy=mirrored",
               "--num_devices=2", "--pipeline_stages=2",
               "--pipeline_microbatches=4", "--pipeline_split=even",
               "--evaluate=false", "--tensorboard=false", "--trace=false",
               "--intra_op_threads=1", "--inter_op_threads=1"]


def test_the_trainer_runs_stages_and_records_the_split(tmp_path):
  result = run_module("torch_parity.train", *TRAIN_FLAGS, "--pipeline_schedule=1f1b",
                      f"--model_dir={tmp_path}", timeout=PIPELINE_TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-2000:]
  with open(tmp_path / "run.json", encoding="utf-8") as f:
    record = json.load(f)
  described = record["strategy"]["pipeline"]
  assert described["cut_layers"] == ["layer2.1.relu_8"]
  assert described["schedule"] == "Schedule1F1B"
  assert described["measured"]["steps"] == 2
  assert record["strategy"]["parallel_dims"]["pipeline"] == 2


def test_the_trainer_refuses_a_pipelined_checkpoint_in_one_line(tmp_path):
  result = run_module("torch_parity.train", *TRAIN_FLAGS, "--checkpoint=sync",
                      f"--model_dir={tmp_path}", timeout=120)
  assert result.returncode == 2
  (line,) = result.stderr.strip().splitlines()[-1:]
  assert "--checkpoint=sync" in line and "stage" in line


if __name__ == "__main__":
  # The pipeline's ranks: python test_pipeline.py PORT DIR
  torch.multiprocessing.spawn(_worker, args=(int(sys.argv[1]), sys.argv[2]),
                              nprocs=2)
