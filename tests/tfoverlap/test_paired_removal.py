"""TensorFlow runs that remove their input, their checkpoints, offload or
the gradient all-reduce in alternate blocks of steps: real trainer
processes, real saves."""

import functools
import os

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.paired_removal import WITH, WITHOUT

from tests import record_checks

_train = functools.partial(record_checks.train_paired_job, "tfoverlap.train")


def test_the_half_without_input_waits_for_next_to_none(tmp_path):
  record = _train(tmp_path, *record_checks.SLOW_INPUT, "--train_steps=12",
                  "--paired_removal=input", "--paired_block_steps=2")
  record_checks.check_paired_input(record, steps=12, block_steps=2)


def test_blocks_without_checkpoints_save_nothing_and_stall_for_none(
    tmp_path):
  # Blocks of 4 over 16 steps: with (1-4), without (5-12), with (13-16).
  record = _train(tmp_path, "--train_steps=16", "--paired_removal=checkpoint",
                  "--paired_block_steps=4", "--checkpoint=sync",
                  "--checkpoint_every=2", "--checkpoint_keep=10")
  kept = sorted(int(name.split("-")[1].split(".")[0])
                for name in os.listdir(tmp_path / "checkpoints")
                if name.startswith("ckpt-") and name.endswith(".index"))
  assert kept == [2, 4, 14, 16]
  stall_ms = record_checks.paired_phase_ms(record,
                                           ledger_lib.CHECKPOINT_STALL)
  assert stall_ms[WITHOUT] == 0.0 < stall_ms[WITH], stall_ms


def test_the_half_without_offload_records_none_of_it(tmp_path):
  record_checks.check_paired_offload(_train(
      tmp_path, "--synthetic_on_device", "--offload=activations",
      "--train_steps=12", "--paired_removal=offload",
      "--paired_block_steps=2"))


def test_the_half_without_the_all_reduce_carries_none_of_it(tmp_path):
  # A 6M-parameter MLP, as the fidelity benchmark's exposed_comm cell
  # trains: its 25 MB of gradients summed across the two devices cost the
  # step 14 ms at the median there. A 1.6M-parameter one's 4 ms derived
  # as zero on a host the suite's other worker kept busy, its 5 timed
  # pairs ranging 10 to 32 ms.
  record = record_checks.check_paired_all_reduce(_train(
      tmp_path, "--synthetic_on_device", "--strategy=mirrored",
      "--num_devices=2", "--image_size=64", "--train_steps=12",
      "--paired_removal=all_reduce", "--paired_block_steps=2"))
  # The steps with it carry the exposed all-reduce derived before
  # training, capped at a step's compute span.
  derived_ms = record["strategy"]["exposed_comm"]["exposed_comm_ms"]
  with_ms = record_checks.paired_phase_ms(record, ledger_lib.EXPOSED_COMM)
  # At most the derived cost, up to the clock's rounding (how much:
  # `record_checks.check_paired_offload`).
  assert with_ms[WITH] <= derived_ms + 1e-6
  assert ledger_lib.EXPOSED_COMM in record["phases_derived"]
