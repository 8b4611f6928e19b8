"""TensorFlow's exposed all-reduce, derived from a step without it, in process."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.zoo import CLASSIFICATION
from tfoverlap import distribute, exposed_comm, steps


@pytest.fixture
def mirrored(two_cpu_devices):
  strategy = distribute.mirrored_strategy(two_cpu_devices)
  with strategy.scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
  return strategy, model, optimizer


def _replica_copies(variable):
  return [c.numpy() for c in variable.value.values]


def _batch_per_replica(strategy):
  # Each replica its own inputs, so their gradients differ.
  return strategy.experimental_distribute_values_from_function(
      lambda ctx: (tf.fill((2, 6), float(ctx.replica_id_in_sync_group + 1)),
                   tf.zeros((2,), tf.int32)))


def test_the_local_step_applies_each_replicas_own_gradients(mirrored):
  strategy, model, optimizer = mirrored
  kernel = model.trainable_variables[0]
  full = steps.make_train_step(model, optimizer, strategy,
                               task=CLASSIFICATION, global_batch_size=4)
  local = steps.make_local_train_step(model, optimizer, strategy,
                                      task=CLASSIFICATION,
                                      global_batch_size=4)
  batch = _batch_per_replica(strategy)
  full(batch)
  first, second = _replica_copies(kernel)
  np.testing.assert_array_equal(first, second)  # the all-reduce kept them one
  local(batch)
  first, second = _replica_copies(kernel)
  assert not np.allclose(first, second)  # no all-reduce: the replicas part


def test_the_derivation_leaves_the_run_as_it_found_it(mirrored):
  strategy, model, optimizer = mirrored
  variables = list(model.variables) + list(optimizer.variables)
  before = [_replica_copies(v) for v in variables]
  derivation = exposed_comm.derive_exposed_comm(
      model, optimizer, strategy, _batch_per_replica(strategy),
      task=CLASSIFICATION, global_batch_size=4, num_pairs=2)
  for was, variable in zip(before, variables):
    for old, new in zip(was, _replica_copies(variable)):
      np.testing.assert_array_equal(old, new)
  assert len(derivation.step_s) == len(derivation.local_step_s) == 2
  assert derivation.exposed_comm_s >= 0.0
  recorded = derivation.to_dict()
  assert recorded["num_pairs"] == 2 and recorded["cost_s"] > 0
  # Carved out of a step's compute span, never past it.
  (part, start, split), (rest, split_again, end) = derivation.split_compute(
      10.0, 10.0 + derivation.exposed_comm_s / 2)
  assert (part, rest) == (ledger_lib.EXPOSED_COMM, ledger_lib.COMPUTE)
  assert start == 10.0 and split == split_again <= end


def test_a_slower_local_step_derives_no_exposed_comm():
  derivation = exposed_comm.CommDerivation(
      step_s=(0.010, 0.011, 0.012), local_step_s=(0.009, 0.012, 0.013),
      cost_s=1.0)
  assert derivation.exposed_comm_s == 0.0
