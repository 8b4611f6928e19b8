"""The multi-worker launcher: real worker processes on localhost."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tfoverlap import launch
from overlap_core.runtime import run_record

from tests import sockets
from tests.helpers import (REPO_ROOT, run_module, subprocess_env,
                           wait_for_line)
from tests.stuck_peer import run_stuck_job

TINY_RUN = ["--model=mlp", "--dataset=synthetic", "--image_size=8",
            "--batch_size=16", "--prefetch=2", "--log_every_steps=5",
            "--tensorboard=false"]


def test_worker_args_carry_cluster_settings():
  args = launch.build_worker_args(["--model=mlp", "--num_workers=5"], 2)
  assert "--strategy=multi_worker" in args
  assert "--num_workers=2" in args and "--num_workers=5" not in args
  assert any(a.startswith("--model_dir=runs/tensorflow-mlp-") for a in args)
  assert any(a.startswith("--intra_op_threads=") for a in args)


def test_tf_config_names_every_worker():
  config = json.loads(launch.tf_config([1111, 2222], 1))
  assert config["cluster"]["worker"] == ["localhost:1111", "localhost:2222"]
  assert config["task"] == {"type": "worker", "index": 1}


@pytest.mark.parametrize("args, message", [
    (["--num_workers=1", "--", "--model=mlp"], "--num_workers=1"),
    (["--num_workers=2", "--", "--batch_size=0"], "--batch_size=0"),
    (["--num_workers=2", "--", "--batch_size=15"], "--batch_size=15"),
    (["--num_workers=2", "--", "--model=nope"], "--model=nope"),
])
def test_bad_flags_stop_before_any_worker_starts(args, message):
  result = run_module("tfoverlap.launch", *args, timeout=120)
  assert result.returncode == 2
  assert message in result.stderr
  assert "Traceback" not in result.stderr


def test_a_bad_collective_timeout_stops_before_any_worker_starts(tmp_path):
  result = run_module("tfoverlap.launch", "--num_workers=2", "--",
                      f"--model_dir={tmp_path}", timeout=120,
                      TFOVERLAP_COLLECTIVE_TIMEOUT_S="soon")
  assert result.returncode == 2
  assert "TFOVERLAP_COLLECTIVE_TIMEOUT_S=soon" in result.stderr
  assert not os.listdir(tmp_path)


# With --deterministic the job is as deterministic as one process: the
# all-reduce sums two workers' gradients in one order, and the data and the
# seeds are the same in every run. So a resumed job must end where this
# uninterrupted one does, not only with both workers agreeing.
REFERENCE_STEPS = 50
# Synchronous checkpoints do not change what a run computes, so the
# reference also leaves the chief's checkpoints for the resume test.
SYNC_EVERY_STEPS = 25
REFERENCE_ARGS = [*TINY_RUN, "--deterministic", "--checkpoint=sync",
                  f"--checkpoint_every={SYNC_EVERY_STEPS}"]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  """An uninterrupted deterministic two-worker job; tests only read it."""
  model_dir = tmp_path_factory.mktemp("uninterrupted_two_workers")
  result = run_module("tfoverlap.launch", "--num_workers=2", "--",
                      *REFERENCE_ARGS, f"--train_steps={REFERENCE_STEPS}",
                      f"--model_dir={model_dir}", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir


def test_two_workers_train_to_identical_weights(reference_run):
  chief = run_record.load_run_record(str(reference_run))
  other = run_record.load_run_record(str(reference_run / "worker-1"))
  assert chief["worker"] == {"index": 0, "num_workers": 2}
  assert other["worker"] == {"index": 1, "num_workers": 2}
  assert chief["strategy"]["name"] == "multi_worker"
  # MultiWorkerMirroredStrategy is CollectiveAllReduceStrategy at run time.
  assert chief["strategy"]["class"] == "CollectiveAllReduceStrategy"
  assert chief["strategy"]["num_replicas"] == 2
  assert chief["steps"] == other["steps"] == REFERENCE_STEPS
  assert chief["weights_digest"] == other["weights_digest"]
  # A multi-worker job times no reference step (`trainer._times_reference`
  # says why), so it derives no contention.
  assert "contention" not in chief["phases_derived"]
  assert "reference_step" not in chief["strategy"]


def _children(pid: int) -> list:
  with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as f:
    return [int(p) for p in f.read().split()]


def _worker_index(pid: int) -> int:
  with open(f"/proc/{pid}/environ", "rb") as f:
    env = dict(item.split(b"=", 1) for item in f.read().split(b"\0")
               if b"=" in item)
  return json.loads(env[b"TF_CONFIG"])["task"]["index"]


def test_killed_worker_ends_the_job_with_a_clear_message(tmp_path):
  """And, while the job still trained, its workers exposed exactly the
  ports their warnings name (one job checks both)."""
  launcher = subprocess.Popen(
      [sys.executable, "-m", "tfoverlap.launch", "--num_workers=2", "--",
       *TINY_RUN, "--train_steps=100000", "--data_service=local",
       f"--model_dir={tmp_path}"],
      cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  workers = {}
  try:
    # Wait until the chief reports training progress: collectives are live.
    wait_for_line(launcher.stdout, "[worker 0] step ", timeout=300)
    pids = [launcher.pid] + sockets.descendants(launcher.pid)
    listening = sockets.listening_sockets(pids)
    environments = {pid: sockets.environment(pid) for pid in pids}
    workers = {_worker_index(pid): pid for pid in _children(launcher.pid)}
    os.kill(workers[1], signal.SIGKILL)
    # Bounded: the launcher must notice and stop the chief by itself.
    _, stderr = launcher.communicate(timeout=launch.STOP_GRACE_S + 60)
  finally:
    if launcher.poll() is None:
      launcher.kill()
  assert launcher.returncode != 0
  assert "worker 1 was killed by SIGKILL" in stderr
  assert "stopping the other 1 worker(s)" in stderr
  # Ordered by progress, checked at once: communicate() returned after the
  # launcher exited, and the launcher reaps every worker before it exits.
  # (Waiting would let the parent-death signal kill the chief, and hide a
  # launcher that left it running.)
  with pytest.raises(ProcessLookupError):
    os.kill(workers[0], 0)  # the chief is gone too
  _assert_workers_expose_exactly_the_ports_their_warnings_name(
      sockets.Snapshot(listening, environments, stderr))


def test_every_worker_resumes_from_the_chiefs_checkpoint(tmp_path,
                                                        reference_run):
  # Only the chief wrote; the other worker's scratch copy is gone.
  assert (reference_run / "checkpoints" /
          f"ckpt-{REFERENCE_STEPS}.index").exists()
  assert not (reference_run / "checkpoints" / "scratch-worker-1").exists()
  shutil.copytree(reference_run / "checkpoints", tmp_path / "checkpoints")
  resumed = run_module("tfoverlap.launch", "--num_workers=2", "--",
                       *REFERENCE_ARGS,
                       f"--train_steps={REFERENCE_STEPS + SYNC_EVERY_STEPS}",
                       f"--model_dir={tmp_path}", timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  chief = run_record.load_run_record(str(tmp_path))
  other = run_record.load_run_record(str(tmp_path / "worker-1"))
  assert chief["checkpoint"]["restore"]["step"] == REFERENCE_STEPS
  assert other["checkpoint"]["restore"]["step"] == REFERENCE_STEPS
  # Both resumed at the reference's last step.
  assert chief["steps"] == other["steps"] == SYNC_EVERY_STEPS
  assert chief["weights_digest"] == other["weights_digest"]


def test_async_checkpoints_have_one_writer_one_cadence_one_resume_step(
    tmp_path, reference_run):
  expected_digest = run_record.load_run_record(
      str(reference_run))["weights_digest"]

  args = [*TINY_RUN, "--deterministic", "--checkpoint=async",
          "--checkpoint_every=auto", f"--model_dir={tmp_path}"]
  first = run_module("tfoverlap.launch", "--num_workers=2", "--", *args,
                     "--train_steps=40", timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  chief = run_record.load_run_record(str(tmp_path))
  other = run_record.load_run_record(str(tmp_path / "worker-1"))
  assert chief["checkpoint"]["writer"] and not other["checkpoint"]["writer"]
  assert chief["checkpoint"]["num_persisted"] >= 2
  # The cadence was agreed: the same decisions at the same steps.
  assert chief["checkpoint"]["decisions"]
  assert ([d["every_steps"] for d in chief["checkpoint"]["decisions"]]
          == [d["every_steps"] for d in other["checkpoint"]["decisions"]])
  written = sorted(os.listdir(tmp_path / "checkpoints"))
  assert written and all(n.startswith("ckpt-") for n in written)
  assert not (tmp_path / "worker-1" / "checkpoints").exists()
  last = chief["checkpoint"]["last_persisted_step"]

  second = run_module("tfoverlap.launch", "--num_workers=2", "--", *args,
                      f"--train_steps={REFERENCE_STEPS}", timeout=300)
  assert second.returncode == 0, second.stderr[-3000:]
  chief = run_record.load_run_record(str(tmp_path))
  other = run_record.load_run_record(str(tmp_path / "worker-1"))
  assert chief["checkpoint"]["restore"]["step"] == last
  assert other["checkpoint"]["restore"]["step"] == last
  assert chief["steps"] == other["steps"] == REFERENCE_STEPS - last
  assert (chief["weights_digest"] == other["weights_digest"]
          == expected_digest)


def test_stuck_worker_ends_the_job_after_the_collective_timeout(tmp_path):
  _, record = run_stuck_job("tfoverlap", TINY_RUN, tmp_path, unit="worker")
  assert record["error"]["type"] == "DeadlineExceededError"


def _announced_ports(stderr: str) -> list:
  """The ports the warnings say listen on all interfaces."""
  ports = []
  for line in stderr.splitlines():
    match = re.search(r": warning: .* listens on all interfaces "
                      r"\(ports ([\d, ]+)\)", line)
    if match:
      ports += [int(p) for p in match.group(1).split(",")]
  return ports


def _assert_workers_expose_exactly_the_ports_their_warnings_name(snapshot):
  """What TensorFlow cannot close is announced, port by port, and nothing
  else listens: each worker's gRPC server and, with --data_service=local,
  its tf.data dispatcher and worker."""
  announced = _announced_ports(snapshot.stderr)
  # 2 gRPC servers (the launcher's line), 2 x (dispatcher + worker).
  assert len(announced) == len(set(announced)) == 6, snapshot.stderr[-3000:]
  exposed = [s for s in snapshot.sockets if not s.is_loopback]
  assert sorted(s.port for s in exposed) == sorted(announced), exposed
  assert all(s.is_wildcard for s in exposed), exposed
  # The launcher's ports are the ones in TF_CONFIG, served by the workers.
  tf_configs = [json.loads(env["TF_CONFIG"])
                for env in snapshot.environments.values() if "TF_CONFIG" in env]
  cluster_ports = {int(a.rsplit(":", 1)[1])
                   for a in tf_configs[0]["cluster"]["worker"]}
  assert cluster_ports <= {s.port for s in exposed}
