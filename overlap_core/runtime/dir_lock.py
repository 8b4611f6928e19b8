"""One writer per directory: an OS lock on `<directory>/LOCK`.

Two runs writing one model directory resume from each other's checkpoints,
prune each other's, and overwrite each other's run.json, trace and
TensorBoard files. As LevelDB and RocksDB do, the writer holds `flock` on a
`LOCK` file for as long as it writes; the kernel releases it when the
holder exits or dies, SIGKILL included, so a stale LOCK file never blocks
the next run. The file also names its holder (pid, host, start time), for
the line that refuses a second writer.

  with dir_lock.acquire(model_dir, setting="--model_dir"):
    ...  # this process alone writes model_dir

Where the filesystem cannot lock (some network filesystems), a warning says
so and the run goes on unprotected; it names the holder the LOCK file
records when that is another host's, whose lock this host cannot check.
Nothing here imports a framework.
"""

import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import weakref
from typing import Callable, Optional

from overlap_core.runtime.config import ConfigError

LOCK_NAME = "LOCK"

# What flock raises where the filesystem has no locks to give (NFS without
# lockd, some FUSE and SMB mounts), as opposed to a lock someone holds.
_CANNOT_LOCK = frozenset(
    code for code in (errno.ENOLCK, errno.EOPNOTSUPP,
                      getattr(errno, "ENOTSUP", None), errno.ENOSYS,
                      errno.EINVAL) if code is not None)


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a directory, as its LOCK file says."""
  pid: int
  host: str
  started: str  # local time, ISO 8601 with its offset

  def describe(self) -> str:
    return f"pid {self.pid} on host {self.host}, started {self.started}"


class DirectoryInUseError(ConfigError):
  """Another writer holds the directory; the message names it in one line.

  A ConfigError, so the trainers exit 2 with it: like a bad flag, the run
  was refused before it wrote anything.
  """

  def __init__(self, setting: str, directory: str, holder: Optional[Holder]):
    self.directory = directory
    self.holder = holder
    who = (holder.describe() if holder else
           "a process that has not yet written its name in LOCK")
    allowed = (f"in use by {who}; allowed: a directory no other run is "
               "writing (wait for that run to end, stop it, or give "
               "another directory)")
    super().__init__(setting.lstrip("-"), directory, allowed)
    if not setting.startswith("--"):  # a Python argument, as ArgumentError
      self.args = (f"{setting}={directory!r}: {allowed}",)


def _warn_to_stderr(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


# The directories this process holds (realpath -> lock). flock already
# refuses a second open of the file in the same process, but NFS emulates
# flock with POSIX locks, which are per process; this makes the same
# process's second writer refused everywhere alike. Weak, so that a lock
# nobody references any more is released, not kept here.
_held: "weakref.WeakValueDictionary[str, DirectoryLock]" = (
    weakref.WeakValueDictionary())
_held_guard = threading.Lock()


class DirectoryLock:
  """A held directory; `release()` (or leaving the `with`) lets it go.

  Attributes:
    directory: the directory held.
    holder: what this process wrote in LOCK.
    locked: False where the filesystem could not lock (a warning said so).
  """

  def __init__(self, directory: str, key: str, fd: int, holder: Holder,
               locked: bool):
    self.directory = directory
    self.holder = holder
    self.locked = locked
    self._key = key
    self._fd: Optional[int] = fd

  def release(self) -> None:
    """Lets the directory go; the LOCK file stays, naming the last holder
    (removing it would race a new holder that opened it already)."""
    with _held_guard:
      if self._fd is None:
        return
      _held.pop(self._key, None)
      fd, self._fd = self._fd, None
    os.close(fd)  # closing the last descriptor releases the flock

  def __enter__(self) -> "DirectoryLock":
    return self

  def __exit__(self, *exc) -> None:
    self.release()

  def __del__(self):
    # A holder dropped without release (a Keras fit that raised skips
    # on_train_end) must not keep the directory from this process forever.
    try:
      self.release()
    except Exception:  # pylint: disable=broad-except
      pass  # at interpreter exit; the kernel releases it then anyway


def acquire(directory: str, *, setting: str = "directory",
            log: Callable[[str], None] = _warn_to_stderr) -> DirectoryLock:
  """Creates `directory` and makes this process its one writer.

  Args:
    directory: the directory to hold.
    setting: how the user named it, for the refusal ("--model_dir" for a
      flag, "directory" for a Python argument).
    log: where the warning goes when the filesystem cannot lock.

  Returns:
    The held lock; release it when the last write is done.

  Raises:
    DirectoryInUseError: another process (or another writer in this one)
      holds it.
  """
  os.makedirs(directory, exist_ok=True)
  key = os.path.realpath(directory)
  with _held_guard:
    mine = _held.get(key)
  if mine is not None:
    raise DirectoryInUseError(setting, directory, mine.holder)
  path = os.path.join(directory, LOCK_NAME)
  # Opened in place and never replaced: flock holds the inode, and a LOCK
  # renamed over would let the next run lock another one. Not inherited by
  # subprocesses (Python's descriptors are non-inheritable).
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  locked = True
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _read_holder(fd)
    os.close(fd)
    raise DirectoryInUseError(setting, directory, holder) from None
  except OSError as e:
    if e.errno not in _CANNOT_LOCK:
      os.close(fd)
      raise
    locked = False
    log(_cannot_lock_warning(directory, e, _read_holder(fd)))
  holder = Holder(pid=os.getpid(), host=socket.gethostname(),
                  started=datetime.datetime.now().astimezone().isoformat(
                      timespec="seconds"))
  _write_holder(fd, holder)
  lock = DirectoryLock(directory, key, fd, holder, locked)
  with _held_guard:
    _held[key] = lock
  return lock


def read_holder(directory: str) -> Optional[Holder]:
  """Whom `directory`'s LOCK file names (alive or not); None if nobody."""
  try:
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY)
  except FileNotFoundError:
    return None
  try:
    return _read_holder(fd)
  finally:
    os.close(fd)


def _cannot_lock_warning(directory: str, error: OSError,
                         recorded: Optional[Holder]) -> str:
  line = (f"warning: {directory}: this filesystem cannot lock "
          f"{LOCK_NAME} ({errno.errorcode.get(error.errno, error.errno)}); "
          "going on without it, so nothing stops a second run writing here")
  if recorded is not None and recorded.host != socket.gethostname():
    line += (f"; {LOCK_NAME} names {recorded.describe()}, which this host "
             "cannot check: if that run is alive, both write here")
  return line


def _write_holder(fd: int, holder: Holder) -> None:
  # One write of the whole line, then the old tail cut: a reader sees a
  # line, not an empty file in between.
  payload = (json.dumps(dataclasses.asdict(holder)) + "\n").encode()
  os.pwrite(fd, payload, 0)
  os.ftruncate(fd, len(payload))


def _read_holder(fd: int) -> Optional[Holder]:
  raw = os.pread(fd, 4096, 0).decode("utf-8", "replace")
  try:
    fields = json.loads(raw.split("\n", 1)[0])
    return Holder(pid=int(fields["pid"]), host=str(fields["host"]),
                  started=str(fields["started"]))
  except (ValueError, KeyError, TypeError):
    return None  # empty (being written) or not ours


def _forget_in_child() -> None:
  # A forked child (a data loader worker) shares the parent's open LOCK;
  # closing its copy keeps the lock the parent's alone, so a SIGKILLed
  # parent's lock goes with it even while such a child lingers.
  global _held_guard
  _held_guard = threading.Lock()  # another thread may have held it
  for lock in list(_held.values()):
    if lock._fd is not None:  # pylint: disable=protected-access
      try:
        os.close(lock._fd)  # pylint: disable=protected-access
      except OSError:
        pass
      lock._fd = None  # pylint: disable=protected-access
  _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
