"""The cluster a multi-worker run belongs to, read from its engine's variables.

Framework-neutral: no tfoverlap-specific variable is ever required. A
process learns its place from what the engine that started it already sets:

  TF_CONFIG            TensorFlow's own cluster description (written by hand,
                       by a scheduler's integration, or by tfoverlap.launch)
  SLURM_*              one task of an `srun` step (SLURM_PROCID, the step's
                       node list and tasks per node)
  RANK, WORLD_SIZE...  torchrun (or torch_parity.launch, which sets the same)

  cluster = tf_cluster_from_env(os.environ)   # None: not a multi-worker run
  world = torch_world_from_env(os.environ)    # None: not one rank of a world

Slurm gives nodes, not ports, so the ports of a Slurm job are derived from
its job id (`slurm_port_base`): every task of the step computes the same
ones, and two jobs sharing a node rarely collide.
"""

import dataclasses
import json
import re
from typing import List, Mapping, Optional, Tuple

from overlap_core.runtime.config import ConfigError

# Slurm ports: 600 slots of 64 consecutive ports each from 20000, chosen by
# the job id, so every task of a step agrees without talking, and a node
# can hold 64 tasks of one job.
SLURM_PORT_FIRST = 20000
SLURM_PORTS_PER_JOB = 64
_SLURM_PORT_SLOTS = 600
# torchrun's own default rendezvous port, for a Slurm run of the PyTorch
# trainer that names no MASTER_PORT and has no job id.
TORCH_DEFAULT_PORT = 29500

_BRACKETS = re.compile(r"\[([^\]]*)\]")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _cluster_error(what: str) -> ConfigError:
  return ConfigError("strategy", "multi_worker", what)


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The workers of a multi-worker job, in task order, and this one's index.

  Attributes:
    workers: "host:port" of every worker (task i is workers[i]).
    task_index: this process's task.
    source: which environment said so ("TF_CONFIG", "slurm").
  """
  workers: Tuple[str, ...]
  task_index: int
  source: str

  def __post_init__(self):
    if not 0 <= self.task_index < len(self.workers):
      raise _cluster_error(
          f"{self.source} puts this task at index {self.task_index}, but "
          f"lists {len(self.workers)} worker(s)")

  @property
  def num_workers(self) -> int:
    return len(self.workers)

  def tf_config(self) -> str:
    """The same cluster as TensorFlow's TF_CONFIG (JSON)."""
    return json.dumps({"cluster": {"worker": list(self.workers)},
                       "task": {"type": "worker", "index": self.task_index}})


@dataclasses.dataclass(frozen=True)
class TorchWorld:
  """One rank of a torch.distributed world, in torchrun's terms."""
  rank: int
  world_size: int
  local_rank: int
  local_world_size: int
  master_addr: str
  master_port: int
  source: str  # "torchrun" or "slurm"

  def torchrun_env(self) -> dict:
    """The variables torchrun would give this rank (env:// reads them)."""
    return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port)}


# --- Slurm's syntax ---------------------------------------------------------


def _split_top_level(text: str) -> List[str]:
  """Splits on the commas outside brackets: "a[1,2],b" -> ["a[1,2]", "b"]."""
  parts, depth, start = [], 0, 0
  for i, char in enumerate(text):
    if char == "[":
      depth += 1
    elif char == "]":
      depth -= 1
    elif char == "," and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:])
  return parts


def _expand_range(text: str, nodelist: str) -> List[str]:
  """"01-03,07" -> ["01", "02", "03", "07"], keeping the zero padding."""
  values = []
  for item in text.split(","):
    low, _, high = item.partition("-")
    if not low.isdigit() or (high and not high.isdigit()):
      raise _cluster_error(f"the Slurm node list {nodelist!r} has a bad "
                           f"range [{text}]")
    high = high or low
    if int(high) < int(low):
      raise _cluster_error(f"the Slurm node list {nodelist!r} has a range "
                           f"that runs backwards [{text}]")
    values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
  return values


def expand_nodelist(nodelist: str) -> List[str]:
  """Slurm's compressed host list, expanded in order.

    expand_nodelist("node[01-03,07],gpu-a")
    -> ["node01", "node02", "node03", "node07", "gpu-a"]

  Several bracket groups in one name expand as a product, as Slurm does
  ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2).

  Raises:
    ConfigError: the list is empty or malformed.
  """
  if nodelist.count("[") != nodelist.count("]"):
    raise _cluster_error(f"the Slurm node list {nodelist!r} has unbalanced "
                         "brackets")
  hosts = []
  for part in _split_top_level(nodelist.strip()):
    if not part:
      raise _cluster_error(f"the Slurm node list {nodelist!r} has an empty "
                           "name")
    names = [""]
    position = 0
    for match in _BRACKETS.finditer(part):
      prefix = part[position:match.start()]
      names = [n + prefix + v for n in names
               for v in _expand_range(match.group(1), nodelist)]
      position = match.end()
    hosts += [n + part[position:] for n in names]
  return hosts


def expand_tasks_per_node(tasks_per_node: str) -> List[int]:
  """Slurm's tasks per node: "2(x3),1" -> [2, 2, 2, 1].

  Raises:
    ConfigError: the value is malformed.
  """
  counts = []
  for item in tasks_per_node.split(","):
    match = _REPEAT.match(item.strip())
    if not match:
      raise _cluster_error(f"Slurm's tasks per node {tasks_per_node!r} is "
                           "not like 2(x3),1")
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


# --- Slurm's variables -----------------------------------------------------


def _first(env: Mapping[str, str], *names: str) -> Optional[str]:
  """The value of the first of `names` set in `env` (a step's own names
  come before the job's)."""
  return next((env[n] for n in names if env.get(n)), None)


def _int_var(env: Mapping[str, str], name: str) -> int:
  try:
    return int(env[name])
  except ValueError:
    raise _cluster_error(f"{name}={env[name]} is not an integer") from None


def slurm_port_base(env: Mapping[str, str]) -> int:
  """The first port of this Slurm job's range (see the module's note)."""
  if not env.get("SLURM_JOB_ID", "").isdigit():
    return SLURM_PORT_FIRST
  slot = int(env["SLURM_JOB_ID"]) % _SLURM_PORT_SLOTS
  return SLURM_PORT_FIRST + slot * SLURM_PORTS_PER_JOB


@dataclasses.dataclass(frozen=True)
class SlurmStep:
  """The tasks of one srun step: where each runs, and which one this is."""
  nodes: Tuple[str, ...]
  tasks_per_node: Tuple[int, ...]
  rank: int

  @property
  def num_tasks(self) -> int:
    return sum(self.tasks_per_node)

  def place(self, rank: int) -> Tuple[int, int]:
    """(node index, local index) of `rank`, with Slurm's default block
    distribution: the first node's tasks first."""
    for node, count in enumerate(self.tasks_per_node):
      if rank < count:
        return node, rank
      rank -= count
    raise IndexError(rank)


def _even_split(num_tasks: int, num_nodes: int) -> List[int]:
  """How Slurm spreads tasks over nodes when it names no split: as evenly
  as it can, the extra tasks on the first nodes."""
  share, extra = divmod(num_tasks, num_nodes)
  return [share + (1 if i < extra else 0) for i in range(num_nodes)]


def slurm_step_from_env(env: Mapping[str, str]) -> Optional[SlurmStep]:
  """This srun task's step, from Slurm's variables; None outside srun.

  Raises:
    ConfigError: the variables are inconsistent or malformed, or the tasks
      are not block-distributed (every task must derive the same cluster).
  """
  if "SLURM_PROCID" not in env:
    return None
  rank = _int_var(env, "SLURM_PROCID")
  nodelist = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                    "SLURM_NODELIST")
  if not nodelist:
    raise _cluster_error("SLURM_PROCID is set but no node list is "
                         "(SLURM_STEP_NODELIST or SLURM_JOB_NODELIST)")
  nodes = expand_nodelist(nodelist)
  num_name = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
                   if env.get(n)), None)
  split = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
  if split:
    tasks_per_node = expand_tasks_per_node(split)
    if len(tasks_per_node) != len(nodes):
      raise _cluster_error(f"Slurm's tasks per node {split!r} names "
                           f"{len(tasks_per_node)} node(s), its node list "
                           f"{nodelist!r} {len(nodes)}")
  elif num_name:
    tasks_per_node = _even_split(_int_var(env, num_name), len(nodes))
  else:
    tasks_per_node = [1] * len(nodes)
  step = SlurmStep(nodes=tuple(nodes), tasks_per_node=tuple(tasks_per_node),
                   rank=rank)
  if num_name and _int_var(env, num_name) != step.num_tasks:
    raise _cluster_error(f"{num_name}={env[num_name]}, but the tasks per "
                         f"node add up to {step.num_tasks}")
  if not 0 <= rank < step.num_tasks:
    raise _cluster_error(f"SLURM_PROCID={rank} is outside the step's "
                         f"{step.num_tasks} task(s)")
  _check_block_distribution(env, step)
  return step


def _check_block_distribution(env: Mapping[str, str], step: SlurmStep) -> None:
  """Refuses a task that Slurm placed other than block distribution would,
  which every task assumes when it derives the others' addresses."""
  node, local = step.place(step.rank)
  for name, expected in (("SLURM_NODEID", node), ("SLURM_LOCALID", local)):
    if env.get(name) and _int_var(env, name) != expected:
      raise _cluster_error(
          f"{name}={env[name]} for SLURM_PROCID={step.rank}, where block "
          f"distribution puts {expected}; run srun with --distribution=block")


# --- What each framework reads ----------------------------------------------


def _tf_config_cluster(raw: str) -> Cluster:
  try:
    tf_config = json.loads(raw)
    workers = tuple(tf_config["cluster"]["worker"])
    index = int(tf_config["task"]["index"])
    task_type = tf_config["task"].get("type", "worker")
    task_types = set(tf_config["cluster"])
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise _cluster_error(f"TF_CONFIG is not a valid worker cluster ({e})"
                         ) from None
  if task_type != "worker" or task_types != {"worker"}:
    raise _cluster_error("TF_CONFIG may list only workers (no chief, ps or "
                         "evaluator): worker 0 is the chief here")
  return Cluster(workers=workers, task_index=index, source="TF_CONFIG")


def tf_cluster_from_env(env: Mapping[str, str]) -> Optional[Cluster]:
  """A TensorFlow worker's cluster: TF_CONFIG if set, else the srun step's
  tasks (one worker per task, ports from `slurm_port_base`); None when
  neither is there.

  Raises:
    ConfigError: the variables are malformed or inconsistent.
  """
  if env.get("TF_CONFIG"):
    return _tf_config_cluster(env["TF_CONFIG"])
  found = _slurm_task_addresses(env)
  if found is None:
    return None
  step, workers = found
  return Cluster(workers=workers, task_index=step.rank, source="slurm")


def _slurm_task_addresses(env: Mapping[str, str]):
  """(the srun step, every task's host:port in rank order), or None
  outside an srun step. Slurm gives no ports: task k of a node listens on
  `slurm_port_base` + k."""
  step = slurm_step_from_env(env)
  if step is None:
    return None
  base = slurm_port_base(env)
  addresses = []
  for node, count in zip(step.nodes, step.tasks_per_node):
    addresses += [f"{node}:{base + local}" for local in range(count)]
  return step, tuple(addresses)


def torch_world_from_env(env: Mapping[str, str]) -> Optional[TorchWorld]:
  """A PyTorch rank's world: torchrun's variables if RANK is set, else the
  srun step's tasks (the first node is the master); None when neither.

  Raises:
    ConfigError: the variables are malformed or inconsistent.
  """
  if "RANK" in env:
    world_size = _int_var(env, "WORLD_SIZE") if "WORLD_SIZE" in env else 1
    return TorchWorld(
        rank=_int_var(env, "RANK"), world_size=world_size,
        local_rank=(_int_var(env, "LOCAL_RANK") if "LOCAL_RANK" in env
                    else 0),
        local_world_size=(_int_var(env, "LOCAL_WORLD_SIZE")
                          if "LOCAL_WORLD_SIZE" in env else world_size),
        master_addr=env.get("MASTER_ADDR", ""),
        master_port=(_int_var(env, "MASTER_PORT") if "MASTER_PORT" in env
                     else TORCH_DEFAULT_PORT),
        source="torchrun")
  step = slurm_step_from_env(env)
  if step is None:
    return None
  node, local = step.place(step.rank)
  port = (_int_var(env, "MASTER_PORT") if env.get("MASTER_PORT") else
          slurm_port_base(env) if env.get("SLURM_JOB_ID") else
          TORCH_DEFAULT_PORT)
  return TorchWorld(rank=step.rank, world_size=step.num_tasks,
                    local_rank=local,
                    local_world_size=step.tasks_per_node[node],
                    master_addr=env.get("MASTER_ADDR") or step.nodes[0],
                    master_port=port, source="slurm")


PIPELINE_CLIENT = "client"
PIPELINE_STAGE = "stage"


@dataclasses.dataclass(frozen=True)
class PipelineCluster:
  """A process-pipelined job: one client that runs the training loop and
  one stage server per pipeline stage, and which of them this process is.

  Attributes:
    client: "host:port" of the client (TensorFlow's job "chief").
    stages: "host:port" of stage k's server at k (job "worker").
    role: PIPELINE_CLIENT or PIPELINE_STAGE.
    stage_index: with PIPELINE_STAGE, the stage this process serves.
    source: which environment said so ("TF_CONFIG", "slurm").
  """
  client: str
  stages: Tuple[str, ...]
  role: str
  stage_index: int
  source: str

  def cluster_spec(self) -> dict:
    """The jobs as TensorFlow's ClusterSpec takes them."""
    return {"chief": [self.client], "worker": list(self.stages)}


def _pipeline_error(what: str) -> ConfigError:
  return ConfigError("pipeline_runtime", "processes", what)


def pipeline_cluster_from_env(env: Mapping[str, str]
                              ) -> Optional[PipelineCluster]:
  """A process-pipelined job's cluster: TF_CONFIG with one "chief" (the
  client) and one "worker" per stage, or an srun step whose task 0 is the
  client and task k + 1 serves stage k (ports from `slurm_port_base`, as
  for multi-worker); None when neither is set.

  Raises:
    ConfigError: naming --pipeline_runtime, for a malformed cluster.
  """
  if env.get("TF_CONFIG"):
    try:
      tf_config = json.loads(env["TF_CONFIG"])
      jobs = tf_config["cluster"]
      clients, stages = list(jobs["chief"]), tuple(jobs["worker"])
      task_type = tf_config["task"]["type"]
      index = int(tf_config["task"]["index"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise _pipeline_error(
          'TF_CONFIG must list one "chief" (the client) and one "worker" per '
          f"stage, and this task's type and index ({e})") from None
    if len(clients) != 1 or set(jobs) != {"chief", "worker"}:
      raise _pipeline_error(
          'TF_CONFIG must list exactly one "chief" (the client) and the '
          f'stages as "worker"; it lists {sorted(jobs)}')
    if task_type not in ("chief", "worker"):
      raise _pipeline_error(f"TF_CONFIG's task type {task_type!r}: allowed:"
                            " chief (the client) or worker (a stage)")
    role = PIPELINE_CLIENT if task_type == "chief" else PIPELINE_STAGE
    if role == PIPELINE_STAGE and not 0 <= index < len(stages):
      raise _pipeline_error(f"TF_CONFIG puts this stage at index {index} "
                            f"of {len(stages)}")
    return PipelineCluster(client=clients[0], stages=stages, role=role,
                           stage_index=index if role == PIPELINE_STAGE
                           else 0, source="TF_CONFIG")
  found = _slurm_task_addresses(env)
  if found is None:
    return None
  step, tasks = found
  if len(tasks) < 2:
    raise _pipeline_error("the srun step has 1 task; allowed: one client "
                          "task and one task per stage")
  return PipelineCluster(
      client=tasks[0], stages=tuple(tasks[1:]),
      role=PIPELINE_CLIENT if step.rank == 0 else PIPELINE_STAGE,
      stage_index=max(0, step.rank - 1), source="slurm")
