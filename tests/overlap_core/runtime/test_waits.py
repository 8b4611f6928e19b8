"""Bounded waits and failure records: the framework-neutral part.

The end-to-end tests (a worker stuck on purpose until its peers time out)
are in tests/tfoverlap/test_launch.py and
tests/torch_parity/test_launch.py; here, each framework's own timeout message, taken
from those runs, is recognized, and nothing else is.
"""

import dataclasses
import json
import os
import time

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime import failure, processes, run_record, waits
from overlap_core.runtime.config import ConfigError

# The first lines a run that timed out printed, verbatim.
TENSORFLOW_TIMEOUT = (
    "Graph execution error:\n\nDetected at node CollectiveReduceV2 defined "
    "at (most recent call last):\n...\nCollective has timed out during "
    "execution.\n\t [[{{node CollectiveReduceV2}}]]")
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                "unbound_buffer.cc:78] Timed out waiting 180000ms for recv "
                "operation to complete")
STORE_TIMEOUT = ("Timed out after 181 seconds waiting for clients. 1/2 "
                 "clients joined.")


tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()  # defaults, as a trainer sees them


class DeadlineExceededError(Exception):
  """Stands for TensorFlow's class of the same name: only the name counts."""


@pytest.fixture(autouse=True)
def default_timeout(monkeypatch):
  monkeypatch.delenv(waits.COLLECTIVE_TIMEOUT_ENV, raising=False)


@pytest.mark.parametrize("error, line", [
    (DeadlineExceededError(TENSORFLOW_TIMEOUT),
     "Collective has timed out during execution."),
    (RuntimeError(GLOO_TIMEOUT), GLOO_TIMEOUT),
    (RuntimeError(STORE_TIMEOUT), STORE_TIMEOUT),
])
def test_each_frameworks_collective_timeout_is_recognized(error, line):
  timeout = waits.describe_timeout(error)
  assert timeout == {"kind": "collective_timeout", "timeout_s": 180,
                     "error": type(error).__name__, "message": line}
  explained = waits.explain(error)
  assert isinstance(explained, waits.CollectiveTimeoutError)
  assert str(explained).splitlines()[0].startswith(
      "timed out after 180 s waiting for a peer (")
  assert explained.__cause__ is error


@pytest.mark.parametrize("error", [
    TimeoutError("device prefetch: no batch from the input pipeline in 600 s"),
    OSError(28, "No space left on device"),
    RuntimeError("Connection closed by peer [127.0.0.1]:1234"),
])
def test_other_errors_are_not_timeouts(error):
  assert waits.describe_timeout(error) is None
  assert waits.explain(error) is error


def test_the_timeout_comes_from_the_environment(monkeypatch):
  assert waits.collective_timeout_s() == 180
  monkeypatch.setenv(waits.COLLECTIVE_TIMEOUT_ENV, "15")
  assert waits.collective_timeout_s() == 15
  assert waits.describe_timeout(RuntimeError(GLOO_TIMEOUT))["timeout_s"] == 15
  for bad in ("0", "-3", "1.5", "soon"):
    monkeypatch.setenv(waits.COLLECTIVE_TIMEOUT_ENV, bad)
    with pytest.raises(ConfigError,
                       match=f"{waits.COLLECTIVE_TIMEOUT_ENV}={bad}: "):
      waits.collective_timeout_s()


@pytest.mark.parametrize("strategy, env, place", [
    ("multi_worker", {"TF_CONFIG": json.dumps({
        "cluster": {"worker": ["localhost:1", "localhost:2"]},
        "task": {"type": "worker", "index": 1}})}, (1, 2)),
    ("multi_worker", {"RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),
    ("horovod", {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "3"}, (2, 3)),
    ("mirrored", {"RANK": "0", "WORLD_SIZE": "2"}, (0, 1)),
    ("mirrored", {"RANK": "1", "WORLD_SIZE": "2"}, None),
    ("default", {}, (0, 1)),
])
def test_each_launched_process_knows_where_its_record_goes(strategy, env,
                                                           place):
  assert failure.launched_worker(strategy, env) == place


def _config(model_dir: str, strategy: str = "multi_worker"):
  """A validated TrainConfig, as the trainers get it from their flags."""
  num_workers = "2" if strategy == "multi_worker" else "1"
  with flagsaver.as_parsed(strategy=strategy, num_workers=num_workers,
                           model_dir=model_dir):
    return tfo_flags.to_config()


def test_a_timed_out_worker_leaves_a_record_its_launcher_reads(tmp_path,
                                                               monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.setenv("RANK", "1")
  monkeypatch.setenv("WORLD_SIZE", "2")
  config = _config(str(tmp_path))
  started_s = time.time()
  path = failure.record_failure(config, RuntimeError(GLOO_TIMEOUT),
                                framework="pytorch")
  assert path == processes.record_path([f"--model_dir={tmp_path}"], 1)
  record = run_record.load_run_record(path)
  assert record["status"] == "failed"
  assert record["worker"] == {"index": 1, "num_workers": 2}
  assert record["error"] == {"type": "RuntimeError", "message": GLOO_TIMEOUT}
  assert record["timeout"]["timeout_s"] == 180
  assert processes.describe_failure(1, path, since_s=started_s) == (
      "exited with status 1 (timed out after 180 s waiting for a peer)")
  # A record older than this launch is not this launch's cause.
  assert processes.describe_failure(1, path, since_s=time.time() + 1) == (
      "exited with status 1")


def test_other_failures_are_recorded_but_not_named_by_the_launcher(
    tmp_path, monkeypatch):
  for name in ("TF_CONFIG", "RANK"):
    monkeypatch.delenv(name, raising=False)
  config = _config(str(tmp_path), strategy="default")
  path = failure.record_failure(config, OSError(28, "No space left"),
                                framework="tensorflow")
  record = run_record.load_run_record(path)
  assert record["timeout"] is None and record["error"]["type"] == "OSError"
  assert failure.recorded_cause(path, since_s=0) is None
  # An unwritable model_dir (perhaps the very error) records nothing.
  blocker = tmp_path / "file"
  blocker.write_text("")
  config = dataclasses.replace(config, run=dataclasses.replace(
      config.run, model_dir=str(blocker / "run")))
  assert failure.record_failure(config, OSError("x"),
                                framework="tensorflow") is None
  assert not os.path.exists(blocker / "run")
