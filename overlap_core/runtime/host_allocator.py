"""Whether large freed host blocks stay with the process: a CPU-run knob.

glibc's malloc serves a request above its mmap threshold (128 KiB at
start) with a fresh mapping and unmaps it on free. It raises that
threshold to the size of a freed mapped block, up to 32 MiB, and trims
the heap's top once more than twice the threshold lies free there. A
training step allocates and frees the same large temporaries every step
(a convolution's weight gradient, an optimizer's scratch tensors), so
under those rules some of them come back as fresh pages every step, each
4 KiB page paying a fault and a zeroing, and which ones do depends on
what the process happened to free before. The same layers then cost more
in one process than in another: a pipeline stage than the whole-model
pass its layers were profiled in (BENCHMARKS.md, section 13).

  retain  pins both thresholds at 1 GiB (`mallopt`): a freed block below
          that stays in the heap and the next step reuses its pages, as a
          GPU caching allocator does, and as the tcmalloc or jemalloc that
          PyTorch's CPU launcher preloads do. The cost: the process keeps
          its high-water mark of host memory until it exits.
  system  leaves the C library's defaults (and any MALLOC_* environment
          variables the user set).

Both frameworks allocate host tensors through malloc, so one call at the
start of a trainer or planning process covers either. Where the C library
is not glibc nothing changes, and `describe()` says so.

  host_allocator.apply("retain")      # once, before the model is built
  record["environment"]["host_allocator"] = host_allocator.describe()
"""

import ctypes
import platform
from typing import Optional

POLICIES = ("retain", "system")
# A block below this stays in the heap once freed. Larger ones are still
# mapped per request: keeping a freed gigabyte for reuse is not this
# knob's call to make.
RETAIN_BYTES = 1 << 30
# mallopt's parameter numbers, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_applied: Optional[dict] = None


def _glibc_mallopt():
  """glibc's mallopt, or None on another C library."""
  if platform.libc_ver()[0] != "glibc":
    return None
  return getattr(ctypes.CDLL(None), "mallopt", None)


def apply(policy: str) -> dict:
  """Sets this process's allocator policy; returns `describe()`.

  Raises:
    ValueError: a policy not in POLICIES.
  """
  global _applied
  if policy not in POLICIES:
    raise ValueError(f"Invalid host allocator policy: {policy!r}; allowed: "
                     f"{', '.join(POLICIES)}")
  if policy == "system":
    _applied = {"policy": policy, "applied": False,
                "why": "the C library's defaults"}
    return describe()
  mallopt = _glibc_mallopt()
  if mallopt is None:
    _applied = {"policy": policy, "applied": False,
                "why": "not glibc: its allocator is left as it is"}
    return describe()
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  ok = (mallopt(_M_MMAP_THRESHOLD, RETAIN_BYTES) == 1
        and mallopt(_M_TRIM_THRESHOLD, RETAIN_BYTES) == 1)
  _applied = {"policy": policy, "applied": ok,
              "why": (f"glibc keeps freed blocks below {RETAIN_BYTES} bytes"
                      if ok else "glibc's mallopt refused the thresholds")}
  return describe()


def describe() -> dict:
  """What `apply` did in this process, for run.json's environment:
  {"policy", "applied", "why"}; policy None before any call."""
  if _applied is None:
    return {"policy": None, "applied": False, "why": "not set by tfoverlap"}
  return dict(_applied)
