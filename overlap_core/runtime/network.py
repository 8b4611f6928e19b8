"""What a single-host run exposes to the network, and keeping it on loopback.

Framework-neutral: the launchers and both trainers ask here whether an
address stays on this host, which interface is the loopback one, and how
to say, in one line, what a server they cannot close listens on.

  if is_loopback(os.environ["MASTER_ADDR"]):
    ...  # bind the rendezvous store there, not on every interface
"""

import ipaddress
import os
import socket
import sys
from typing import Optional

LOOPBACK_HOST = "127.0.0.1"
_IFF_LOOPBACK = 0x8  # <linux/if.h>


def is_loopback(host: str) -> bool:
  """Whether every address `host` resolves to is a loopback address."""
  if not host:
    return False
  try:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
  except (OSError, UnicodeError):
    return False
  return bool(infos) and all(
      ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback
      for info in infos)


def loopback_interface() -> Optional[str]:
  """The name of this host's loopback interface ("lo"), or None.

  Read from Linux's /sys/class/net; elsewhere None, and callers keep their
  framework's default.
  """
  for _, name in socket.if_nameindex():
    try:
      with open(f"/sys/class/net/{name}/flags", encoding="ascii") as f:
        if int(f.read().strip(), 16) & _IFF_LOOPBACK:
          return name
    except (OSError, ValueError):
      continue
  return None


def bind_loopback_listener(host: str, port: int) -> socket.socket:
  """A TCP socket listening on `host`:`port` only (port 0: any free one).

  Raises:
    ValueError: `host` is not a loopback address.
    OSError: the port is taken.
  """
  if not is_loopback(host):
    raise ValueError(f"host={host!r}: not a loopback address")
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  listener = socket.socket(family, socket.SOCK_STREAM)
  try:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen()
  except OSError:
    listener.close()
    raise
  return listener


def exposure_warning(program: str, server: str, address: str,
                     reason: str) -> str:
  """The one line a launcher or trainer prints when it starts a server
  that listens on every interface because the framework offers no bind
  address."""
  return (f"{program}: warning: {server} listens on all interfaces "
          f"({address}), reachable from the network without "
          f"authentication: {reason}")


def print_warning(line: str) -> None:
  """Prints one warning line to stderr in a single write.

  The workers of a launched job share the launcher's stderr pipe; print()
  writes the text and its newline separately, so two workers' lines could
  run together. One write of under PIPE_BUF bytes to a pipe is atomic.
  """
  sys.stderr.flush()
  os.write(sys.stderr.fileno(), (line + "\n").encode())
