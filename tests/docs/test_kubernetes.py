"""The Kubernetes manifests parse, run real commands, and give each replica
the cluster the trainers read."""

import json
import os

import pytest
import yaml

from overlap_core.runtime import cluster
from tests.docs import doc_commands

EXAMPLES = os.path.join(doc_commands.ROOT, "examples", "kubernetes")


def _load(name):
  with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
    [manifest] = list(yaml.safe_load_all(f))
  return manifest


def _containers(replica_spec):
  return replica_spec["template"]["spec"]["containers"]


def _replicas(manifest, key):
  return manifest["spec"][key]


@pytest.fixture(scope="module")
def flags_of():
  return doc_commands.module_flags(["tfoverlap.train", "torch_parity.train"])


def _invocation(container):
  words = container["command"] + container.get("args", [])
  [invocation] = doc_commands.invocations(words)
  return invocation


def test_tfjob_is_workers_only_and_their_tf_config_is_the_cluster(flags_of):
  manifest = _load("tfjob.yaml")
  assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1",
                                                        "TFJob")
  specs = _replicas(manifest, "tfReplicaSpecs")
  # A Chief, PS or Evaluator replica puts a task type in TF_CONFIG that the
  # trainer refuses.
  assert list(specs) == ["Worker"]
  [container] = _containers(specs["Worker"])
  assert container["name"] == "tensorflow"
  invocation = _invocation(container)
  assert invocation.module == "tfoverlap.train"
  assert doc_commands.unknown_flags(invocation, flags_of) == []
  num_workers = int(invocation.values["num_workers"])
  assert invocation.values["strategy"] == "multi_worker"
  assert specs["Worker"]["replicas"] == num_workers
  # The TF_CONFIG the operator writes into worker i's pod.
  name = manifest["metadata"]["name"]
  port = container["ports"][0]["containerPort"]
  workers = [f"{name}-worker-{i}.default.svc:{port}"
             for i in range(num_workers)]
  for index in range(num_workers):
    tf_config = {"cluster": {"worker": workers},
                 "task": {"type": "worker", "index": index}}
    found = cluster.tf_cluster_from_env({"TF_CONFIG": json.dumps(tf_config)})
    assert found.workers == tuple(workers)
    assert found.task_index == index


def test_pytorchjob_ranks_form_the_world_the_trainer_expects(flags_of):
  manifest = _load("pytorchjob.yaml")
  assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1",
                                                        "PyTorchJob")
  specs = _replicas(manifest, "pytorchReplicaSpecs")
  assert set(specs) == {"Master", "Worker"}
  world_size = sum(spec["replicas"] for spec in specs.values())
  ranks = []
  # The operator gives the master rank 0 and the workers 1, 2, ...
  for kind, first_rank in (("Master", 0), ("Worker", 1)):
    [container] = _containers(specs[kind])
    assert container["name"] == "pytorch"
    invocation = _invocation(container)
    assert invocation.module == "torch_parity.train"
    assert doc_commands.unknown_flags(invocation, flags_of) == []
    assert invocation.values["strategy"] == "multi_worker"
    assert int(invocation.values["num_workers"]) == world_size
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    for rank in range(first_rank, first_rank + specs[kind]["replicas"]):
      env.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                  "MASTER_ADDR": f"{manifest['metadata']['name']}-master-0",
                  "MASTER_PORT": "23456"})
      world = cluster.torch_world_from_env(env)
      assert (world.world_size, world.local_rank,
              world.local_world_size) == (world_size, 0, 1)
      ranks.append(world.rank)
  assert sorted(ranks) == list(range(world_size))
