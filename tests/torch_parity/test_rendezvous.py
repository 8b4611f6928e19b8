"""The world's process group is freed by destroy_process_group.

Run in a fresh interpreter: the pin this guards against comes from a module
imported for the first time while a world exists, and the test process has
long since imported it.
"""

import subprocess
import sys

from tests.helpers import REPO_ROOT, subprocess_env

# Builds an optimizer (which imports torch._dynamo, and with it
# torch.distributed.nn.functional) while the world exists, then asks whether
# the world's group outlives destroy_process_group.
_SCRIPT = """
import weakref
import torch
import torch.distributed as dist
from torch_parity import rendezvous
rendezvous.init_process_group("gloo", store=dist.HashStore(), rank=0,
                              world_size=1)
world = weakref.ref(dist.group.WORLD)
torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
dist.destroy_process_group()
print("world group freed" if world() is None else "world group pinned")
"""


def test_destroy_process_group_frees_the_world_group():
  # Before the fix this printed "pinned": the group's gloo threads then
  # lived on into interpreter finalization, where one freeing the last
  # collective's tensors aborted the process now and then.
  result = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO_ROOT,
                          env=subprocess_env(), capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "world group freed"
