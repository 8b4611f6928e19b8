"""benchmarks.burst's command line: what it refuses before measuring."""

import pytest
import torch

from benchmarks import burst


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks the refusal on a host without CUDA")
def test_gpu_multiplex_without_cuda_exits_2_with_one_line(capsys):
  assert burst.main(["burst", "--gpu_multiplex"]) == 2
  captured = capsys.readouterr()
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1, captured.err
  assert "--gpu_multiplex needs a CUDA device" in lines[0]
  assert captured.out == ""  # nothing measured, no results written
