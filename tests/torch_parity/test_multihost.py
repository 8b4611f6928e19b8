"""PyTorch ranks on two "hosts" of this machine (127.0.0.1, 127.0.0.2): one
torchrun per node, meeting through a c10d rendezvous, as on two machines.

The rendezvous store is hosted by the first node's torchrun
(`--rdzv_conf=is_host=1`); gloo is kept on the loopback interface
(GLOO_SOCKET_IFNAME=lo), so nothing here leaves the machine.
"""

import sys

import pytest

from overlap_core.runtime import processes
from tests import hosts as hosts_lib
from tests.helpers import subprocess_env, wait_until

TINY_RUN = ["--model=small_cnn", "--dataset=synthetic", "--image_size=8",
            "--batch_size=16", "--prefetch=2", "--log_every_steps=5",
            "--tensorboard=false", "--trace=false", "--evaluate=false",
            "--deterministic", "--intra_op_threads=1", "--inter_op_threads=1"]
CHECKPOINTED = ["--checkpoint=sync", "--checkpoint_every=5"]
TRAINER = ["-m", "torch_parity.train", "--strategy=multi_worker",
           "--num_workers=2"]
JOB_TIMEOUT_S = 300
# gloo may keep waiting on a peer that died mid-collective; the collective
# timeout ends that wait, so the survivor ends by it at the latest.
LOST_PEER_TIMEOUT_S = 30
# The timeout, plus torchrun's own teardown and slack for a loaded machine.
LOST_PEER_BOUND_S = LOST_PEER_TIMEOUT_S + processes.STOP_GRACE_S + 60


def _torchrun(node: int, port: int) -> list:
  """The torchrun a user would start on node `node` of two."""
  return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
          "--nproc_per_node=1", "--rdzv_backend=c10d",
          f"--rdzv_endpoint={hosts_lib.HOST_ADDRESSES[0]}:{port}",
          "--rdzv_id=multihost-test",
          f"--rdzv_conf=is_host={1 if node == 0 else 0}",
          f"--local_addr={hosts_lib.HOST_ADDRESSES[node]}",
          "--max_restarts=0"]


def _start_two_nodes(model_dirs, log_dir, *extra, **env):
  port = processes.free_ports(1)[0]
  env = subprocess_env(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **env)
  return [hosts_lib.start_host(
      f"node{node}", _torchrun(node, port) + TRAINER + TINY_RUN +
      list(extra) + [f"--model_dir={model_dirs[node]}"], env=env,
      log_dir=log_dir) for node in range(2)]


@pytest.fixture(scope="module")
def single_host_digest(tmp_path_factory):
  """The weights of the same job launched on one host."""
  return hosts_lib.launched_digest(
      "torch_parity.launch", [*TINY_RUN, *CHECKPOINTED, "--train_steps=10"],
      tmp_path_factory.mktemp("single_host"), JOB_TIMEOUT_S)


@pytest.fixture(scope="module")
def two_nodes_dir(tmp_path_factory):
  return hosts_lib.finished_shared_dir_job(
      _start_two_nodes, tmp_path_factory, "two_nodes",
      [*CHECKPOINTED, "--train_steps=10"], JOB_TIMEOUT_S)


def test_two_torchrun_nodes_train_to_the_single_host_weights(
    two_nodes_dir, single_host_digest):
  chief = hosts_lib.check_single_host_weights(two_nodes_dir,
                                              single_host_digest, 10)
  assert chief["strategy"]["class"] == "DistributedDataParallel"


def test_a_rank_that_cannot_see_the_checkpoint_does_not_start_over(
    two_nodes_dir, tmp_path):
  nodes, codes, shared, local = hosts_lib.run_with_unshared_checkpoint(
      _start_two_nodes, two_nodes_dir, tmp_path,
      [*CHECKPOINTED, "--train_steps=15"], JOB_TIMEOUT_S)
  assert codes[0] != 0 and codes[1] != 0
  hosts_lib.check_unshared_checkpoint_refused(
      nodes[1], "torch_parity.train", two_nodes_dir, shared, local)


def _wait_for_rank_0_progress(nodes) -> None:
  """Progress from rank 0, wherever the rendezvous put it."""
  wait_until(lambda: any("[worker 0] step " in n.stdout() for n in nodes)
             or any(n.process.poll() is not None for n in nodes),
             "training progress", JOB_TIMEOUT_S)
  assert any("[worker 0] step " in n.stdout() for n in nodes), (
      nodes[0].stderr()[-3000:])


def test_a_killed_node_ends_the_other_with_one_line(tmp_path):
  nodes = _start_two_nodes([tmp_path / "run", tmp_path / "run"], tmp_path,
                           "--train_steps=100000",
      TFOVERLAP_COLLECTIVE_TIMEOUT_S=str(LOST_PEER_TIMEOUT_S))
  # Node 1 dies; node 0 hosts the rendezvous store and survives.
  hosts_lib.check_lost_peer_ends_the_other(
      nodes, lambda: _wait_for_rank_0_progress(nodes), "torch_parity.train",
      LOST_PEER_BOUND_S)
