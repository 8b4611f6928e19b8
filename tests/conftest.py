"""Test-session setup shared by every test module.

TensorFlow fixes its device list the first time it initializes, so the CPU is
split into two logical devices here, before any test touches TensorFlow; then
MirroredStrategy(["/cpu:0", "/cpu:1"]) works in every test, as on a 2-GPU host.
On a host without TensorFlow (the GPU machines have PyTorch only) there is
nothing to split: the PyTorch tests that import no TensorFlow still run
there, and a TensorFlow test fails at its own import, naming it.
"""

import os
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The fixtures both framework sides' tests share.
pytest_plugins = ("tests.fixtures",)
NUM_LOGICAL_CPUS = 2


def pytest_configure(config):
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


@pytest.fixture
def two_cpu_devices():
  """The two logical CPU device names, for MirroredStrategy."""
  return [f"/cpu:{i}" for i in range(NUM_LOGICAL_CPUS)]
