"""The one parallelize step of the PyTorch trainer."""

import pytest
import torch
from torch import nn

from overlap_core.planning.dims import ParallelDims
from overlap_core.runtime.config import DistributeConfig
from torch_parity import distribute, parallelize


def _cfg(strategy="default"):
  return DistributeConfig(strategy=strategy, num_devices=1, num_workers=1,
                          all_reduce="auto", all_reduce_pack_mb=0.0)


def test_one_process_trains_the_module_itself():
  strategy = distribute.build_strategy(_cfg())
  (model, train_model, optimizer, dims, _, pipeline,
   burst) = parallelize.parallelize(
       strategy, lambda: nn.Linear(4, 2),
       lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
  assert pipeline is None and burst is None
  assert train_model is model and dims.world_size == 1
  assert optimizer.param_groups[0]["params"][0] is model.weight


def test_ddp_wraps_the_module_it_runs():
  strategy = distribute.build_strategy(_cfg("multi_worker"))
  try:
    model, train_model, _, _, _, _, _ = parallelize.parallelize(
        strategy, lambda: nn.Linear(4, 2),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    assert isinstance(train_model, nn.parallel.DistributedDataParallel)
    assert train_model.module is model
  finally:
    strategy.close()


def test_pipeline_stages_need_to_know_how_to_cut():
  strategy = distribute.Strategy(
      _cfg(), dims=ParallelDims(world_size=2, data_parallel=1, pipeline=2),
      device=torch.device("cpu"))
  with pytest.raises(ValueError, match="PipelineSpec"):
    parallelize.parallelize(strategy, lambda: nn.Linear(4, 2),
                            lambda m: torch.optim.SGD(m.parameters(), lr=0))
