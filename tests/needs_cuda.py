"""The one mark of a test that needs a CUDA device.

Such a test skips on a host without CUDA, and carries the `cuda` marker so
that `python -m pytest -m cuda` selects exactly these on a GPU host: the GPU
campaign's cuda_tests part (benchmarks/gpu_campaign) runs them so. A module
that holds one imports no TensorFlow, because the GPU hosts have none.
"""

import pytest
import torch

CUDA_MARKER = "cuda"


def needs_cuda(test):
  """Marks `test` `cuda` and skips it where torch sees no CUDA device."""
  skip = pytest.mark.skipif(not torch.cuda.is_available(),
                            reason="needs CUDA")
  return getattr(pytest.mark, CUDA_MARKER)(skip(test))
