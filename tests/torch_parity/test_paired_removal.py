"""PyTorch runs that remove their input, or offload, in alternate blocks
of steps: real trainer processes."""

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
