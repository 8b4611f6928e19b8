"""The process-tree CPU clock sees its worker processes' work, live and
reaped."""

import multiprocessing
import time

from overlap_core.runtime.cpu_clock import ProcessTreeClock

# CPU seconds the worker burns. /proc counts in 10 ms ticks, so a reading
# can fall short of the work by a tick for user and one for system time; a
# burn of many ticks keeps that far inside the margin below.
BURN_S = 0.5
MARGIN_S = 0.05


def _burn_then_wait(burnt, release):
  end = time.process_time() + BURN_S
  while time.process_time() < end:
    pass
  burnt.set()
  release.wait(timeout=120)


def test_a_workers_cpu_counts_while_it_lives_and_after_it_is_reaped():
  # As a DataLoader starts its workers: multiprocessing, from this process.
  # fork: the worker only spins and waits, so no state of the parent's
  # threads matters to it, and nothing needs to be importable by name.
  context = multiprocessing.get_context("fork")
  burnt, release = context.Event(), context.Event()
  clock = ProcessTreeClock()
  before = clock()
  worker = context.Process(target=_burn_then_wait, args=(burnt, release))
  worker.start()
  try:
    assert burnt.wait(timeout=120), "the worker never finished its burn"
    live = clock()
    assert live - before >= BURN_S - MARGIN_S
  finally:
    release.set()
    worker.join(timeout=120)
  reaped = clock()
  assert worker.exitcode == 0
  assert reaped >= live  # moved to the reaped account, never backwards
  assert reaped - before >= BURN_S - MARGIN_S


def test_the_clock_never_goes_backwards():
  clock = ProcessTreeClock()
  readings = [clock() for _ in range(500)]
  assert readings == sorted(readings)


def test_the_workers_are_read_at_most_once_per_interval():
  now = [0.0]
  reads = []

  class CountingClock(ProcessTreeClock):
    def children_s(self):
      reads.append(now[0])
      return 0.0

  clock = CountingClock(read_interval_s=0.1, monotonic=lambda: now[0])
  for _ in range(5):  # five steps of 10 ms: one read
    clock()
    now[0] += 0.01
  assert reads == [0.0]
  now[0] = 0.1
  clock()
  assert reads == [0.0, 0.1]
