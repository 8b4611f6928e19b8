"""torch_parity.data on a CUDA device: the side-stream prefetcher.

Apart from tests/torch_parity/test_data.py because that module
compares against tf.data and imports TensorFlow, which the GPU hosts do not
have; this one imports none, so the GPU campaign's cuda_tests part can run
it there.
"""

import dataclasses

import numpy as np

from overlap_core.runtime.config import DataConfig
from tests.needs_cuda import needs_cuda
from torch_parity import data
from torch_parity.data import device


def _digits_config(**overrides) -> DataConfig:
  base = DataConfig(dataset="digits", data_dir=None, tfds_name="mnist",
                    image_size=8, num_classes=10, batch_size=16,
                    synthetic_on_device=False, prefetch=0,
                    prefetch_to_device=False, map_parallelism=1,
                    cache=False, shuffle_buffer=256, preprocess_cost_ms=0.0,
                    data_service="")
  return dataclasses.replace(base, **overrides)


def _loader(cfg):
  return data.make_loader(cfg, split="eval", task="classification", seed=0)


@needs_cuda
def test_cuda_prefetcher_yields_the_same_batches_in_order():
  cfg = _digits_config(batch_size=64, prefetch_to_device=True, prefetch=2,
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
