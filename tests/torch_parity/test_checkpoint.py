"""Checkpoints on the PyTorch side: real torch, real processes, real files.

Mirrors tests/tfoverlap/test_checkpoint.py and test_checkpoint_kills.py.
In process: snapshot and restore of model, optimizer and RNG state, DDP and
bfloat16 models, mismatches, and the files loading into plain torch.
Through the trainer: resume exactness, SIGKILLs at random moments, corrupt
and mismatched checkpoints, full disks, and a two-process gloo run with one
writer.
"""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import safetensors.torch
import torch
import torch.distributed as dist
from torch import nn

from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.runtime.config import CheckpointConfig
from torch_parity import rendezvous
from torch_parity.checkpoint import (CheckpointError, CheckpointMismatchError,
                                     Checkpointer, snapshot)

from tests import checkpoint_support, trainer_checkpoints
from tests.helpers import REPO_ROOT, subprocess_env
from tests.needs_cuda import needs_cuda

# The trainer-run claims both sides share: each runs here on `trainer`.
from tests.trainer_checkpoints import (  # pylint: disable=unused-import
    stopped_at_20, test_async_stopped_and_resumed_run_ends_bit_identical,
    test_corrupt_newest_checkpoint_falls_back_to_the_previous,
    test_full_disk_applies_the_policy_and_keeps_the_good_checkpoint,
    test_sigkills_at_random_moments_lose_nothing, uninterrupted_digest)


def _net(seed: int, hidden: int = 16) -> nn.Module:
  torch.manual_seed(seed)
  return nn.Sequential(nn.Linear(8, hidden), nn.BatchNorm1d(hidden),
                       nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 3))


def _adam(model: nn.Module) -> torch.optim.Optimizer:
  # Two groups with different hyperparameters, so their layout is tested.
  first, *rest = list(model.parameters())
  return torch.optim.Adam([{"params": [first], "lr": 3e-2},
                           {"params": rest}], lr=1e-2, betas=(0.8, 0.99))


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
  return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


_X = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
_Y = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(2))


def _train(model, optimizer, checkpointer=None, steps=range(1, 5)):
  model.train()
  for step in steps:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(_X), _Y).backward()
    optimizer.step()
    if checkpointer is not None and checkpointer.is_due(step):
      checkpointer.save(step)


def _config(mode="async", every=4, keep=2, **kwargs) -> CheckpointConfig:
  return CheckpointConfig(mode=mode, every_steps=every, keep=keep, **kwargs)


def _quiet(message):
  del message


def _run_with_checkpoints(directory, steps, *, mode="async", every=2,
                          make_optimizer=_adam, checkpointer=Checkpointer):
  """`_net(0)` trained for `steps`, checkpointed: (model, optimizer,
  checkpointer), the checkpointer still open."""
  model = _net(0)
  optimizer = make_optimizer(model)
  opened = checkpointer(_config(mode, every=every), str(directory),
                        model=model, optimizer=optimizer, log=_quiet)
  _train(model, optimizer, opened, steps=steps)
  return model, optimizer, opened


def assert_same_structure(got, want, path="state_dict"):
  """Equal values, types (tuple vs list, int vs float) and tensors."""
  assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
  if isinstance(want, torch.Tensor):
    assert got.dtype == want.dtype and torch.equal(got, want), path
  elif isinstance(want, dict):
    assert set(got) == set(want), path
    for key in want:
      assert_same_structure(got[key], want[key], f"{path}[{key!r}]")
  elif isinstance(want, (list, tuple)):
    assert len(got) == len(want), path
    for i, (g, w) in enumerate(zip(got, want)):
      assert_same_structure(g, w, f"{path}[{i}]")
  else:
    assert got == want, path


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_restore_continues_exactly_with_dropout_batchnorm_and_adam(
    tmp_path, mode):
  reference = _net(0)
  reference_optimizer = _adam(reference)
  _train(reference, reference_optimizer, steps=range(1, 9))

  _, optimizer, checkpointer = _run_with_checkpoints(
      tmp_path, range(1, 5), mode=mode, every=4)
  checkpointer.finish(4)
  saved_optimizer = optimizer.state_dict()
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [4]
  assert checkpointer.stats()["last_persisted_step"] == 4

  # Another seed: weights, optimizer and the dropout stream all differ
  # unless the restore sets every one of them.
  resumed = _net(5)
  resumed_optimizer = _adam(resumed)
  torch.manual_seed(123)
  point = Checkpointer(_config(mode), str(tmp_path), model=resumed,
                       optimizer=resumed_optimizer,
                       log=_quiet).restore_latest()
  assert point.step == 4 and point.state["step"] == 4
  assert_same_structure(resumed_optimizer.state_dict(), saved_optimizer)
  _train(resumed, resumed_optimizer, steps=range(5, 9))
  for (name, got), want in zip(resumed.state_dict().items(),
                               reference.state_dict().values()):
    assert torch.equal(got, want), name


def test_files_name_tensors_by_state_dict_and_parameter(tmp_path):
  # The checkpoint of step 2 is taken in a run that goes on to step 4; what
  # it must hold comes from a model trained alone for 2 steps (`_net`
  # seeds the generator, so the dropout draws are the same too).
  expected = _net(0)
  expected_optimizer = _sgd(expected)
  _train(expected, expected_optimizer, steps=range(1, 3))
  expected_rng = torch.get_rng_state()

  model, _, checkpointer = _run_with_checkpoints(
      tmp_path, range(1, 5), mode="sync", make_optimizer=_sgd)
  checkpointer.finish(4)
  path = tmp_path / "ckpt-0000000002"
  weights = safetensors.torch.load_file(str(path / "model.safetensors"))
  assert list(weights) == list(model.state_dict())
  assert "1.num_batches_tracked" in weights  # buffers too
  for name, want in expected.state_dict().items():
    assert torch.equal(weights[name], want), name
  slots = safetensors.torch.load_file(str(path / "optimizer.safetensors"))
  assert set(slots) == {f"{name}.momentum_buffer"
                        for name, _ in model.named_parameters()}
  assert torch.equal(
      slots["0.weight.momentum_buffer"],
      expected_optimizer.state[expected[0].weight]["momentum_buffer"])
  rng = safetensors.torch.load_file(str(path / "rng.safetensors"))
  assert torch.equal(rng["cpu"], expected_rng)
  assert not torch.equal(rng["cpu"], torch.get_rng_state())  # 2 steps on


def test_a_ddp_model_checkpoints_as_the_plain_module(tmp_path):
  # The expectation: the plain module trained alone (one DDP process
  # all-reduces with itself, so its gradients are the plain ones).
  expected = _net(0)
  _train(expected, torch.optim.SGD(expected.parameters(), lr=0.1),
         steps=range(1, 3))
  rendezvous.init_process_group("gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
  try:
    model = _net(0)
    wrapped = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    checkpointer = Checkpointer(_config(every=2), str(tmp_path),
                                model=wrapped, optimizer=optimizer,
                                log=_quiet)
    _train(wrapped, optimizer, checkpointer, steps=range(1, 4))
    checkpointer.close()
  finally:
    dist.destroy_process_group()
  loaded = checkpoint_files.load_latest(str(tmp_path))
  assert loaded.step == 2
  assert list(loaded.groups["model"]) == list(model.state_dict())
  plain = _net(9)
  plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
  snapshot.restore(loaded, model=plain, optimizer=plain_optimizer)
  for (name, got), want in zip(plain.state_dict().items(),
                               expected.state_dict().values()):
    assert torch.equal(got, want), name


def test_restoring_into_another_model_names_the_first_difference_and_changes_nothing(  # pylint: disable=line-too-long
    tmp_path):
  _run_with_checkpoints(tmp_path, range(1, 3))[2].close()

  wider = _net(1, hidden=32)
  before = {k: v.clone() for k, v in wider.state_dict().items()}
  # A checkpointer holds its directory until closed, a failed one too.
  checkpointer = Checkpointer(_config(every=2), str(tmp_path), model=wider,
                              optimizer=_adam(wider), log=_quiet)
  with pytest.raises(CheckpointMismatchError) as raised:
    checkpointer.restore_latest()
  checkpointer.close()
  message = str(raised.value)
  assert "does not fit" in message
  assert "'0.weight' (32, 8) float32" in message  # the model's side
  assert "'0.weight' (16, 8) float32" in message  # the checkpoint's side
  for name, value in wider.state_dict().items():
    assert torch.equal(value, before[name]), name

  same, untouched = _net(1), _net(1).state_dict()
  checkpointer = Checkpointer(
      _config(every=2), str(tmp_path), model=same,
      optimizer=torch.optim.SGD(same.parameters(), lr=0.1), log=_quiet)
  with pytest.raises(CheckpointMismatchError, match="Adam state.*SGD"):
    checkpointer.restore_latest()
  checkpointer.close()
  for name, value in same.state_dict().items():
    assert torch.equal(value, untouched[name]), name


def test_bfloat16_tensors_round_trip(tmp_path):
  model = _net(0).to(torch.bfloat16)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  checkpointer = Checkpointer(_config(every=1), str(tmp_path), model=model,
                              optimizer=optimizer, log=_quiet)
  optimizer.zero_grad()
  model(_X.to(torch.bfloat16)).float().sum().backward()
  optimizer.step()
  assert checkpointer.is_due(1) and checkpointer.save(1)
  checkpointer.close()
  weights = safetensors.torch.load_file(
      str(tmp_path / "ckpt-0000000001" / "model.safetensors"))
  assert weights["0.weight"].dtype == torch.bfloat16
  restored = _net(3).to(torch.bfloat16)
  restored_optimizer = torch.optim.SGD(restored.parameters(), lr=0.1,
                                       momentum=0.9)
  snapshot.restore(checkpoint_files.load_latest(str(tmp_path)),
                   model=restored, optimizer=restored_optimizer)
  for (name, got), want in zip(restored.state_dict().items(),
                               model.state_dict().values()):
    assert got.dtype == want.dtype and torch.equal(got, want), name
  assert_same_structure(restored_optimizer.state_dict(),
                        optimizer.state_dict())


def test_a_dtype_the_format_cannot_store_is_refused_by_name(tmp_path):
  model = _net(0)
  model.register_buffer("phase", torch.zeros(2, dtype=torch.complex64))
  with pytest.raises(CheckpointError, match="'phase'.*complex64"):
    Checkpointer(_config(), str(tmp_path), model=model,
                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


class _HeldPersist(Checkpointer):
  """Its persist, once begun, waits until the test lets it go on."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.persist_began = threading.Event()
    self.go_on = threading.Event()

  def _to_host(self, value):
    self.persist_began.set()
    if not self.go_on.wait(timeout=120):
      raise RuntimeError("the test never let the persist go on")
    return super()._to_host(value)


def test_the_snapshot_is_a_copy_taken_between_steps(tmp_path):
  # The persist of step 2 is held until step 3 has updated the weights and
  # the momentum in place: what lands on disk must still be step 2's.
  model, optimizer, checkpointer = _run_with_checkpoints(
      tmp_path, range(1, 3), make_optimizer=_sgd,
      checkpointer=_HeldPersist)
  at_step_2 = {k: v.clone() for k, v in model.state_dict().items()}
  momentum_at_2 = optimizer.state[model[0].weight]["momentum_buffer"].clone()
  assert checkpointer.persist_began.wait(timeout=120)
  _train(model, optimizer, steps=range(3, 4))
  assert not torch.equal(model[0].weight, at_step_2["0.weight"])
  checkpointer.go_on.set()
  checkpointer.close()
  path = tmp_path / "ckpt-0000000002"
  weights = safetensors.torch.load_file(str(path / "model.safetensors"))
  for name, want in at_step_2.items():
    assert torch.equal(weights[name], want), name
  slots = safetensors.torch.load_file(str(path / "optimizer.safetensors"))
  assert torch.equal(slots["0.weight.momentum_buffer"], momentum_at_2)


def test_a_run_that_trains_no_step_after_a_restore_writes_nothing(tmp_path):
  # A finished run started again, or one asked for fewer steps than its
  # checkpoint has: nothing is trained, so nothing may be written (a save
  # would label the restored state with the step asked for).
  _run_with_checkpoints(tmp_path, range(1, 6), every=3)[2].finish(5)
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [3, 5]
  newest = os.stat(tmp_path / "ckpt-0000000005")
  for last_step in (5, 4):
    again = _net(1)
    checkpointer = Checkpointer(_config(every=3), str(tmp_path), model=again,
                                optimizer=_adam(again), log=_quiet)
    assert checkpointer.restore_latest().step == 5
    checkpointer.finish(last_step)
    assert checkpoint_files.list_checkpoints(str(tmp_path)) == [3, 5]
    assert checkpointer.stats()["num_saved"] == 0
    now = os.stat(tmp_path / "ckpt-0000000005")
    assert (now.st_ino, now.st_mtime_ns) == (newest.st_ino,
                                             newest.st_mtime_ns)


@needs_cuda
def test_cuda_snapshot_lands_in_pinned_buffers_before_the_next_step(
    tmp_path):
  model = _net(0).cuda()
  optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
  checkpointer = Checkpointer(_config(every=2), str(tmp_path), model=model,
                              optimizer=optimizer, log=_quiet)
  x, y = _X.cuda(), _Y.cuda()
  for step in range(1, 4):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    if step == 2:
      at_step_2 = {k: v.cpu() for k, v in model.state_dict().items()}
    if checkpointer.is_due(step):
      groups, _ = checkpointer._take()  # pylint: disable=protected-access
      assert all(c.tensor.is_pinned() for c in groups["model"].values())
      checkpointer.save(step)
  checkpointer.close()
  loaded = checkpoint_files.load_latest(str(tmp_path))
  for name, want in at_step_2.items():
    np.testing.assert_array_equal(loaded.groups["model"][name], want.numpy())
  assert "cuda" in loaded.groups["rng"]


_PLAIN_TORCH_LOAD = textwrap.dedent("""
    import sys
    import torch
    from torch import nn
    from safetensors.torch import load_file
    assert "tfoverlap" not in sys.modules and "torch_parity" not in sys.modules
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                          nn.Dropout(0.3), nn.Linear(16, 3))
    model.load_state_dict(load_file(sys.argv[1] + "/model.safetensors"))
    model.eval()
    x = torch.load(sys.argv[2])
    torch.save(model(x), sys.argv[3])
""")


def test_checkpoint_weights_load_into_plain_torch_without_tfoverlap(
    tmp_path):
  # The expectation is a model trained alone for 3 steps; the checkpoint
  # of step 3 is taken in a run that goes on to step 6.
  expected = _net(0)
  _train(expected, _adam(expected), steps=range(1, 4))
  directory = str(tmp_path / "ckpts")
  _run_with_checkpoints(directory, range(1, 7), every=3)[2].close()
  torch.save(_X[:10], str(tmp_path / "x.pt"))
  checkpoint_support.run_without_checkout(
      _PLAIN_TORCH_LOAD, os.path.join(directory, "ckpt-0000000003"),
      str(tmp_path / "x.pt"), str(tmp_path / "y.pt"), cwd=str(tmp_path))
  expected.eval()
  with torch.no_grad():
    want = expected(_X[:10])
  assert torch.equal(torch.load(str(tmp_path / "y.pt")), want)


# --- Through the trainer: real `python -m torch_parity.train` processes ----

# One intra-op thread: in one full-suite run on a loaded host, the
# uninterrupted run's digest differed from every resumed run's with the
# default thread count, while the same tests agreed when run alone.
TRAINER = trainer_checkpoints.Trainer(
    "torch_parity.train", ["--intra_op_threads=1", "--inter_op_threads=1"])


@pytest.fixture(scope="module")
def trainer():
  return TRAINER


def test_sync_stopped_and_resumed_run_ends_bit_identical(
    tmp_path, uninterrupted_digest):
  args = ["--checkpoint=sync", "--checkpoint_every=5"]
  TRAINER.run(tmp_path, *args, "--train_steps=15")
  first = trainer_checkpoints.record(tmp_path)["checkpoint"]
  # Written on the training thread: nothing is left to a persist thread.
  assert first["mode"] == "sync" and first["num_saved"] == 3
  assert first["persist_s"]["count"] == 0
  trainer_checkpoints.check_resume_ends_bit_identical(
      TRAINER, tmp_path, args, uninterrupted_digest, stopped_at=15)


def test_a_finished_run_started_again_trains_and_writes_nothing(
    tmp_path, stopped_at_20):
  directory = checkpoint_support.resume_from(stopped_at_20, tmp_path)
  before = checkpoint_support.checkpoint_identity(directory, 20)
  TRAINER.run(tmp_path, *trainer_checkpoints.ASYNC_EVERY_10,
              "--train_steps=20")
  record = trainer_checkpoints.record(tmp_path)
  assert record["steps"] == 0
  assert record["checkpoint"]["restore"]["step"] == 20
  assert record["checkpoint"]["num_saved"] == 0
  assert checkpoint_files.list_checkpoints(directory) == [10, 20]
  assert checkpoint_support.checkpoint_identity(directory, 20) == before


def test_restoring_into_another_model_names_the_first_difference(
    tmp_path, stopped_at_20):
  last = trainer_checkpoints.check_another_model_is_refused(
      TRAINER, stopped_at_20, tmp_path)
  assert "'fc1.weight' (512, 768) float32" in last  # the model: 3 * 16 * 16
  assert "'fc1.weight' (512, 192) float32" in last  # the checkpoint: 3 * 8 * 8


def _launch(model_dir, *args):
  result = subprocess.run(
      [sys.executable, "-m", "torch_parity.launch", "--num_workers=2", "--",
       f"--model_dir={model_dir}", *trainer_checkpoints.EXACT, *TRAINER.flags,
       *args], cwd=REPO_ROOT, env=subprocess_env(), capture_output=True,
      text=True, timeout=400, check=False)
  assert result.returncode == 0, result.stderr[-4000:]
  return (trainer_checkpoints.record(model_dir),
          trainer_checkpoints.record(os.path.join(model_dir, "worker-1")))


# Enough steps that the probe checkpoint's persist (of step 10) is measured,
# and the cadence planned, before the job ends on a host whose fsyncs are
# slow: it tries every 10 steps. Steps take milliseconds; 30 of them gave a
# loaded run no decision at all.
GLOO_STEPS = 100


def test_two_gloo_ranks_agree_write_once_and_resume_together(tmp_path):
  # Two ranks are as deterministic as one here: gloo sums two gradients in
  # one order, every rank seeds alike, and the MLP draws no random numbers
  # while training. So a job resumed from one of its checkpoints must end
  # where the uninterrupted job did, not only with both ranks agreeing.
  uninterrupted = tmp_path / "uninterrupted"
  args = ["--checkpoint=async", "--checkpoint_every=auto",
          "--checkpoint_max_overhead=0.5", "--checkpoint_keep=3",
          f"--train_steps={GLOO_STEPS}"]
  chief, other = _launch(uninterrupted, *args)
  assert chief["checkpoint"]["writer"] and not other["checkpoint"]["writer"]
  assert chief["checkpoint"]["num_persisted"] >= 2
  assert other["checkpoint"]["num_persisted"] == 0
  assert other["checkpoint"]["num_saved"] == 0
  # Every decision was planned from the same all-reduced numbers, so the
  # reasons (which quote the measured costs) are identical too.
  assert chief["checkpoint"]["decisions"], chief["checkpoint"]
  assert chief["checkpoint"]["decisions"] == other["checkpoint"]["decisions"]
  assert chief["weights_digest"] == other["weights_digest"]
  assert not os.path.exists(uninterrupted / "worker-1" / "checkpoints")
  steps = checkpoint_files.list_checkpoints(
      str(uninterrupted / "checkpoints"))
  assert steps[-1] == GLOO_STEPS  # the final state, and at least one before

  # A copy of its checkpoints but the final one, as if stopped after the
  # one before.
  resumed = tmp_path / "resumed"
  checkpoint_support.resume_from(uninterrupted, resumed, drop=[GLOO_STEPS])
  restored = steps[-2]
  resumed_chief, resumed_other = _launch(resumed, *args)
  assert resumed_chief["checkpoint"]["restore"]["step"] == restored
  assert resumed_other["checkpoint"]["restore"]["step"] == restored
  assert resumed_chief["steps"] == resumed_other["steps"] == (
      GLOO_STEPS - restored)
  assert (resumed_chief["weights_digest"] == resumed_other["weights_digest"]
          == chief["weights_digest"])


def test_a_second_trainer_on_a_live_model_dir_is_refused(tmp_path):
  trainer_checkpoints.check_one_writer_per_model_dir(TRAINER, tmp_path)
