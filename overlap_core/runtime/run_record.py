"""The run record, `<model_dir>/run.json`: one schema for both frameworks.

A comparison tool reads these files without knowing which trainer wrote
them. Everything here is plain Python: the trainers pass in what only their
framework can know (versions, devices, weights as NumPy arrays).
"""

import dataclasses
import hashlib
import json
import os
import platform
import re
import socket
import sys
import tempfile
import time
from typing import Iterable, Optional, Tuple

import numpy as np

from overlap_core import __version__
from overlap_core.runtime import host_allocator
from overlap_core.runtime import verdict as verdict_lib
from overlap_core.runtime.config import TrainConfig

SCHEMA_VERSION = 2  # 2: the checkpoint section
RUN_RECORD_NAME = "run.json"
TRACE_NAME = "trace.json"


def default_model_dir(framework: str, model_name: str) -> str:
  """runs/<framework>-<model>-<timestamp>, relative to the working directory."""
  stamp = time.strftime("%Y%m%d-%H%M%S")
  # An import path or a file names a user's model: keep a name a directory
  # can take ("mypkg.nets:build" -> "mypkg.nets-build").
  safe_name = re.sub(r"[^\w.\-]+", "-", os.path.basename(model_name))
  return os.path.join("runs", f"{framework}-{safe_name}-{stamp}")


def with_default_model_dir(config: TrainConfig, framework: str) -> TrainConfig:
  """`config`, with `default_model_dir` where --model_dir was left empty."""
  if config.run.model_dir:
    return config
  return dataclasses.replace(config, run=dataclasses.replace(
      config.run,
      model_dir=default_model_dir(framework, config.model.name)))


def worker_dir(model_dir: str, worker_index: int) -> str:
  """Where a worker writes: the chief at the top, the others beneath."""
  if worker_index == 0:
    return model_dir
  return os.path.join(model_dir, f"worker-{worker_index}")


def write_json_atomically(path: str, payload) -> None:
  """Writes JSON so that a reader never sees a half-written file."""
  directory = os.path.dirname(path) or "."
  os.makedirs(directory, exist_ok=True)
  fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".tmp-",
                                  suffix=".json")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(payload, f, indent=2, sort_keys=True, default=_to_jsonable)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp_path, path)
  except BaseException:
    if os.path.exists(tmp_path):
      os.unlink(tmp_path)
    raise


def _to_jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"not JSON serializable: {type(value).__name__}")


def digest_weights(named_arrays: Iterable[Tuple[str, np.ndarray]]) -> str:
  """SHA-256 over names, dtypes, shapes and bytes, in the given order.

  Equal digests mean bit-identical weights; any changed bit changes it.
  """
  digest = hashlib.sha256()
  for name, array in named_arrays:
    array = np.ascontiguousarray(array)
    digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def describe_host() -> dict:
  """The framework-independent part of a run's environment."""
  return {
      "python": sys.version.split()[0],
      "platform": platform.platform(),
      "machine": platform.machine(),
      "hostname": socket.gethostname(),
      "cpu_count": os.cpu_count(),
      "numpy": np.__version__,
      "tfoverlap": __version__,
      "host_allocator": host_allocator.describe(),
  }


def build_run_record(*, framework: str, config: dict, environment: dict,
                     model_name: str, num_params: int, strategy: dict,
                     ledger_summary: dict, num_steps: int, wall_s: float,
                     final: dict, weights_digest: str, worker_index: int,
                     num_workers: int, phases_measured: Iterable[str],
                     outputs: dict, phases_derived: Iterable[str] = (), checkpoint: Optional[dict] = None,
                     notes: Optional[list] = None,
                     offload: Optional[dict] = None,
                     pipeline: Optional[dict] = None,
                     background: Optional[dict] = None,
                     steps_per_execution: int = 1,
                     model_source: Optional[dict] = None,
                     data_source: Optional[dict] = None,
                     paired_removal: Optional[dict] = None) -> dict:
  """Assembles the run.json payload; see docs/run-record.md for each field.

  `steps_per_execution` is the steps each traced call ran: above 1, the
  ledger timed spans of that many steps, and every per-step figure in
  `phases` is a span divided by it (the input waits, timed inside the call,
  too).

  `background` is the background job's throughput and the foreground's
  slowdown (`BackgroundRunner.stats()`), or None without one.

  `checkpoint` is `CheckpointEngine.stats()`, or None without checkpoints.
  `offload` is the offload copies per direction, or None without offload;
  the copies run in series with compute are also the `offload`
  phase, carved out of compute (`overlap_core.runtime.offload_stats`).
  `pipeline` is `pipeline_stats.pipeline_section(...)`, or None when the
  model is not pipelined.

  `model_source` and `data_source` say where the model and the data came
  from (`user_code.Origin.describe()`: the zoo's name, the user's import
  path, or a .keras file with its sha256).

  `paired_removal` is `paired_removal.summarize(...)`, both halves of a
  run whose cause was removed in alternate blocks of steps, or None.
  """
  phases_measured = list(phases_measured)
  return {
      "schema_version": SCHEMA_VERSION,
      "framework": framework,
      "flags": config,
      "environment": environment,
      "model": {"name": model_name, "num_params": int(num_params),
                "source": model_source},
      "data": {"source": data_source},
      "strategy": strategy,
      "worker": {"index": worker_index, "num_workers": num_workers},
      "steps": num_steps,
      "wall_s": wall_s,
      "warmup_steps": ledger_summary["warmup_steps"],
      "measured_steps": ledger_summary["measured_steps"],
      "samples_per_second": ledger_summary["samples_per_second"],
      "phases": ledger_summary["phases"],
      "phases_measured": list(phases_measured),
      "phases_derived": list(phases_derived),
      "phases_moved_ms": ledger_summary.get("moved_ms", {}),
      "against_step_alone": ledger_summary.get("against_step_alone"),
      "verdict": verdict_lib.step_verdict(
          ledger_summary["phases"], phases_measured).to_dict(),
      "steps_per_execution": steps_per_execution,
      "cpu": ledger_summary.get("cpu"),
      "final": final,
      "weights_digest": weights_digest,
      "checkpoint": checkpoint,
      "offload": offload,
      "pipeline": pipeline,
      "background": background,
      "paired_removal": paired_removal,
      "outputs": outputs,
      "notes": list(notes or []),
  }


def build_failure_record(*, framework: str, config: dict, error: dict,
                         timeout: Optional[dict], worker_index: int,
                         num_workers: int) -> dict:
  """The run.json of a run that ended with a runtime error.

  Only these keys, so that no reader mistakes it for a finished run:
  `status` is "failed" (a finished run has no `status`), `error` names the
  error, and `timeout` says what timed out (see `waits.describe_timeout`),
  or is null.
  """
  return {
      "schema_version": SCHEMA_VERSION,
      "framework": framework,
      "status": "failed",
      "flags": config,
      "worker": {"index": worker_index, "num_workers": num_workers},
      "error": error,
      "timeout": timeout,
      "pid": os.getpid(),
      "ended_at": time.time(),
  }


def write_run_record(model_dir: str, record: dict) -> str:
  path = os.path.join(model_dir, RUN_RECORD_NAME)
  write_json_atomically(path, record)
  return path


def load_run_record(path: str) -> dict:
  """Reads a run.json (or the one inside a model_dir)."""
  if os.path.isdir(path):
    path = os.path.join(path, RUN_RECORD_NAME)
  with open(path, encoding="utf-8") as f:
    return json.load(f)
