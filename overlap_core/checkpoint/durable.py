"""The filesystem steps of a checkpoint commit, each one a failpoint.

Every step that changes what a crash leaves on disk (a file written, a
directory created, renamed or synced, an entry removed) goes through this
module, and announces itself first to `failpoint` when one is set. A test
sets it to crash the process (`os._exit`) or raise at the k-th step, and so
proves that a commit, an overwrite, a prune and the clean-up after a crash are
correct whichever step a crash lands on, as etcd and LevelDB test theirs.

A rename is made durable by syncing the directory it lives in; a created
directory by syncing its parent.
"""

import os
from typing import Callable, Optional

# (operation, path) -> None, called before the operation; None in production.
# Operations: "mkdir", "write", "fsync_dir", "rename", "unlink", "rmdir".
failpoint: Optional[Callable[[str, str], None]] = None


def reach(operation: str, path: str) -> None:
  """Announces `operation` on `path` to the failpoint, if one is set."""
  if failpoint is not None:
    failpoint(operation, path)


def fsync_dir(path: str) -> None:
  """Makes the entries of directory `path` (renames, creations) durable."""
  reach("fsync_dir", path)
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def mkdir(path: str) -> None:
  """Creates one directory and syncs its parent."""
  reach("mkdir", path)
  os.mkdir(path)
  fsync_dir(os.path.dirname(os.path.abspath(path)))


def makedirs(path: str) -> None:
  """Creates `path` and missing parents, each synced into its own parent.

  A checkpoint committed into a directory whose own entry was never synced
  can vanish with that directory after a power cut.
  """
  path = os.path.abspath(path)
  missing = []
  while not os.path.isdir(path):
    missing.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  for directory in reversed(missing):
    try:
      mkdir(directory)
    except FileExistsError:
      if not os.path.isdir(directory):
        raise


def rename(source: str, target: str) -> None:
  """Renames within one directory and syncs it."""
  reach("rename", source)
  os.rename(source, target)
  fsync_dir(os.path.dirname(os.path.abspath(target)))


def unlink(path: str) -> None:
  reach("unlink", path)
  os.unlink(path)


def remove_tree(path: str) -> None:
  """Deletes a directory tree one entry at a time; missing entries are fine.

  One step per entry (not `shutil.rmtree` in one go), so a crash can be
  placed after any of them: callers must only ever remove trees whose
  partial remains are never mistaken for a checkpoint.
  """
  if not os.path.lexists(path):
    return
  if not os.path.isdir(path) or os.path.islink(path):
    _ignore_missing(unlink, path)
    return
  for root, dirs, names in os.walk(path, topdown=False):
    for name in names:
      _ignore_missing(unlink, os.path.join(root, name))
    for name in dirs:
      child = os.path.join(root, name)
      if os.path.islink(child):
        _ignore_missing(unlink, child)
      else:
        _ignore_missing(_rmdir, child)
  _ignore_missing(_rmdir, path)


def _rmdir(path: str) -> None:
  reach("rmdir", path)
  os.rmdir(path)


def _ignore_missing(operation: Callable[[str], None], path: str) -> None:
  try:
    operation(path)
  except FileNotFoundError:
    pass
