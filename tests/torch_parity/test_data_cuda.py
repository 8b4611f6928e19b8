"""torch_parity.data on a CUDA device: the side-stream prefetcher.

Apart from tests/torch_parity/test_data.py because that module
compares against tf.data and imports TensorFlow, which the GPU hosts do not
have; this one imports none, so the GPU campaign's cuda_tests part can run
it there.
"""

import numpy as np

from tests.fixtures import data_config
from tests.needs_cuda import needs_cuda
from torch_parity import data
from torch_parity.data import device


def _loader(cfg):
  return data.make_loader(cfg, split="eval", task="classification", seed=0)


@needs_cuda
def test_cuda_prefetcher_yields_the_same_batches_in_order():
  cfg = data_config(batch_size=64, prefetch_to_device=True, prefetch=2,
                       map_parallelism=2)
  direct = [tuple(t.numpy() for t in batch) for batch in _loader(cfg)]
  staged = device.make_device_prefetcher(_loader(cfg), "cuda", depth=2)
  assert isinstance(staged, device.CudaPrefetcher)
  prefetched = []
  for images, labels in staged:
    assert images.is_cuda and labels.is_cuda
    prefetched.append(((images * 1).cpu().numpy(), labels.cpu().numpy()))
  assert len(prefetched) == len(direct)
  for (x1, y1), (x2, y2) in zip(direct, prefetched):
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
