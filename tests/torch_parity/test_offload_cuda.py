"""torch_parity.offload on a CUDA device: pinned, non-blocking copies, the
side-stream prefetch and the copy times from CUDA events.

tests/torch_parity/test_offload.py runs the same hooks with the CPU
as the device; these are the paths only a GPU takes. No TensorFlow is
imported: the GPU campaign's cuda_tests part runs this module on a host
without it.
"""

import torch
from torch import nn

from overlap_core.runtime.config import OffloadConfig
from tests.needs_cuda import needs_cuda
from torch_parity import offload

BATCH, STEPS = 8, 3


def _train(config):
  """(model, Offloader or None) after STEPS of momentum SGD on CUDA."""
  device = torch.device("cuda", 0)
  torch.manual_seed(0)
  model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64),
                        nn.Tanh(), nn.Linear(64, 3)).to(device)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  offloader = (offload.apply_offload(model, optimizer, config, device)
               if config else None)
  generator = torch.Generator().manual_seed(1)
  for _ in range(STEPS):
    inputs = torch.randn(BATCH, 16, generator=generator).to(device)
    targets = torch.randint(0, 3, (BATCH,), generator=generator).to(device)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()
  torch.cuda.synchronize(device)
  return model, offloader


@needs_cuda
def test_pinned_prefetched_activations_train_as_without_offload():
  config = OffloadConfig(("activations",), pin_memory=True,
                         non_blocking=True, prefetch=True)
  model, offloader = _train(config)
  summary = offloader.summary(num_steps=STEPS)
  assert summary["copies_timed_with"] == "cuda_events"
  for direction in ("to_host", "to_device"):
    # Copies were timed by their pairs of CUDA events, and took some time.
    assert summary[direction]["tensors"] > 0
    assert summary[direction]["timed_copies"] > 0
    assert summary[direction]["copy_ms"]["max"] > 0
  # The side stream fetched tensors back ahead of their use.
  assert summary["prefetched_tensors"] > 0
  # A copy changes no value: the weights are those of a run without it.
  plain, _ = _train(None)
  for (name, got), want in zip(model.state_dict().items(),
                               plain.state_dict().values()):
    torch.testing.assert_close(got, want, msg=name)
