"""TensorFlow input pipelines with every input-overlap knob.

Modules, one job each:
  sources          digits / synthetic / tfds / image_folder, read + decode
  preprocess_cost  calibrated, parallelizable CPU work per sample
  pipeline         make_input_fn: the tf.data pipeline, in a fixed order
  device           distribute_input (device prefetch), make_resident_iterator
  service          the tf.data service on localhost

Usage in a trainer:

  info = describe(cfg.data)
  input_fn = make_input_fn(cfg.data, split="train", task=spec.task,
                           seed=cfg.run.seed, upscale=spec.upscale)
  batches = distribute_input(strategy, input_fn, cfg.data)
"""

from tfoverlap.data.device import distribute_input, make_resident_iterator
from tfoverlap.data.pipeline import make_input_fn
from tfoverlap.data.service import LocalDataService, start_data_service
from tfoverlap.data.sources import DatasetInfo, describe

__all__ = [
    "DatasetInfo",
    "LocalDataService",
    "describe",
    "distribute_input",
    "make_input_fn",
    "make_resident_iterator",
    "start_data_service",
]
