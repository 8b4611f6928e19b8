"""Checkpoints on the PyTorch side: real torch, real processes, real files.

Mirrors tests/test_checkpoint.py. In process: snapshot and restore of model,
optimizer and RNG state, DDP and bfloat16 models, mismatches, and the files
loading into plain torch. Through the trainer: resume exactness, SIGKILLs
at random moments, corrupt and mismatched checkpoints, full disks, and a
two-process gloo run with one writer.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import safetensors.torch
import torch
import torch.distributed as dist
from torch import nn

from tfoverlap.core import checkpoint_files
from tfoverlap.core.config import CheckpointConfig
from torch_parity.checkpoint import (CheckpointError, CheckpointMismatchError,
                                     Checkpointer, snapshot)

from tests.helpers import subprocess_env


def _net(seed: int, hidden: int = 16) -> nn.Module:
  torch.manual_seed(seed)
  return nn.Sequential(nn.Linear(8, hidden), nn.BatchNorm1d(hidden),
                       nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 3))


def _adam(model: nn.Module) -> torch.optim.Optimizer:
  # Two groups with different hyperparameters, so their layout is tested.
  first, *rest = list(model.parameters())
  return torch.optim.Adam([{"params": [first], "lr": 3e-2},
                           {"params": rest}], lr=1e-2, betas=(0.8, 0.99))


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

  model = _net(0)
  optimizer = _adam(model)
  checkpointer = Checkpointer(_config(mode), str(tmp_path), model=model,
                              optimizer=optimizer, log=_quiet)
  _train(model, optimizer, checkpointer)
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
  model = _net(0)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  checkpointer = Checkpointer(_config("sync", every=2), str(tmp_path),
                              model=model, optimizer=optimizer, log=_quiet)
  _train(model, optimizer, checkpointer, steps=range(1, 3))
  checkpointer.close()
  path = tmp_path / "ckpt-0000000002"
  weights = safetensors.torch.load_file(str(path / "model.safetensors"))
  assert list(weights) == list(model.state_dict())
  assert "1.num_batches_tracked" in weights  # buffers too
  slots = safetensors.torch.load_file(str(path / "optimizer.safetensors"))
  assert set(slots) == {f"{name}.momentum_buffer"
                        for name, _ in model.named_parameters()}
  assert torch.equal(slots["0.weight.momentum_buffer"],
                     optimizer.state[model[0].weight]["momentum_buffer"])
  rng = safetensors.torch.load_file(str(path / "rng.safetensors"))
  assert torch.equal(rng["cpu"], torch.get_rng_state())


def test_a_ddp_model_checkpoints_as_the_plain_module(tmp_path):
  dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                          world_size=1)
  try:
    model = _net(0)
    wrapped = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    checkpointer = Checkpointer(_config(every=2), str(tmp_path),
                                model=wrapped, optimizer=optimizer,
                                log=_quiet)
    _train(wrapped, optimizer, checkpointer, steps=range(1, 3))
    checkpointer.close()
  finally:
    dist.destroy_process_group()
  loaded = checkpoint_files.load_latest(str(tmp_path))
  assert list(loaded.groups["model"]) == list(model.state_dict())
  plain = _net(9)
  plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
  snapshot.restore(loaded, model=plain, optimizer=plain_optimizer)
  for (name, got), want in zip(plain.state_dict().items(),
                               model.state_dict().values()):
    assert torch.equal(got, want), name


def test_restoring_into_another_model_names_the_first_difference_and_changes_nothing(  # pylint: disable=line-too-long
    tmp_path):
  model = _net(0)
  optimizer = _adam(model)
  checkpointer = Checkpointer(_config(every=2), str(tmp_path), model=model,
                              optimizer=optimizer, log=_quiet)
  _train(model, optimizer, checkpointer, steps=range(1, 3))
  checkpointer.close()

  wider = _net(1, hidden=32)
  before = {k: v.clone() for k, v in wider.state_dict().items()}
  with pytest.raises(CheckpointMismatchError) as raised:
    Checkpointer(_config(every=2), str(tmp_path), model=wider,
                 optimizer=_adam(wider), log=_quiet).restore_latest()
  message = str(raised.value)
  assert "does not fit" in message
  assert "'0.weight' (32, 8) float32" in message  # the model's side
  assert "'0.weight' (16, 8) float32" in message  # the checkpoint's side
  for name, value in wider.state_dict().items():
    assert torch.equal(value, before[name]), name

  same, untouched = _net(1), _net(1).state_dict()
  with pytest.raises(CheckpointMismatchError, match="Adam state.*SGD"):
    Checkpointer(_config(every=2), str(tmp_path), model=same,
                 optimizer=torch.optim.SGD(same.parameters(), lr=0.1),
                 log=_quiet).restore_latest()
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


def test_the_snapshot_is_a_copy_taken_between_steps(tmp_path):
  # The persist of step 2 runs while step 3 updates the weights in place:
  # what lands on disk must be step 2's weights.
  model = _net(0)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
  checkpointer = Checkpointer(_config(every=2), str(tmp_path), model=model,
                              optimizer=optimizer, log=_quiet)
  _train(model, optimizer, checkpointer, steps=range(1, 3))
  at_step_2 = {k: v.clone() for k, v in model.state_dict().items()}
  _train(model, optimizer, steps=range(3, 4))
  checkpointer.close()
  weights = safetensors.torch.load_file(
      str(tmp_path / "ckpt-0000000002" / "model.safetensors"))
  assert not torch.equal(model[0].weight, at_step_2["0.weight"])
  for name, want in at_step_2.items():
    assert torch.equal(weights[name], want), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
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
    try:
      import tfoverlap
      sys.exit("tfoverlap must not be importable here")
    except ImportError:
      pass
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                          nn.Dropout(0.3), nn.Linear(16, 3))
    model.load_state_dict(load_file(sys.argv[1] + "/model.safetensors"))
    model.eval()
    x = torch.load(sys.argv[2])
    torch.save(model(x), sys.argv[3])
""")


def test_checkpoint_weights_load_into_plain_torch_without_tfoverlap(
    tmp_path):
  model = _net(0)
  optimizer = _adam(model)
  directory = str(tmp_path / "ckpts")
  checkpointer = Checkpointer(_config(every=3), directory, model=model,
                              optimizer=optimizer, log=_quiet)
  _train(model, optimizer, checkpointer, steps=range(1, 4))
  checkpointer.close()
  torch.save(_X[:10], str(tmp_path / "x.pt"))
  env = dict(subprocess_env())
  env.pop("PYTHONPATH", None)  # tfoverlap must not be importable
  subprocess.run(
      [sys.executable, "-c", _PLAIN_TORCH_LOAD,
       os.path.join(directory, "ckpt-0000000003"), str(tmp_path / "x.pt"),
       str(tmp_path / "y.pt")], cwd=str(tmp_path), env=env, check=True,
      timeout=120)
  model.eval()
  with torch.no_grad():
    want = model(_X[:10])
  assert torch.equal(torch.load(str(tmp_path / "y.pt")), want)
