"""The run.json of a run that failed, and the launchers' reading of it.

A run that ends with a runtime error (a collective that timed out, a full
disk) writes no results; the trainers then write a short failure record in
the place its run.json would go, so the directory says that the last run
failed and why (`run_record.build_failure_record`). A launcher whose worker
exited non-zero reads it back to name the cause in its one-line summary.

  # in a trainer's error path, before the one-line error:
  record_failure(config, error, framework="tensorflow")
  # in a launcher, for the worker that failed:
  detail = recorded_cause(path, since_s=started_s)  # "timed out after ..."
"""

import json
import os
from typing import Optional, Tuple

from overlap_core.runtime import cluster, run_record
from overlap_core.runtime import waits
from overlap_core.runtime.config import TrainConfig


def launched_worker(strategy: str,
                    env: Optional[dict] = None) -> Optional[Tuple[int, int]]:
  """(worker index, number of workers) of this process, from its launcher's
  environment; None for a process that writes no run.json of its own (a
  mirrored replica other than rank 0).

  The launchers' names: TF_CONFIG (TensorFlow multi-worker), RANK and
  WORLD_SIZE (torchrun, torch_parity.launch), SLURM_PROCID (an srun step),
  HOROVOD_RANK and HOROVOD_SIZE (horovodrun).
  """
  env = os.environ if env is None else env
  if strategy == "multi_worker" and env.get("TF_CONFIG"):
    try:
      tf_config = json.loads(env["TF_CONFIG"])
      return (int(tf_config["task"]["index"]),
              len(tf_config["cluster"]["worker"]))
    except (ValueError, KeyError, TypeError):
      return None
  if (strategy == "multi_worker" and "RANK" not in env and
      "SLURM_PROCID" in env):
    # A task of an srun step, TensorFlow or PyTorch alike.
    try:
      step = cluster.slurm_step_from_env(env)
    except ValueError:
      return None
    return step.rank, step.num_tasks
  rank_names = {"multi_worker": ("RANK", "WORLD_SIZE"),
                "horovod": ("HOROVOD_RANK", "HOROVOD_SIZE")}
  try:
    if strategy in rank_names and rank_names[strategy][0] in env:
      rank, size = rank_names[strategy]
      return int(env[rank]), int(env.get(size, "1"))
    if strategy == "mirrored" and int(env.get("RANK", "0")) != 0:
      return None
  except ValueError:
    return None
  return 0, 1


def record_failure(config: TrainConfig, error: BaseException, *,
                   framework: str) -> Optional[str]:
  """Writes this process's failure record; returns its path, or None.

  Nothing is written without an explicit --model_dir (the trainer stamps a
  default one only once it runs, and launchers always pass one), for a
  process with no run.json of its own, or where the directory cannot be
  written (which may be the very error being reported).
  """
  model_dir = config.run.model_dir
  place = launched_worker(config.distribute.strategy)
  if not model_dir or place is None:
    return None
  index, num_workers = place
  first_line = (str(error).strip().splitlines() or [""])[0]
  record = run_record.build_failure_record(
      framework=framework, config=config.to_dict(),
      error={"type": type(error).__name__, "message": first_line},
      timeout=waits.describe_timeout(error), worker_index=index,
      num_workers=num_workers)
  try:
    return run_record.write_run_record(
        run_record.worker_dir(model_dir, index), record)
  except OSError:
    return None


def recorded_cause(path: Optional[str], *, since_s: float) -> Optional[str]:
  """What a failure record written after `since_s` (time.time()) says
  ended the run, in words for a launcher's summary; None if it has none.

  Only a timeout is named: the trainer's own one-line error, printed just
  before, says the rest.
  """
  if not path:
    return None
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  if (not isinstance(record, dict) or record.get("status") != "failed" or
      record.get("ended_at", 0) < since_s or not record.get("timeout")):
    return None
  return waits.timeout_line(record["timeout"])
