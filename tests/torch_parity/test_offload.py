"""PyTorch CPU offload: which tensors went to the host and came back, the
bytes moved, and that training computes exactly what it computes without.

On this CPU-only host the "device" is the CPU too, so every offload copy is
a CPU-to-CPU copy: the hooks, counts and bytes are those of a GPU run, and
the results must be bit-identical (a copy changes no value, and the same
operations run in the same order).
"""

import pytest
import torch
from torch import nn

from overlap_core.runtime.config import OffloadConfig
from torch_parity import offload

from tests.helpers import run_module
from tests.record_checks import (copied_ms, derived_offload_spans_us,
                                 offload_copy_spans_us, run_small_cnn)

BATCH = 2
CPU = torch.device("cpu")


def _tiny_model():
  torch.manual_seed(0)
  return nn.Sequential(nn.Linear(4, 8, bias=False), nn.Tanh(),
                       nn.Linear(8, 3, bias=False))


def _run_steps(model, optimizer, sample_shape, num_steps) -> float:
  """`num_steps` of training on seeded random 3-class batches; the last
  loss."""
  generator = torch.Generator().manual_seed(1)
  for _ in range(num_steps):
    inputs = torch.randn(BATCH, *sample_shape, generator=generator)
    targets = torch.randint(0, 3, (BATCH,), generator=generator)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
  return loss.item()


def _train(config, num_steps=3):
  """(last loss, state_dict, Offloader or None) after num_steps of SGD."""
  model = _tiny_model()
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  offloader = (offload.apply_offload(model, optimizer, config, CPU)
               if config else None)
  loss = _run_steps(model, optimizer, (4,), num_steps)
  return loss, model.state_dict(), offloader


def _assert_same_training(state, loss, train=None):
  """The loss and every weight equal `train(None)`'s, the run without offload."""
  base_loss, base_state, _ = (train or _train)(None)
  assert loss == base_loss
  for name, tensor in base_state.items():
    assert torch.equal(state[name], tensor), name


@pytest.mark.parametrize("prefetch", [False, True])
def test_activations_go_to_host_and_come_back(prefetch):
  loss, state, offloader = _train(
      OffloadConfig(("activations",), prefetch=prefetch))
  summary = offloader.summary(num_steps=3)
  # Saved per step: the first Linear's input (4 floats per example), Tanh's
  # result (8) and the second Linear's input, the same values saved again
  # by another node (8). The weights (saved transposed) are parameters and
  # stay put.
  per_step_bytes = BATCH * (4 + 8 + 8) * 4
  assert summary["to_host"]["tensors"] == 3 * 3
  assert summary["to_host"]["bytes"] == 3 * per_step_bytes
  # Every saved tensor came back exactly once, in backward.
  assert summary["to_device"]["tensors"] == summary["to_host"]["tensors"]
  assert summary["to_device"]["bytes"] == summary["to_host"]["bytes"]
  assert summary["to_host"]["timed_copies"] == 9
  assert summary["to_host"]["copy_ms"]["min"] >= 0
  # With prefetch, restoring the last layer's tensors fetched the earlier
  # layers' ahead of use: all but the first layer restored (Tanh's) are.
  assert summary["prefetched_tensors"] == (3 * 2 if prefetch else 0)
  _assert_same_training(state, loss)


NUM_CHAIN_BLOCKS = 8


def _chain_model():
  """Conv-BN-ReLU blocks: BatchNorm saves several tensors per layer, the
  case where a prefetch per restore would run ahead of backward."""
  torch.manual_seed(0)
  blocks = []
  for _ in range(NUM_CHAIN_BLOCKS):
    blocks += [nn.Conv2d(2, 2, 3, padding=1, bias=False), nn.BatchNorm2d(2),
               nn.ReLU()]
  return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(2 * 4 * 4, 3))


def _train_chain(config, watch=None):
  """(last loss, state_dict, Offloader or None) after 2 steps of the chain;
  `watch(offloader)` is called before training."""
  model = _chain_model()
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
  offloader = (offload.apply_offload(model, optimizer, config, CPU)
               if config else None)
  if watch is not None:
    watch(offloader)
  loss = _run_steps(model, optimizer, (2, 4, 4), num_steps=2)
  return loss, model.state_dict(), offloader


def test_prefetch_stays_one_layer_ahead_of_backward():
  ahead_at_restore = []  # per restore: the layers fetched ahead of its own

  def watch(offloader):
    activations = offloader.activations
    restore = activations.unpack

    def unpack(saved):
      if isinstance(saved, offload._Saved):  # pylint: disable=protected-access
        ahead_at_restore.append([layer for layer in
                                 activations.layers_fetched_ahead()
                                 if layer < saved.layer])
      return restore(saved)

    activations.unpack = unpack

  loss, state, offloader = _train_chain(
      OffloadConfig(("activations",), non_blocking=True, prefetch=True),
      watch)
  # Never more than the next layer waits on the device; a prefetch per
  # restore had fetched every layer before backward was halfway.
  assert max(len(ahead) for ahead in ahead_at_restore) == 1
  summary = offloader.summary(num_steps=2)
  # Every layer that saves anything but the first one restored is fetched
  # ahead, once a step, all its tensors: everything restored but the
  # Linear's input.
  assert summary["prefetched_tensors"] == (
      summary["to_device"]["tensors"] - 2 * 1)
  assert summary["to_device"]["tensors"] == summary["to_host"]["tensors"]
  _assert_same_training(state, loss, train=_train_chain)


@pytest.mark.parametrize("prefetch", [False, True])
def test_parameters_live_on_host_between_uses(prefetch):
  loss, state, offloader = _train(
      OffloadConfig(("parameters",), prefetch=prefetch))
  summary = offloader.summary(num_steps=3)
  weight_bytes = (4 * 8 + 8 * 3) * 4
  # Each weight comes to the device for its forward and for its backward;
  # its gradient goes to the host, where the optimizer steps.
  assert summary["to_device"]["tensors"] == 3 * 2 * 2
  assert summary["to_device"]["bytes"] == 3 * 2 * weight_bytes
  assert summary["to_host"]["tensors"] == 3 * 2
  assert summary["to_host"]["bytes"] == 3 * weight_bytes
  # The first step learns the layer order; the next two prefetch the
  # second layer in forward and the first in backward.
  assert summary["prefetched_tensors"] == (2 * 2 if prefetch else 0)
  # Between steps every weight is its host copy (the device copy dropped).
  for layer in offloader.parameters._layers:  # pylint: disable=protected-access
    for parameter in layer.parameters(recurse=False):
      assert not offloader.parameters._on_device(parameter)  # pylint: disable=protected-access
  _assert_same_training(state, loss)


def test_copies_in_series_become_the_offload_copy_phase():
  _, _, offloader = _train(OffloadConfig(
      ("activations", "parameters"), non_blocking=True, prefetch=True),
      num_steps=1)
  summary = offloader.summary(num_steps=1)
  copied_s = sum(summary[d]["copy_ms"]["total"]
                 for d in ("to_host", "to_device")) / 1e3
  # On the CPU every copy, prefetches too, runs on the training thread:
  # all of the step's copy time is carved out of its compute span.
  (copy, copy_start, copy_end), (compute, compute_start, compute_end) = (
      offloader.split_compute(10.0, 11.0))
  assert (copy, compute) == ("offload", "compute")
  assert copy_start == 10.0 and compute_end == 11.0
  assert copy_end == compute_start == pytest.approx(10.0 + copied_s,
                                                   rel=1e-9)
  assert copy_end > copy_start
  # Taken once: the next step starts from nothing.
  assert offloader.split_compute(12.0, 13.0)[0][2] == 12.0


def test_both_with_every_knob_trains_the_same():
  loss, state, offloader = _train(OffloadConfig(
      ("activations", "parameters"), non_blocking=True, prefetch=True))
  summary = offloader.summary(num_steps=3)
  assert summary["targets"] == ["activations", "parameters"]
  assert summary["to_host"]["tensors"] == 3 * 3 + 3 * 2
  _assert_same_training(state, loss)


def test_pinning_without_cuda_is_refused():
  with pytest.raises(ValueError, match="pin_memory"):
    _train(OffloadConfig(("activations",), pin_memory=True))


def _run(tmp_path, name, *args):
  return run_small_cnn("torch_parity.train", tmp_path / name, "--evaluate=false", *args)


def _assert_copy_phase(record, section):
  """The ledger's offload phase holds the run's copies: on the CPU
  all of them, each step's within its compute span."""
  spans_us = offload_copy_spans_us(record)
  assert record["phases"]["offload"]["mean"] > 0
  # The trace rounds each span to a nanosecond.
  assert sum(spans_us) / 1e3 == pytest.approx(copied_ms(section),
                                              abs=1e-6 * len(spans_us))


def test_trainer_records_offload_and_matches_the_plain_run(tmp_path):
  _, plain = _run(tmp_path, "plain")
  result, offloaded = _run(tmp_path, "offloaded",
                           "--offload=activations,parameters",
                           "--offload_non_blocking", "--offload_prefetch")
  assert plain["offload"] is None
  section = offloaded["offload"]
  assert section["targets"] == ["activations", "parameters"]
  assert section["to_host"]["bytes"] > 0
  assert section["to_device"]["tensors"] > section["to_host"]["tensors"]
  assert section["copies_timed_with"] == "perf_counter"
  _assert_copy_phase(offloaded, section)
  assert "offload" not in plain["phases"]
  assert offloaded["weights_digest"] == plain["weights_digest"]
  assert offloaded["final"]["train_loss"] == plain["final"]["train_loss"]
  assert result.stderr.count(offload.NO_GPU_NOTICE) == 1


def test_a_paused_offloader_copies_nothing_and_resumes():
  model = _tiny_model()
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  offloader = offload.apply_offload(model, optimizer,
                                    OffloadConfig(("activations",)), CPU)
  with offloader.paused():
    _run_steps(model, optimizer, (4,), 1)
  assert offloader.stats.summary(num_steps=1)["to_host"]["tensors"] == 0
  _run_steps(model, optimizer, (4,), 1)
  saved = offloader.stats.summary(num_steps=1)["to_host"]["tensors"]
  assert saved > 0
  offloader.discard_records()
  assert offloader.stats.summary(num_steps=1)["to_host"]["tensors"] == 0
  assert offloader.copier.take_serial_s() == 0.0


def test_parameters_offload_cannot_be_paused():
  _, _, offloader = _train(OffloadConfig(("parameters",)), num_steps=1)
  assert not offloader.can_pause
  with pytest.raises(RuntimeError, match="weights live on the host"):
    with offloader.paused():
      pass


def test_trainer_derives_the_offload_phase_from_the_step_timed_alone(
    tmp_path):
  _, plain = _run(tmp_path, "plain")
  _, offloaded = _run(tmp_path, "offloaded", "--offload=activations")
  derived_offload_spans_us(offloaded)
  # The calibration's steps are put back: the same training.
  assert offloaded["weights_digest"] == plain["weights_digest"]
  # Without the step timed alone the phase is the copies; either way only
  # the training steps' copies are counted.
  _, copies = _run(tmp_path, "copies", "--offload=activations",
                   "--reference_steps=0")
  offload_copy_spans_us(copies)
  for direction in ("to_host", "to_device"):
    assert offloaded["offload"][direction]["tensors"] == (
        copies["offload"][direction]["tensors"])
    assert offloaded["offload"][direction]["bytes"] == (
        copies["offload"][direction]["bytes"])


def test_trainer_counts_training_copies_only(tmp_path):
  _, record = _run(tmp_path, "parameters", "--offload=parameters",
                   "--evaluate=true")
  assert "eval_accuracy" in record["final"]  # evaluation ran
  # small_cnn's 12 weights (4 Conv2d and 2 Linear, each a weight and a
  # bias) come to the device for forward and for backward, 4 steps; the
  # evaluation's forwards, after the count was taken, add none.
  assert record["offload"]["to_device"]["tensors"] == 12 * 2 * 4
  assert record["offload"]["to_device"]["tensors_per_step"] == 12 * 2


@pytest.mark.parametrize("args, flag", [
    (["--offload=activations", "--offload_pin_memory"],
     "--offload_pin_memory=True"),
    (["--offload=parameters", "--strategy=mirrored", "--num_devices=2"],
     "--offload=parameters"),
    (["--offload=activations", "--offload_prefetch"],
     "--offload_prefetch=True"),
])
def test_trainer_refuses_what_it_cannot_honour(args, flag):
  result = run_module("torch_parity.train", "--model=mlp",
                      "--train_steps=1", *args, timeout=120)
  assert result.returncode == 2, result.stderr
  # The last line: TensorFlow's own start-up logging may come before it.
  assert "Traceback" not in result.stderr
  assert flag in result.stderr.strip().splitlines()[-1], result.stderr
