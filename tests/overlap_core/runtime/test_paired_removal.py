"""The blocks of a paired removal: which steps go without, which count."""

import pytest

from overlap_core.runtime import contention
from overlap_core.runtime import datasets
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import paired_removal
from overlap_core.runtime.paired_removal import (CHECKPOINT, INPUT, WITH,
                                                 WITHOUT, PairedRemoval)


def test_blocks_go_with_without_without_with():
  pairing = PairedRemoval(INPUT, block_steps=3)
  arms = "".join("-" if pairing.removed(s) else "+" for s in range(1, 25))
  assert arms == "+++------++++++------+++"


def test_the_first_half_of_every_block_settles():
  pairing = PairedRemoval(INPUT, block_steps=4)
  assert [s for s in range(1, 13) if pairing.counted(s)] == [3, 4, 7, 8,
                                                            11, 12]
  assert pairing.counted_steps(12, warmup_steps=3) == {WITH: 1, WITHOUT: 4}


def test_only_a_checkpoint_pairing_skips_checkpoints():
  steps = range(1, 17)
  assert not any(PairedRemoval(INPUT, 4).skips_checkpoint(s) for s in steps)
  pairing = PairedRemoval(CHECKPOINT, 4)
  assert [s for s in steps if pairing.skips_checkpoint(s)] == list(
      range(5, 13))


@pytest.mark.parametrize("cause, block_steps", [("none", 4), ("disk", 4),
                                                (INPUT, 1)])
def test_a_pairing_refuses_what_it_cannot_alternate(cause, block_steps):
  with pytest.raises(ValueError):
    PairedRemoval(cause, block_steps)


class _Resident:
  """Stands in for `make_resident_iterator`: batches named by their index,
  and what it was asked for."""

  def __init__(self, start_batch, count, max_bytes):
    self.asked = (start_batch, count, max_bytes)
    self.num_batches = count
    self._batches = iter(range(start_batch, start_batch + count))

  def __next__(self):
    return next(self._batches)


def test_steps_without_input_take_the_batches_after_the_pipelines():
  pipeline = iter(range(2, 100))  # a run resumed after step 2
  pairing = PairedRemoval(INPUT, block_steps=2)
  read = []

  def read_resident_batches(**which):
    read.append(_Resident(**which))
    return read[-1]

  batches = paired_removal.apply_input_removal(
      pipeline, pairing, read_resident_batches, first_step=3, last_step=10)
  # Steps 3..10: blocks 1 and 2 go without, block 3 with, block 4 with.
  # The pipeline serves the 4 steps with input from batch 2 on, so the 4
  # without take batches 6 to 9: each batch trains once.
  assert [next(batches) for _ in range(8)] == [6, 7, 8, 9, 2, 3, 4, 5]
  assert next(pipeline) == 6
  assert read[0].asked == (6, 4, paired_removal.RESIDENT_BATCHES_MAX_BYTES)
  assert pairing.describe()["resident_batches"] == 4


def test_no_pairing_hands_the_pipeline_back_and_reads_nothing():
  pipeline = iter(range(3))

  def read_resident_batches(**_):
    raise AssertionError("read without a removal of the input")

  for pairing in (None, PairedRemoval(CHECKPOINT, 2)):
    assert paired_removal.apply_input_removal(
        pipeline, pairing, read_resident_batches, first_step=1,
        last_step=8) is pipeline
    assert "resident_batches" not in (pairing.describe() if pairing else {})


def test_resident_batches_stop_at_the_bytes_they_may_hold():
  held = datasets.take_resident(iter(range(10)), 6, max_bytes=25,
                                nbytes=lambda _: 10)
  assert held == [0, 1]
  # One batch is always held, whatever it weighs.
  assert datasets.take_resident(iter([0]), 6, max_bytes=5,
                                nbytes=lambda _: 10) == [0]
  assert datasets.take_resident(iter(range(10)), 3, max_bytes=None,
                                nbytes=lambda _: 10) == [0, 1, 2]
  with pytest.raises(ValueError):
    datasets.take_resident(iter([]), 3, max_bytes=None, nbytes=len)


def _record(step, wait_s, compute_s):
  return ledger_lib.StepRecord(
      step, 0.0, wait_s + compute_s + 0.001, 8,
      {ledger_lib.DATA_WAIT: wait_s, ledger_lib.COMPUTE: compute_s},
      cpu_s=0.0, thread_cpu_s=0.0, phases_cpu_s={})


def test_the_summary_holds_each_half_and_the_saving():
  pairing = PairedRemoval(INPUT, block_steps=2)
  # Every step computes 10 ms; a step with input waits 4 ms, and the
  # warm-up step, left out, 100 ms.
  records = [_record(s, 0.0 if pairing.removed(s) else 0.004, 0.010)
             for s in range(1, 13)]
  records[0] = _record(1, 0.1, 0.010)
  summary = paired_removal.summarize(pairing, records, warmup_steps=1)
  assert summary["halves"][WITH]["steps"] == 3
  assert summary["halves"][WITHOUT]["steps"] == 3
  assert summary["halves"][WITH]["phases_ms"]["other"] == pytest.approx(1.0)
  assert summary["saving_ms"] == pytest.approx(4.0)
  assert summary["change_ms"][ledger_lib.DATA_WAIT] == pytest.approx(4.0)
  assert summary["change_ms"][ledger_lib.COMPUTE] == pytest.approx(0.0)


def test_a_half_that_counted_nothing_gives_no_saving():
  pairing = PairedRemoval(INPUT, block_steps=4)
  records = [_record(s, 0.004, 0.010) for s in range(1, 5)]
  summary = paired_removal.summarize(pairing, records, warmup_steps=0)
  assert summary["halves"][WITHOUT]["steps"] == 0
  assert summary["saving_ms"] is None


def test_a_step_function_and_its_split_alternate_call_by_call():
  pairing = PairedRemoval(paired_removal.OFFLOAD, block_steps=2)

  class Cost:
    class without_offload:  # pylint: disable=invalid-name
      @staticmethod
      def split_compute(inner):
        return lambda start_s, end_s: ("without", inner)

  made = []
  step, split = paired_removal.apply_offload_removal(
      pairing, lambda batch: ("with", batch),
      lambda start_s, end_s: ("with", None), cost=Cost,
      make_step_without=lambda: made.append(1) or (
          lambda batch: ("without", batch)),
      inner_split="inner", first_step=1)
  assert made == [1]
  # Steps 1-6: with, with, without x4.
  assert [step(s)[0] for s in range(1, 7)] == [
      "with", "with", "without", "without", "without", "without"]
  assert [split(0.0, 1.0) for _ in range(3)] == [
      ("with", None), ("with", None), ("without", "inner")]


def test_offload_is_removed_only_against_the_step_timed_without_it():
  def train_step(batch):
    return batch

  pairing = PairedRemoval(paired_removal.OFFLOAD, block_steps=2)
  with pytest.raises(RuntimeError, match="timed alone"):
    paired_removal.apply_offload_removal(
        pairing, train_step, None, cost=None,
        make_step_without=lambda: train_step, inner_split=None,
        first_step=1)
  assert paired_removal.apply_offload_removal(
      PairedRemoval(INPUT, 2), train_step, None, cost=None,
      make_step_without=lambda: train_step, inner_split=None,
      first_step=1) == (train_step, None)


@pytest.mark.parametrize("cause", [INPUT, CHECKPOINT])
def test_each_arm_splits_against_the_reference_with_a_balance_of_its_own(
    cause):
  made = []

  def make_split():
    # A split that counts its own calls, as a balance keeps its own bank.
    calls = []
    made.append(calls)
    number = len(made)
    return lambda start_s, end_s: calls.append(start_s) or number

  pairing = PairedRemoval(cause, block_steps=2)
  split = paired_removal.split_per_arm(pairing, make_split, first_step=1)
  # Steps 1-8: with, with, without x4, with, with.
  arms = [split(float(step), 0.0) for step in range(1, 9)]
  assert arms == [1, 1, 2, 2, 2, 2, 1, 1]
  assert made == [[1.0, 2.0, 7.0, 8.0], [3.0, 4.0, 5.0, 6.0]]


def test_each_arm_settles_its_own_balance_over_its_own_steps():
  pairing = PairedRemoval(INPUT, block_steps=2)
  reference = contention.ReferenceStep(step_s=(0.010,), cost_s=0.0)
  split = paired_removal.split_per_arm(pairing, reference.split_compute,
                                       first_step=1)
  ledger = ledger_lib.StepLedger(clock=lambda: 0.0)
  # Steps 1-8: with, with, without x4, with, with. The arm with the cause
  # carves 2 ms in each of steps 1 and 2 and ends 1 ms under in steps 7
  # and 8; the arm without carves 1 ms in step 3 and ends 1 ms under.
  durations_ms = [12.0, 12.0, 11.0, 10.0, 10.0, 9.0, 9.0, 9.0]
  start_s = 0.0
  for step, duration_ms in enumerate(durations_ms, start=1):
    end_s = start_s + duration_ms / 1e3
    for name, begin, end in split(start_s, end_s):
      ledger.add(name, begin, end)
    ledger.end_step(step, 8, end_s=end_s)
    start_s = end_s
  assert split.settle(ledger) == pytest.approx(0.003)
  contention_ms = [1e3 * r.phases_s[ledger_lib.CONTENTION]
                   for r in ledger.steps]
  assert contention_ms == pytest.approx([2.0, 0.0, 0.0, 0, 0, 0, 0, 0])
  # Every step's excess, each arm's against its own calls.
  assert ledger.summary(warmup_steps=0)["against_step_alone"] == {
      "steps": 8, "steps_below": 3, "median_excess_ms": pytest.approx(0.0)}


def test_without_a_pairing_or_with_offload_the_split_is_one():
  made = []

  def make_split():
    made.append(1)
    return "split"

  assert paired_removal.split_per_arm(None, make_split, first_step=1) == (
      "split")
  # Offload's arms are split apart by apply_offload_removal.
  assert paired_removal.split_per_arm(
      PairedRemoval(paired_removal.OFFLOAD, 2), make_split,
      first_step=1) == "split"
  assert made == [1, 1]


def test_the_all_reduce_is_removed_step_by_step_and_split_its_own_way():
  pairing = PairedRemoval(paired_removal.ALL_REDUCE, block_steps=2)
  made = []
  step = paired_removal.apply_step_removal(
      pairing, paired_removal.ALL_REDUCE, lambda batch: ("with", batch),
      lambda: made.append(1) or (lambda batch: ("without", batch)),
      first_step=3)  # a run resumed after step 2: step 3 is without
  assert made == [1]
  assert [step(s)[0] for s in range(3, 9)] == [
      "without", "without", "without", "without", "with", "with"]
  split = paired_removal.split_per_arm(
      pairing, lambda: (lambda start_s, end_s: "with"), first_step=1,
      make_split_without=lambda: (lambda start_s, end_s: "without"))
  assert [split(0.0, 1.0) for _ in range(4)] == [
      "with", "with", "without", "without"]


@pytest.mark.parametrize("cause", [paired_removal.ALL_REDUCE,
                                   paired_removal.PIPELINE_WAITS])
def test_only_a_pairing_of_the_steps_cause_swaps_the_step(cause):
  def train_step(batch):
    return batch

  def make_step_without():
    raise AssertionError(f"made where {cause} stays")

  others = [c for c in paired_removal.CAUSES[1:] if c != cause]
  for pairing in [None] + [PairedRemoval(c, 2) for c in others]:
    assert paired_removal.apply_step_removal(
        pairing, cause, train_step, make_step_without,
        first_step=1) is train_step
  swapped = paired_removal.apply_step_removal(
      PairedRemoval(cause, 2), cause, train_step,
      lambda: (lambda batch: -batch), first_step=1)
  assert [swapped(1) for _ in range(4)] == [1, 1, -1, -1]
