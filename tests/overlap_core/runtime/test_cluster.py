"""The cluster a worker derives from its engine's variables: TF_CONFIG,
Slurm's (set here as srun would set them), torchrun's."""

import json

import pytest

from overlap_core.runtime import cluster
from overlap_core.runtime import failure
from overlap_core.runtime.config import ConfigError


def srun_env(procid: int, **extra) -> dict:
  """What srun -N2 --ntasks-per-node=2 sets for task `procid` (block
  distribution: tasks 0, 1 on the first node, 2, 3 on the second)."""
  env = {
      "SLURM_JOB_ID": "4321",
      "SLURM_PROCID": str(procid),
      "SLURM_NTASKS": "4",
      "SLURM_STEP_NUM_TASKS": "4",
      "SLURM_JOB_NODELIST": "gpu[07-08]",
      "SLURM_STEP_NODELIST": "gpu[07-08]",
      "SLURM_TASKS_PER_NODE": "2(x2)",
      "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
      "SLURM_NODEID": str(procid // 2),
      "SLURM_LOCALID": str(procid % 2),
  }
  env.update(extra)
  return env


@pytest.mark.parametrize("nodelist, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[8-10],b", ["a8", "a9", "a10", "b"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
    ("x[001-002],y[9]", ["x001", "x002", "y9"]),
])
def test_slurm_node_lists_expand_in_order(nodelist, hosts):
  assert cluster.expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["node[01-", "node[3-1]", "node[a-b]",
                                      "a,,b", ""])
def test_a_malformed_node_list_is_one_line_naming_it(nodelist):
  with pytest.raises(ConfigError) as error:
    cluster.expand_nodelist(nodelist)
  assert repr(nodelist) in str(error.value)
  assert "\n" not in str(error.value)


def test_tasks_per_node_expand_like_slurm_writes_them():
  assert cluster.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
  assert cluster.expand_tasks_per_node("4") == [4]
  with pytest.raises(ConfigError, match="2x3"):
    cluster.expand_tasks_per_node("2x3")


def test_every_srun_task_derives_the_same_tensorflow_cluster():
  clusters = [cluster.tf_cluster_from_env(srun_env(i)) for i in range(4)]
  base = cluster.slurm_port_base({"SLURM_JOB_ID": "4321"})
  expected = (f"gpu07:{base}", f"gpu07:{base + 1}", f"gpu08:{base}",
              f"gpu08:{base + 1}")
  assert all(c.workers == expected for c in clusters)
  assert [c.task_index for c in clusters] == [0, 1, 2, 3]
  assert clusters[2].source == "slurm"
  assert json.loads(clusters[2].tf_config()) == {
      "cluster": {"worker": list(expected)},
      "task": {"type": "worker", "index": 2}}


def test_slurm_ports_stay_in_their_range_and_follow_the_job():
  bases = {cluster.slurm_port_base({"SLURM_JOB_ID": str(j)})
           for j in range(2000)}
  assert min(bases) == cluster.SLURM_PORT_FIRST
  assert max(bases) + cluster.SLURM_PORTS_PER_JOB <= 65535
  assert (cluster.slurm_port_base({"SLURM_JOB_ID": "1"}) !=
          cluster.slurm_port_base({"SLURM_JOB_ID": "2"}))


def test_the_steps_own_variables_win_over_the_jobs():
  # A step on one node of a two-node allocation.
  env = srun_env(1, SLURM_STEP_NODELIST="gpu08", SLURM_STEP_NUM_TASKS="2",
                 SLURM_STEP_TASKS_PER_NODE="2", SLURM_NODEID="0")
  found = cluster.tf_cluster_from_env(env)
  assert [w.split(":")[0] for w in found.workers] == ["gpu08", "gpu08"]
  assert found.task_index == 1


def test_without_tasks_per_node_slurm_spreads_them_evenly():
  env = srun_env(2, SLURM_NTASKS="3", SLURM_STEP_NUM_TASKS="3",
                 SLURM_NODEID="1", SLURM_LOCALID="0")
  del env["SLURM_TASKS_PER_NODE"], env["SLURM_STEP_TASKS_PER_NODE"]
  found = cluster.tf_cluster_from_env(env)
  assert [w.split(":")[0] for w in found.workers] == ["gpu07", "gpu07",
                                                      "gpu08"]


def test_tf_config_wins_over_slurm_and_must_list_only_workers():
  tf_config = json.dumps({"cluster": {"worker": ["h1:1", "h2:2"]},
                          "task": {"type": "worker", "index": 1}})
  found = cluster.tf_cluster_from_env(srun_env(3, TF_CONFIG=tf_config))
  assert found.workers == ("h1:1", "h2:2") and found.task_index == 1
  assert found.source == "TF_CONFIG"
  with_chief = json.dumps({"cluster": {"chief": ["h0:1"], "worker": ["h1:1"]},
                           "task": {"type": "chief", "index": 0}})
  with pytest.raises(ConfigError, match="only workers"):
    cluster.tf_cluster_from_env({"TF_CONFIG": with_chief})
  with pytest.raises(ConfigError, match="index 5"):
    cluster.tf_cluster_from_env({"TF_CONFIG": json.dumps(
        {"cluster": {"worker": ["h1:1"]}, "task": {"index": 5}})})


def test_no_cluster_outside_a_multi_worker_job():
  assert cluster.tf_cluster_from_env({}) is None
  assert cluster.torch_world_from_env({"SLURM_JOB_ID": "7"}) is None


@pytest.mark.parametrize("overrides, named", [
    ({"SLURM_NTASKS": "5", "SLURM_STEP_NUM_TASKS": "5"}, "add up to 4"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID=x"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "names 3 node(s)"),
    # Cyclic distribution puts task 1 on the second node.
    ({"SLURM_NODEID": "1"}, "--distribution=block"),
])
def test_inconsistent_slurm_variables_are_refused_in_one_line(overrides,
                                                              named):
  with pytest.raises(ConfigError) as error:
    cluster.tf_cluster_from_env(srun_env(1, **overrides))
  assert named in str(error.value)
  assert error.value.flag == "strategy"


def test_torchrun_variables_make_the_world():
  world = cluster.torch_world_from_env({
      "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
      "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node01",
      "MASTER_PORT": "29400", **srun_env(0)})
  assert (world.rank, world.world_size, world.local_rank,
          world.local_world_size) == (3, 4, 1, 2)
  assert (world.master_addr, world.master_port) == ("node01", 29400)
  assert world.source == "torchrun"  # torchrun under srun: torchrun's own


def test_an_srun_task_becomes_a_torchrun_rank():
  world = cluster.torch_world_from_env(srun_env(3))
  assert (world.rank, world.world_size, world.local_rank,
          world.local_world_size) == (3, 4, 1, 2)
  assert world.master_addr == "gpu07"  # the first node hosts the store
  assert world.master_port == cluster.slurm_port_base(srun_env(3))
  assert world.torchrun_env()["RANK"] == "3"
  explicit = cluster.torch_world_from_env(srun_env(3, MASTER_PORT="29555"))
  assert explicit.master_port == 29555


def test_a_failed_srun_task_names_its_place_in_its_failure_record():
  assert failure.launched_worker("multi_worker", srun_env(2)) == (2, 4)


def test_a_pipelined_srun_step_has_task_0_the_client_and_task_k_stage_k_1():
  base = cluster.slurm_port_base({"SLURM_JOB_ID": "4321"})
  found = [cluster.pipeline_cluster_from_env(srun_env(i)) for i in range(4)]
  # Every task derives the same cluster: the client, then 3 stages.
  assert {(c.client, c.stages) for c in found} == {
      (f"gpu07:{base}", (f"gpu07:{base + 1}", f"gpu08:{base}",
                         f"gpu08:{base + 1}"))}
  assert [c.role for c in found] == [cluster.PIPELINE_CLIENT] + [
      cluster.PIPELINE_STAGE] * 3
  assert [c.stage_index for c in found[1:]] == [0, 1, 2]
  assert found[0].cluster_spec() == {"chief": [f"gpu07:{base}"],
                                     "worker": list(found[0].stages)}


def test_a_pipelined_tf_config_names_the_client_chief_and_stages_workers():
  tf_config = {"cluster": {"chief": ["127.0.0.1:7000"],
                           "worker": ["127.0.0.1:7001", "127.0.0.2:7002"]},
               "task": {"type": "worker", "index": 1}}
  found = cluster.pipeline_cluster_from_env(
      {"TF_CONFIG": json.dumps(tf_config)})
  assert found.role == cluster.PIPELINE_STAGE and found.stage_index == 1
  assert found.stages == ("127.0.0.1:7001", "127.0.0.2:7002")
  # A worker-only TF_CONFIG (a multi-worker job's) has no client.
  with pytest.raises(ConfigError, match="chief"):
    cluster.pipeline_cluster_from_env({"TF_CONFIG": json.dumps(
        {"cluster": {"worker": ["a:1", "b:2"]},
         "task": {"type": "worker", "index": 0}})})
  assert cluster.pipeline_cluster_from_env({}) is None
