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
# One intra-op thread per process unless a test or its flags ask for more:
# the suite runs a worker per core, and each worker's trainers and ranks
# run beside the other's. PyTorch's OpenMP threads (and TensorFlow's Eigen
# pool) spin while they wait, so on a host with more runnable threads than
# cores they burn the time they wait for: an EDSR run of 3 steps beside
# two busy loops took 19.7 s with PyTorch's default 2 threads and 9.8 s
# with 1 (5.7 s of CPU against 14.3 s). Set here, before either framework
# is imported, so every process a test starts inherits it; a trainer's
# --intra_op_threads still overrides it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
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
