"""PyTorch ranks on two "hosts" of this machine (127.0.0.1, 127.0.0.2): one
torchrun per node, meeting through a c10d rendezvous, as on two machines.

The rendezvous store is hosted by the first node's torchrun
(`--rdzv_conf=is_host=1`); gloo is kept on the loopback interface
(GLOO_SOCKET_IFNAME=lo), so nothing here leaves the machine.
"""

import shutil
import sys
import time

import pytest

from overlap_core.runtime import processes, run_record
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
  model_dir = tmp_path_factory.mktemp("two_nodes")
  logs = tmp_path_factory.mktemp("two_nodes_logs")
  nodes = _start_two_nodes([model_dir, model_dir], logs, *CHECKPOINTED,
                           "--train_steps=10")
  codes = hosts_lib.run_all(nodes, JOB_TIMEOUT_S)
  assert codes == [0, 0], nodes[0].stderr()[-3000:] + nodes[1].stderr()[-3000:]
  return model_dir


def test_two_torchrun_nodes_train_to_the_single_host_weights(
    two_nodes_dir, single_host_digest):
  chief = run_record.load_run_record(str(two_nodes_dir))
  other = run_record.load_run_record(str(two_nodes_dir / "worker-1"))
  assert chief["worker"] == {"index": 0, "num_workers": 2}
  assert chief["strategy"]["class"] == "DistributedDataParallel"
  assert chief["steps"] == other["steps"] == 10
  # --deterministic, the same shards and one gloo all-reduce order: the
  # digests match exactly, not within a tolerance.
  assert chief["weights_digest"] == other["weights_digest"]
  assert chief["weights_digest"] == single_host_digest


def test_a_rank_that_cannot_see_the_checkpoint_does_not_start_over(
    two_nodes_dir, tmp_path):
  shared = tmp_path / "shared"
  shutil.copytree(two_nodes_dir, shared)
  local = tmp_path / "node1_local"
  nodes = _start_two_nodes([shared, local], tmp_path, *CHECKPOINTED,
                           "--train_steps=15")
  codes = hosts_lib.run_all(nodes, JOB_TIMEOUT_S)
  assert codes[0] != 0 and codes[1] != 0
  errors = hosts_lib.error_lines(nodes[1].stderr(), "torch_parity.train")
  assert len(errors) == 1, nodes[1].stderr()[-3000:]
  assert errors[0].startswith(
      "torch_parity.train: error: CheckpointNotSharedError: "
      f"{local / 'checkpoints'}: this worker sees no checkpoint, another "
      "resumes from the checkpoint of step 10;"), errors
  before = sorted(p.name for p in (two_nodes_dir / "checkpoints").iterdir())
  assert sorted(p.name for p in (shared / "checkpoints").iterdir()) == before
  assert not (local / "checkpoints").exists() or not any(
      p.name.startswith("ckpt-") for p in (local / "checkpoints").iterdir())


def test_a_killed_node_ends_the_other_with_one_line(tmp_path):
  nodes = _start_two_nodes([tmp_path / "run", tmp_path / "run"], tmp_path,
                           "--train_steps=100000",
      TFOVERLAP_COLLECTIVE_TIMEOUT_S=str(LOST_PEER_TIMEOUT_S))
  try:
    # Progress from rank 0, wherever the rendezvous put it.
    wait_until(lambda: any("[worker 0] step " in n.stdout() for n in nodes)
               or any(n.process.poll() is not None for n in nodes),
               "training progress", JOB_TIMEOUT_S)
    assert any("[worker 0] step " in n.stdout() for n in nodes), (
        nodes[0].stderr()[-3000:])
    # Node 1 dies; node 0 hosts the rendezvous store and survives.
    hosts_lib.kill_host(nodes[1])
    started = time.monotonic()
    code = hosts_lib.wait_all(nodes[:1], LOST_PEER_BOUND_S)[0]
    ended_s = time.monotonic() - started
  finally:
    hosts_lib.stop_all(nodes)
  assert code != 0
  assert ended_s < LOST_PEER_BOUND_S
  errors = hosts_lib.error_lines(nodes[0].stderr(), "torch_parity.train")
  assert len(errors) == 1, nodes[0].stderr()[-3000:]
