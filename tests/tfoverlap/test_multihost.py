"""TensorFlow workers on two "hosts" of this machine (127.0.0.1, 127.0.0.2),
each started on its own with its TF_CONFIG, and under Slurm's variables.

TensorFlow's gRPC servers bind 0.0.0.0 whatever address TF_CONFIG names,
so two "hosts" of one machine must still use two different ports.
"""

import json
import os
import sys

import pytest

from overlap_core.runtime import cluster, processes, run_record
from tests import hosts as hosts_lib
from tests.helpers import subprocess_env

TINY_RUN = ["--model=mlp", "--dataset=synthetic", "--image_size=8",
            "--batch_size=16", "--prefetch=2", "--log_every_steps=5",
            "--tensorboard=false", "--trace=false", "--evaluate=false",
            "--deterministic", "--intra_op_threads=1", "--inter_op_threads=1"]
CHECKPOINTED = ["--checkpoint=sync", "--checkpoint_every=5"]
WORKER = [sys.executable, "-m", "tfoverlap.train", "--strategy=multi_worker",
          "--num_workers=2"]
# Start-up of two TensorFlow processes on a loaded 2-core machine, and ten
# steps of a tiny MLP.
JOB_TIMEOUT_S = 300
# The collective timeout the killed-host test runs with: the survivor must
# end by it at the latest (TensorFlow may notice the lost peer sooner).
LOST_PEER_TIMEOUT_S = 60
# The timeout, plus TensorFlow's own shutdown with a peer gone, plus slack
# for a loaded machine.
LOST_PEER_BOUND_S = LOST_PEER_TIMEOUT_S + 90


def _tf_config(ports, index: int) -> str:
  workers = [f"{address}:{port}"
             for address, port in zip(hosts_lib.HOST_ADDRESSES, ports)]
  return json.dumps({"cluster": {"worker": workers},
                     "task": {"type": "worker", "index": index}})


def _start_tf_config_hosts(model_dirs, log_dir, *extra, **env):
  ports = processes.free_ports(2)
  return [hosts_lib.start_host(
      f"host{index}", WORKER + TINY_RUN + list(extra) +
      [f"--model_dir={model_dirs[index]}"],
      env=subprocess_env(TF_CONFIG=_tf_config(ports, index), **env),
      log_dir=log_dir) for index in range(2)]


@pytest.fixture(scope="module")
def two_hosts_dir(tmp_path_factory):
  """A finished two-host job whose hosts share one model_dir."""
  return hosts_lib.finished_shared_dir_job(
      _start_tf_config_hosts, tmp_path_factory, "two_hosts",
      [*CHECKPOINTED, "--train_steps=10"], JOB_TIMEOUT_S)


@pytest.fixture(scope="module")
def single_host_digest(tmp_path_factory):
  """The weights of the same job launched on one host."""
  return hosts_lib.launched_digest(
      "tfoverlap.launch", [*TINY_RUN, *CHECKPOINTED, "--train_steps=10"],
      tmp_path_factory.mktemp("single_host"), JOB_TIMEOUT_S)


def test_two_tf_config_hosts_train_to_the_single_host_weights(
    two_hosts_dir, single_host_digest):
  chief = hosts_lib.check_single_host_weights(two_hosts_dir,
                                              single_host_digest, 10)
  assert chief["strategy"]["num_replicas"] == 2
  assert (two_hosts_dir / "checkpoints" / "ckpt-10.index").exists()


def test_a_worker_that_cannot_see_the_checkpoint_does_not_start_over(
    two_hosts_dir, tmp_path):
  hosts, codes, shared, local = hosts_lib.run_with_unshared_checkpoint(
      _start_tf_config_hosts, two_hosts_dir, tmp_path,
      [*CHECKPOINTED, "--train_steps=15"], JOB_TIMEOUT_S)
  assert codes == [1, 1]
  error = hosts_lib.check_unshared_checkpoint_refused(
      hosts[1], "tfoverlap.train", two_hosts_dir, shared, local)
  assert error == (
      "tfoverlap.train: error: CheckpointNotSharedError: "
      f"{local / 'checkpoints'}: this worker sees no checkpoint, another "
      "resumes from the checkpoint of step 10; the chief's checkpoint "
      "directory must be one every host reads (a shared filesystem), so no "
      "worker starts from scratch")
  assert len(hosts_lib.error_lines(hosts[0].stderr(), "tfoverlap.train")) == 1
  assert "ckpt-10.index" in os.listdir(two_hosts_dir / "checkpoints")
  assert run_record.load_run_record(str(local / "worker-1"))["status"] == (
      "failed")


def _slurm_job_with_free_ports(num_ports: int) -> str:
  """A job id whose Slurm ports are free here now."""
  for job_id in range(1, 600):
    base = cluster.slurm_port_base({"SLURM_JOB_ID": str(job_id)})
    if hosts_lib.ports_free_everywhere(range(base, base + num_ports)):
      return str(job_id)
  raise AssertionError("no free Slurm port range")


def test_two_srun_tasks_train_to_the_single_host_weights(
    tmp_path, single_host_digest):
  # What `srun -N1 -n2 python -m tfoverlap.train ...` sets for each task;
  # two tasks on one node, as two on one "host" cannot share a port.
  job_id = _slurm_job_with_free_ports(2)
  hosts = [hosts_lib.start_host(
      f"task{procid}", WORKER + TINY_RUN +
      CHECKPOINTED + ["--train_steps=10", f"--model_dir={tmp_path / 'run'}"],
      env=subprocess_env(
          SLURM_JOB_ID=job_id, SLURM_PROCID=str(procid), SLURM_NTASKS="2",
          SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="127.0.0.1",
          SLURM_JOB_NODELIST="127.0.0.1", SLURM_STEP_TASKS_PER_NODE="2",
          SLURM_TASKS_PER_NODE="2", SLURM_NODEID="0",
          SLURM_LOCALID=str(procid)),
      log_dir=tmp_path) for procid in range(2)]
  codes = hosts_lib.run_all(hosts, JOB_TIMEOUT_S)
  assert codes == [0, 0], hosts[0].stderr()[-3000:]
  chief = run_record.load_run_record(str(tmp_path / "run"))
  assert chief["worker"] == {"index": 0, "num_workers": 2}
  assert chief["weights_digest"] == single_host_digest


def test_a_killed_host_ends_the_other_with_one_line(tmp_path):
  hosts = _start_tf_config_hosts(
      [tmp_path / "run", tmp_path / "run"], tmp_path, "--train_steps=100000",
      TFOVERLAP_COLLECTIVE_TIMEOUT_S=str(LOST_PEER_TIMEOUT_S))
  # Training progress on the chief: the collectives are live.
  hosts_lib.check_lost_peer_ends_the_other(
      hosts, lambda: hosts_lib.wait_for_output(
          hosts[0], "[worker 0] step ", JOB_TIMEOUT_S),
      "tfoverlap.train", LOST_PEER_BOUND_S)
  assert "Traceback" not in hosts[0].stderr()
  assert os.path.exists(tmp_path / "run" / run_record.RUN_RECORD_NAME)
