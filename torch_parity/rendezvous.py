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
"""

import datetime
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
    dist.init_process_group(backend, init_method="env://", rank=rank,
                            world_size=world_size, timeout=timeout)
    return
  loopback = network.loopback_interface()
  if loopback:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
  store = _loopback_store(host, int(os.environ["MASTER_PORT"]), rank=rank,
                          world_size=world_size, timeout=timeout)
  dist.init_process_group(backend, store=store, rank=rank,
                          world_size=world_size, timeout=timeout)


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
