"""One rank of the burst-runtime test: two steps of a small model.

  python -m tests.torch_parity.burst_rank OUT_DIR

The rank, world size and rendezvous come from the torchrun environment
(`torch_parity.launch.torchrun_env`). Rank r writes OUT_DIR/rank<r>.pt: the
loss of each step, the gradients after the first step (each layer's, as
its group summed them) and the samples each layer computed on this rank.
"""

import datetime
import os
import sys

import torch
from torch import nn

from torch_parity import burst, rendezvous

BATCH = 8
# At least two widths, with a gather (2 -> 1) and a scatter (1 -> 2).
WIDTHS = {"0": 2, "1": 2, "2": 1, "3": 1, "4": 2, "5": 2}


def build_model() -> nn.Module:
  torch.manual_seed(0)
  return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
                       nn.Flatten(), nn.Linear(4 * 8 * 8, 16), nn.ReLU(),
                       nn.Linear(16, 10))


def batch():
  generator = torch.Generator().manual_seed(1)
  return (torch.randn(BATCH, 1, 8, 8, generator=generator),
          torch.randint(0, 10, (BATCH,), generator=generator))


def main(out_dir: str) -> int:
  rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
  rendezvous.join_launched_world("gloo", rank=rank, world_size=world,
                                 timeout=datetime.timedelta(seconds=120))
  module = build_model()
  x, y = batch()
  model = burst.BurstModel(module, WIDTHS, global_batch=BATCH,
                           example_input=x[:2])
  seen = {}
  for name, layer in module.named_children():
    layer.register_forward_hook(
        lambda m, inputs, out, name=name: seen.setdefault(name, []).append(
            int(inputs[0].shape[0])))
  optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
  losses, grads = [], None
  for _ in range(2):
    optimizer.zero_grad()
    out = model(model.local_input(x))
    loss = nn.functional.cross_entropy(out, model.local_rows(y),
                                       reduction="sum") / BATCH
    loss.backward()
    model.allreduce_gradients()
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)
    losses.append(float(total))
    if grads is None:
      grads = {n: p.grad.clone() for n, p in module.named_parameters()
               if p.grad is not None}
    optimizer.step()
  torch.save({"losses": losses, "grads": grads, "seen": seen},
             os.path.join(out_dir, f"rank{rank}.pt"))
  torch.distributed.destroy_process_group()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
