"""Strategies by name, in process (multi_worker runs in test_launch)."""

import json

import pytest
import tensorflow as tf

from tfoverlap import distribute
from overlap_core.runtime import waits
from overlap_core.runtime.config import ConfigError, DistributeConfig


def config(**overrides) -> DistributeConfig:
  values = dict(strategy="mirrored", num_devices=2, num_workers=1,
                all_reduce="auto", all_reduce_pack_mb=0.0)
  values.update(overrides)
  return DistributeConfig(**values)


def test_mirrored_replicates_over_the_logical_cpus(two_cpu_devices):
  strategy = distribute.build_strategy(config())
  assert isinstance(strategy, tf.distribute.MirroredStrategy)
  assert strategy.num_replicas_in_sync == 2
  described = distribute.describe_strategy(strategy, config())
  assert described["num_replicas"] == 2
  assert [d.lower()[-5:] for d in described["devices"]] == ["cpu:0", "cpu:1"]


def _all_reduced_sum(strategy, size: int) -> float:
  @tf.function
  def step():
    def replica_fn():
      ones = tf.ones((size,))
      return tf.distribute.get_replica_context().all_reduce("sum", ones)
    return strategy.run(replica_fn)
  return float(tf.reduce_sum(strategy.experimental_local_results(step())[0]))


def test_a_second_strategy_in_one_process_all_reduces_other_shapes():
  # A notebook's second run, or the next test: the runtime remembers each
  # collective's shape by its keys, so the second strategy's collectives
  # must not reuse the first's.
  first = distribute.build_strategy(config())
  assert _all_reduced_sum(first, 5) == 10.0
  second = distribute.build_strategy(config())
  assert _all_reduced_sum(second, 7) == 14.0


def test_default_and_one_device_have_one_replica():
  default = distribute.build_strategy(config(strategy="default"))
  assert default is tf.distribute.get_strategy()
  assert distribute.describe_strategy(
      default, config(strategy="default"))["devices"]
  one = distribute.build_strategy(config(strategy="one_device"))
  assert isinstance(one, tf.distribute.OneDeviceStrategy)
  assert one.num_replicas_in_sync == 1


def test_more_devices_than_exist_is_refused():
  with pytest.raises(ConfigError) as error:
    distribute.build_strategy(config(num_devices=3))
  assert error.value.flag == "num_devices"


def test_pack_size_and_implementation_reach_the_collectives():
  options = distribute.communication_options(
      config(strategy="multi_worker", all_reduce="ring",
             all_reduce_pack_mb=4))
  assert options.bytes_per_pack == 4 * 1024 * 1024
  assert options.implementation == (
      tf.distribute.experimental.CommunicationImplementation.RING)


def test_collectives_wait_for_a_peer_as_long_as_pytorchs(monkeypatch):
  monkeypatch.delenv(waits.COLLECTIVE_TIMEOUT_ENV, raising=False)
  options = distribute.communication_options(config(strategy="multi_worker"))
  assert options.timeout_seconds == waits.COLLECTIVE_TIMEOUT_S == 180
  monkeypatch.setenv(waits.COLLECTIVE_TIMEOUT_ENV, "7")
  options = distribute.communication_options(config(strategy="multi_worker"))
  assert options.timeout_seconds == 7


def test_cluster_comes_from_tf_config(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["localhost:1", "localhost:2", "localhost:3"]},
      "task": {"type": "worker", "index": 2}}))
  assert distribute.cluster_from_env() == (2, 3)
  monkeypatch.setenv("TF_CONFIG", "{not json")
  with pytest.raises(ConfigError):
    distribute.cluster_from_env()
  monkeypatch.delenv("TF_CONFIG")
  assert distribute.cluster_from_env() == (0, 1)


# Which knobs a strategy takes is the compatibility table's, checked by
# the trainer first (tests/overlap_core/runtime/test_compat.py); building refuses
# what only the strategy itself can tell.
@pytest.mark.parametrize("overrides, flag", [
    ({"strategy": "horovod"}, "strategy"),
    ({"strategy": "multi_worker", "num_workers": 2}, "strategy"),
])
def test_what_only_building_can_tell_is_refused(overrides, flag,
                                               monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(ConfigError) as error:
    distribute.build_strategy(config(**overrides))
  assert error.value.flag == flag
