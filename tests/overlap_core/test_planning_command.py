"""The planning commands' shared argument handling, framework-free."""

import pytest

from overlap_core.planning.command import profile_batch_sizes


@pytest.mark.parametrize("microbatch, sizes", [
    (8, [4, 8, 16]),
    (3, [2, 3, 6]),
    # Half of 2 would be 1: BatchNorm cannot train on one value per channel.
    (2, [2, 4]),
    (1, [1, 2]),
])
def test_default_sizes_bracket_the_micro_batch_and_never_profile_one_alone(
    microbatch, sizes):
  assert profile_batch_sizes([], microbatch) == sizes


def test_requested_sizes_are_sorted_unique_and_positive():
  assert profile_batch_sizes(["8", "2", "8"], 4) == [2, 8]
  for bad in (["0"], ["two"], ["-1", "4"]):
    with pytest.raises(ValueError, match="allowed: positive integers"):
      profile_batch_sizes(bad, 4)
