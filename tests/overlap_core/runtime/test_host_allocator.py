"""The host allocator knob: does `retain` really keep freed blocks?"""

import platform
import subprocess
import sys

import pytest

from overlap_core.runtime import host_allocator
from tests.helpers import subprocess_env

# A process that applies a policy, then allocates, fills and frees a 40
# MiB block ten times and prints the page faults those cycles took.
# 40 MiB is above the 32 MiB up to which glibc's own threshold grows, so
# by default every cycle maps fresh memory.
_FAULTS_OF_CYCLES = """
import resource, sys
import numpy as np
from overlap_core.runtime import host_allocator
print(host_allocator.apply(sys.argv[1])["applied"])
def cycle():
  block = np.ones(40 << 20, dtype=np.uint8)
  del block
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
CYCLES = 10
BLOCK_BYTES = 40 << 20
# The largest page a fresh anonymous mapping can fault in at once (x86-64
# transparent huge pages); base pages or smaller folios only fault more.
LARGEST_FAULT_BYTES = 2 << 20


def _faults(policy: str):
  env = {k: v for k, v in subprocess_env().items()
         if not k.startswith("MALLOC_")}
  result = subprocess.run([sys.executable, "-c", _FAULTS_OF_CYCLES, policy],
                          capture_output=True, text=True, env=env,
                          timeout=120, check=True)
  applied, faults = result.stdout.split()
  return applied == "True", int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                    reason="the knob acts on glibc's malloc only")
def test_retain_reuses_a_freed_block_that_the_default_maps_afresh():
  applied, retained = _faults("retain")
  assert applied
  # Reused memory is already mapped: no cycle should fault at all; fewer
  # faults than cycles leaves room for the interpreter's own odd page.
  assert retained < CYCLES
  applied, fresh = _faults("system")
  assert not applied
  # Fresh memory faults at least once per largest page it spans, every
  # cycle: the measurement sees faults when there are some.
  assert fresh >= CYCLES * BLOCK_BYTES // LARGEST_FAULT_BYTES


def test_an_unknown_policy_is_refused_naming_the_allowed_ones():
  with pytest.raises(ValueError, match="allowed: retain, system"):
    host_allocator.apply("tcmalloc")


def test_system_changes_nothing_and_says_so():
  described = host_allocator.apply("system")
  assert described == host_allocator.describe()
  assert described["policy"] == "system" and not described["applied"]
