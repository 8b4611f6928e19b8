"""What a launched run listens on: LISTEN sockets of a process tree, from /proc.

/proc/net/tcp and /proc/net/tcp6 list every TCP socket of this network
namespace with its inode; /proc/<pid>/fd links name the inodes a process
holds. Together they say which process listens on which address, as
`ss -ltnp` does, without needing ss. Linux only.

  for sock in listening_sockets(descendants(launcher.pid)):
    assert sock.is_loopback, sock
"""

import dataclasses
import glob
import ipaddress
import os
import signal
import socket
import subprocess
import threading
from typing import Dict, Iterable, List, Tuple

from tests.helpers import wait_for_line

_TCP_LISTEN = "0A"  # the `st` column of /proc/net/tcp


@dataclasses.dataclass(frozen=True)
class ListeningSocket:
  """One listening TCP socket and the first process found holding it."""
  address: str  # "127.0.0.1", "::", "0.0.0.0", ...
  port: int
  pid: int
  command: str  # that process's command line, space-separated
  inode: int

  @property
  def is_loopback(self) -> bool:
    return ipaddress.ip_address(self.address).is_loopback

  @property
  def is_wildcard(self) -> bool:
    """Listening on every interface (0.0.0.0, or :: which takes IPv4 too)."""
    return ipaddress.ip_address(self.address).is_unspecified


def descendants(pid: int) -> List[int]:
  """Every process below `pid`, including those its threads started."""
  found = []
  for task in glob.glob(f"/proc/{pid}/task/*/children"):
    try:
      with open(task, encoding="utf-8") as f:
        children = [int(p) for p in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
      continue
    for child in children:
      found.append(child)
      found.extend(descendants(child))
  return found


def _decode(hex_address: str, ipv6: bool) -> Tuple[str, int]:
  """"0100007F:1F90" -> ("127.0.0.1", 8080); the kernel writes each 32-bit
  word of the address in host (little-endian) order."""
  hex_ip, hex_port = hex_address.split(":")
  raw = bytes.fromhex(hex_ip)
  raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
  family = socket.AF_INET6 if ipv6 else socket.AF_INET
  return socket.inet_ntop(family, raw), int(hex_port, 16)


def listening_inodes() -> Dict[int, Tuple[str, int]]:
  """{inode: (address, port)} of every listening TCP socket."""
  found = {}
  for name, ipv6 in (("tcp", False), ("tcp6", True)):
    try:
      with open(f"/proc/net/{name}", encoding="ascii") as f:
        rows = f.read().splitlines()[1:]
    except FileNotFoundError:  # no IPv6 in this kernel
      continue
    for row in rows:
      fields = row.split()
      if fields[3] == _TCP_LISTEN:
        found[int(fields[9])] = _decode(fields[1], ipv6)
  return found


def _socket_inodes(pid: int) -> List[int]:
  inodes = []
  for fd in glob.glob(f"/proc/{pid}/fd/*"):
    try:
      target = os.readlink(fd)
    except OSError:  # closed meanwhile, or the process ended
      continue
    if target.startswith("socket:["):
      inodes.append(int(target[len("socket:["):-1]))
  return inodes


def _command(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
  except OSError:
    return ""


def listening_sockets(pids: Iterable[int]) -> List[ListeningSocket]:
  """The listening sockets held by `pids`, each once.

  A forked child (a DataLoader worker) holds its parent's sockets too; each
  socket is reported with the first of `pids` found holding it.
  """
  listening = listening_inodes()
  found = {}
  for pid in pids:
    for inode in _socket_inodes(pid):
      if inode in listening and inode not in found:
        address, port = listening[inode]
        found[inode] = ListeningSocket(address, port, pid, _command(pid),
                                       inode)
  return sorted(found.values(), key=lambda s: (s.pid, s.port))


def environment(pid: int) -> Dict[str, str]:
  """The environment a process started with (empty once it is gone)."""
  try:
    with open(f"/proc/{pid}/environ", "rb") as f:
      items = f.read().split(b"\0")
  except OSError:
    return {}
  return dict(item.decode(errors="replace").split("=", 1)
              for item in items if b"=" in item)


@dataclasses.dataclass
class Snapshot:
  """What a job listened on at one moment, and what it had said by then."""
  sockets: List[ListeningSocket]
  environments: Dict[int, Dict[str, str]]  # of every process of the job
  stderr: str  # everything the job wrote on stderr, to its end


def listening_while_running(argv: List[str], *, until: str, timeout_s: float,
                            cwd: str, env: dict) -> Snapshot:
  """Runs `argv`, and once a stdout line contains `until`, lists the
  listening sockets of its whole process tree; then kills that tree.

  The job is long on purpose (it would train on): the listing happens at a
  known point of its progress, not after a delay.
  """
  job = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
  stderr = []
  reader = threading.Thread(target=lambda: stderr.extend(job.stderr),
                            daemon=True)
  reader.start()
  pids = []
  try:
    wait_for_line(job.stdout, until, timeout=timeout_s)
    pids = [job.pid] + descendants(job.pid)
    sockets = listening_sockets(pids)
    environments = {pid: environment(pid) for pid in pids}
  finally:
    for pid in [job.pid] + descendants(job.pid) + pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    job.wait()
    reader.join(timeout=30)
  return Snapshot(sockets, environments, "".join(stderr))
