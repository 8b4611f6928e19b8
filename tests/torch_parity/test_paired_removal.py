"""PyTorch runs that remove their input, offload or the gradient
all-reduce in alternate blocks of steps: real trainer processes (two DDP
replicas for the all-reduce)."""

import functools

from tests import record_checks

_train = functools.partial(record_checks.train_paired_job,
                           "torch_parity.train")


def test_the_half_without_input_waits_for_next_to_none(tmp_path):
  record = _train(tmp_path, *record_checks.SLOW_INPUT, "--train_steps=12",
                  "--paired_removal=input", "--paired_block_steps=2")
  record_checks.check_paired_input(record, steps=12, block_steps=2)


def test_the_half_without_offload_records_none_of_it(tmp_path):
  record_checks.check_paired_offload(_train(
      tmp_path, "--synthetic_on_device", "--offload=activations",
      "--train_steps=12", "--paired_removal=offload",
      "--paired_block_steps=2"))


def test_the_half_without_the_all_reduce_waits_for_none_and_replicas_part(
    tmp_path):
  record = record_checks.check_paired_all_reduce(_train(
      tmp_path, "--synthetic_on_device", "--strategy=mirrored",
      "--num_devices=2", "--train_steps=12", "--paired_removal=all_reduce",
      "--paired_block_steps=2"))
  # Each replica stepped on its own shard's gradients in the blocks
  # without the all-reduce: two models at the end.
  digests = record["strategy"]["replica_weights_digests"]
  assert len(digests) == 2 and digests[0] != digests[1]
