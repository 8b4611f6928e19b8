"""Pipeline x data parallel: 2 stages x 2 replicas train like one model.

Four real processes over gloo (torch.multiprocessing.spawn inside a
subprocess with a timeout: gloo point-to-point has hung in earlier torch
releases, pytorch/pytorch#132644). Ranks 0 and 1 hold stage 0, ranks 2 and
3 stage 1; replica r reads half r of every batch. Each stage's gradients
are averaged over its two replicas, bucket by bucket as the last
micro-batch's backward finishes them (the default) or after the schedule's
step (`overlap_all_reduce=False`); the same four processes train both ways
in turn, and both must follow the unsplit model trained here on the full
batch.
"""

import os
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from overlap_core.runtime.config import PipelineConfig
from torch_parity import pipeline, rendezvous
from torch_parity.models import build_model

from tests.fixtures import float64_image_batches
from tests.helpers import run_ranks_script

IMAGE_SIZE = 8
BATCH = 8
MICROBATCHES = 2
STEPS = 3
LEARNING_RATE = 0.1
STAGES, REPLICAS = 2, 2
OVERLAP = (True, False)  # the all-reduce during backward, then after it
# Four ranks of a small CNN at 8 px: seconds on a loaded 2-core host.
RUN_TIMEOUT_S = 300


def _model() -> nn.Module:
  torch.manual_seed(0)
  # No BatchNorm or dropout in the small CNN: a micro-batch's outputs do
  # not depend on the rest of the batch, so the full-batch reference is
  # exact up to rounding (see the test's tolerance).
  return build_model("small_cnn", image_size=IMAGE_SIZE,
                     num_classes=10).double()


def _batches():
  return float64_image_batches(BATCH, IMAGE_SIZE, STEPS)


def _worker(rank: int, port: int, out_dir: str):
  """One rank: trains STEPS steps on its replica's half, saves its stage."""
  import torch.distributed as dist  # pylint: disable=g-import-not-at-top
  from overlap_core.planning.dims import ParallelDims  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  rendezvous.init_process_group("gloo",
                                init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=STAGES * REPLICAS)
  mesh = pipeline.build_mesh_groups(
      ParallelDims(STAGES * REPLICAS, REPLICAS, STAGES), rank)
  half = BATCH // REPLICAS
  rows = slice(mesh.replica * half, (mesh.replica + 1) * half)
  runs = {}
  for overlap in OVERLAP:
    model = _model()
    names = {id(p): n for n, p in model.named_parameters()}
    cfg = PipelineConfig(stages=STAGES, microbatches=MICROBATCHES,
                         split="even", overlap_all_reduce=overlap)
    cuts = pipeline.plan_cut_layers(model, _batches()[0][0][:half], cfg)
    modules = pipeline.build_stages(model, cuts)
    # A bucket smaller than the stage's gradients: several all-reduces.
    runtime = pipeline.build_runtime(
        modules, cfg, mesh, torch.device("cpu"),
        lambda outputs, targets: F.cross_entropy(outputs, targets),
        bucket_mb=0.01, overlap_all_reduce=cfg.overlap_all_reduce)
    (stage,) = runtime.stage_modules
    optimizer = torch.optim.SGD(stage.parameters(), lr=LEARNING_RATE)
    losses, overlapped = [], []
    for inputs, targets in _batches():
      optimizer.zero_grad()
      losses.append(runtime.step(inputs[rows], targets[rows]))
      optimizer.step()
      reducer = runtime.reducer
      overlapped.append(None if reducer is None else
                        (reducer.num_overlapped, reducer.num_buckets))
    params = {names[id(p)]: p.detach().clone() for p in stage.parameters()}
    # The stage timed alone (`reference_step`): its replicas' gradients
    # are not all-reduced, so each keeps its own half's.
    optimizer.zero_grad()
    with runtime.alone():
      runtime.step(inputs[rows], targets[rows])
    runs[overlap] = {
        "losses": losses, "overlapped": overlapped, "params": params,
        "alone_grads": {names[id(p)]: p.grad.detach().clone()
                        for p in stage.parameters()}}
  torch.save({"stage": mesh.stage, "replica": mesh.replica, "runs": runs},
             os.path.join(out_dir, f"rank{rank}.pt"))
  dist.destroy_process_group()


def _reference():
  """The unsplit model, full batch, the same SGD steps."""
  model = _model()
  optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
  losses = []
  for inputs, targets in _batches():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    losses.append(loss.detach())
  return losses, {n: p.detach() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
  out = tmp_path_factory.mktemp("replicas")
  run_ranks_script(__file__, out, RUN_TIMEOUT_S)
  return [torch.load(out / f"rank{r}.pt") for r in range(STAGES * REPLICAS)]


@pytest.mark.parametrize("overlap", OVERLAP,
                         ids=["overlapped", "after_the_step"])
def test_two_stages_by_two_replicas_train_like_the_full_batch(ranks,
                                                              overlap):
  assert [(r["stage"], r["replica"]) for r in ranks] == [
      (0, 0), (0, 1), (1, 0), (1, 1)]
  want_losses, want_params = _reference()
  runs = [r["runs"][overlap] for r in ranks]
  # The full batch's mean loss is the mean of the two halves' means (equal
  # halves), and each half's the mean of its equal micro-batches; and the
  # averaged gradient is the full batch's. Only the order of sums differs.
  # The model computes in float64 but hands out float32 logits (as every
  # zoo classifier does), so a reordered float64 sum can round to the
  # neighbouring float32: 1.2e-7 relative in a logit, hence in the loss
  # and in the gradients behind it. After 3 SGD steps of lr 0.1 that stays
  # below 1e-6 of a parameter's scale; a replica that kept its own
  # gradient (half the batch) would be off by about lr x |g|, 1e-3 or more.
  last = [run for r, run in zip(ranks, runs) if r["stage"] == 1]
  for step in range(STEPS):
    got = torch.stack([r["losses"][step] for r in last]).mean()
    torch.testing.assert_close(got, want_losses[step], rtol=1e-6, atol=0)
  for run in runs:
    for name, got in run["params"].items():
      want = want_params[name]
      scale = want.abs().max().item()
      torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * scale,
                                 msg=name)
  covered = set(runs[0]["params"]) | set(runs[2]["params"])
  assert covered == set(want_params)


def test_the_overlapped_buckets_start_during_backward(ranks):
  for rank in ranks:
    # Every bucket was handed to its all-reduce by the hook that saw its
    # last gradient accumulate, i.e. during the schedule's backward; a
    # bucket left to `finish()` (after the step) would not count.
    for num_overlapped, num_buckets in rank["runs"][True]["overlapped"]:
      assert num_buckets >= 2 and num_overlapped == num_buckets, rank
    # Without the overlap, no reducer runs: all of it after the step.
    assert rank["runs"][False]["overlapped"] == [None] * STEPS
  # Both ways reduce the same sums, so they agree to rounding.
  for rank in ranks:
    for name, got in rank["runs"][True]["params"].items():
      torch.testing.assert_close(got, rank["runs"][False]["params"][name],
                                 rtol=1e-6, atol=1e-9, msg=name)


@pytest.mark.parametrize("overlap", OVERLAP,
                         ids=["overlapped", "after_the_step"])
def test_a_stage_alone_runs_without_its_replicas_all_reduce(ranks, overlap):
  for stage in range(STAGES):
    one, other = (r["runs"][overlap]["alone_grads"] for r in ranks
                  if r["stage"] == stage)
    # All-reduced, both replicas would hold the same mean to the bit.
    assert any(not torch.equal(one[name], other[name]) for name in one)


if __name__ == "__main__":
  # The ranks: python test_pipeline_replicas.py PORT DIR
  torch.multiprocessing.spawn(_worker, args=(int(sys.argv[1]), sys.argv[2]),
                              nprocs=STAGES * REPLICAS)
