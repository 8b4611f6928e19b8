"""Joining a launched PyTorch world without listening on the network.

`torch_parity.launch` gives every rank MASTER_ADDR=127.0.0.1. Left to
itself, torch's rendezvous store (a TCPStore hosted by rank 0) listens on
every interface ("::") whatever host it is given, and gloo listens on the
address the host name resolves to. A world whose MASTER_ADDR is a loopback
address lives on this host, so here nothing of it listens beyond loopback:

- rank 0 binds the store's socket to MASTER_ADDR itself and hands it to
  the TCPStore (`master_listen_fd`, which torch offers for this);
- gloo gets the loopback interface (GLOO_SOCKET_IFNAME, unless set).

Any other MASTER_ADDR (a multi-host torchrun), or torchrun's agent store
(TORCHELASTIC_USE_AGENT_STORE: the agent listens, not rank 0), joins with
torch's own `env://` rendezvous.

Every process group the toolkit starts goes through `init_process_group`
here, which keeps the world's group free to be destroyed (see there).
"""

import datetime
import importlib
import os

import torch.distributed as dist

from overlap_core.runtime import network


def join_launched_world(backend: str, *, rank: int, world_size: int,
                        timeout: datetime.timedelta) -> None:
  """init_process_group for one rank of a launched world.

  Raises:
    OSError: rank 0 cannot bind MASTER_ADDR:MASTER_PORT.
    RuntimeError: the rendezvous fails or times out (torch's own errors).
  """
  host = os.environ.get("MASTER_ADDR", "")
  if (not network.is_loopback(host) or
      os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)):
    init_process_group(backend, init_method="env://", rank=rank,
                       world_size=world_size, timeout=timeout)
    return
  loopback = network.loopback_interface()
  if loopback:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
  store = _loopback_store(host, int(os.environ["MASTER_PORT"]), rank=rank,
                          world_size=world_size, timeout=timeout)
  init_process_group(backend, store=store, rank=rank, world_size=world_size,
                     timeout=timeout)


def init_process_group(backend: str, **kwargs) -> None:
  """torch.distributed.init_process_group, once nothing can pin the world.

  `torch.distributed.nn.functional` takes `group=group.WORLD` as default
  arguments, read when it is imported. Imported while a world exists (it
  comes in with torch._dynamo, which the first optimizer built imports), it
  holds that world's group for the life of the interpreter, past
  destroy_process_group. The group's gloo worker threads then live until
  the interpreter finalizes; one still freeing a finished collective's
  tensors there takes the GIL from a dying interpreter, and the process
  aborts after its work is done ("terminate called without an active
  exception": 4 of about 100 two-rank runs on two cores).
  Imported first, the defaults are None, destroy_process_group frees the
  group, and its destructor joins those threads.
  """
  importlib.import_module("torch.distributed.nn")
  dist.init_process_group(backend, **kwargs)


def _loopback_store(host: str, port: int, *, rank: int, world_size: int,
                    timeout: datetime.timedelta) -> dist.TCPStore:
  """The world's TCPStore, served by rank 0 on `host` only."""
  if rank != 0:
    return dist.TCPStore(host, port, world_size, is_master=False,
                         timeout=timeout)
  listener = network.bind_loopback_listener(host, port)
  try:
    store = dist.TCPStore(host, port, world_size, is_master=True,
                          timeout=timeout,
                          master_listen_fd=listener.fileno())
  except BaseException:
    listener.close()
    raise
  listener.detach()  # the store serves on it and closes it
  return store
