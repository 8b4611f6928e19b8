"""The saved-tensor meter: activations only, each storage once."""

import torch
from torch import nn

from torch_parity.pipeline_memory import SavedTensorMeter, stage_state


def _peak_bytes(model: nn.Module, micro_batches: int) -> int:
  """The meter's peak over forwards of `micro_batches` micro-batches of 4,
  all held before one backward (GPipe's order)."""
  meter = SavedTensorMeter(stage_state(model))
  inputs = torch.randn(micro_batches * 4, 3, 8, 8)
  with meter.counting(inputs):
    loss = sum(model(chunk).sum() for chunk in inputs.chunk(micro_batches))
  loss.backward()
  return meter.peak_bytes


def test_a_stage_with_batchnorm_holds_m_times_one_micro_batch():
  # BatchNorm's backward saves its running statistics, the stage's state:
  # counted, they would add the same bytes once whatever M, and the
  # fraction 1F1B holds of GPipe's would sit above S/M by them.
  torch.manual_seed(0)
  model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                        nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
  model.train()
  one = _peak_bytes(model, 1)
  assert one > 0
  assert _peak_bytes(model, 8) == 8 * one


def test_the_stage_state_is_its_parameters_and_buffers():
  model = nn.BatchNorm1d(5)
  state = stage_state(model)
  assert len(state) == len(list(model.parameters())) + len(
      list(model.buffers()))
