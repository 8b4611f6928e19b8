"""How much memory to sweep so that a timed layer starts with cold caches.

A profiler that times one layer many times in a row keeps that layer's
weights, inputs and optimizer state in the last-level cache, and on a CPU
a layer whose weights fit there (a 512-channel 3x3 convolution holds 9
MiB) then runs several times faster than it does in training, where the
whole stage streams through between two calls of it. The profilers
therefore write a buffer of `flush_bytes()` the way GPU kernel
benchmarks flush L2: the Keras one before every timed layer call, the
PyTorch one (which times layers inside whole passes of the model) before
every pass, as a training step begins after the optimizer has streamed
every weight.

  size = flush_bytes("cpu")     # twice the last-level cache, at least 64 MiB
"""

import glob
import os

_MIB = 2**20
MIN_CPU_FLUSH_BYTES = 64 * _MIB
# More than any GPU's L2 today (H100: 50 MiB, H200: 60 MiB), with room.
GPU_FLUSH_BYTES = 256 * _MIB
_CACHE_GLOB = "/sys/devices/system/cpu/cpu0/cache/index*/"


def last_level_cache_bytes() -> int:
  """The largest CPU cache sysfs reports; 0 where it reports none."""
  largest = 0
  for index in glob.glob(_CACHE_GLOB):
    try:
      with open(os.path.join(index, "size"), encoding="ascii") as f:
        text = f.read().strip()
    except OSError:
      continue
    scale = {"K": 2**10, "M": _MIB, "G": 2**30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    if digits.isdigit():
      largest = max(largest, int(digits) * scale)
  return largest


def flush_bytes(device_type: str) -> int:
  """Bytes to sweep before a timed call on `device_type` ("cpu", "cuda",
  "gpu"): twice the CPU's last-level cache (so that no part of it
  survives an LRU-like policy), at least MIN_CPU_FLUSH_BYTES; on a GPU,
  GPU_FLUSH_BYTES."""
  if device_type.lower() in ("cuda", "gpu"):
    return GPU_FLUSH_BYTES
  return max(2 * last_level_cache_bytes(), MIN_CPU_FLUSH_BYTES)
