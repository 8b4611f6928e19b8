"""The PyTorch launcher: real DDP ranks over gloo and real Horovod ranks.

Mirrors tests/test_launch.py. Horovod's PyTorch extension must be installed
(tools/install_horovod.sh); these tests fail, not skip, without it.
"""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import processes
from overlap_core.runtime import run_record
from torch_parity import launch

from tests import sockets
from tests.helpers import (REPO_ROOT, run_module, subprocess_env,
                           wait_for_line)
from tests.stuck_peer import run_stuck_job

# small_cnn has BatchNorm, whose statistics every rank must end up sharing.
TINY_RUN = ["--model=small_cnn", "--dataset=synthetic", "--image_size=8",
            "--batch_size=16", "--prefetch=2", "--log_every_steps=5",
            "--tensorboard=false", "--trace=false"]
TWO_RANKS = ["--intra_op_threads=1", "--inter_op_threads=1"]
# Generous for a loaded 2-core machine; without the launcher's supervision
# the surviving rank would wait the 180 s collective timeout or forever.
DEAD_RANK_BOUND_S = processes.STOP_GRACE_S + 60


def test_worker_args_carry_the_world_settings():
  args = launch.build_worker_args(["--model=mlp", "--num_workers=5"], 2)
  assert "--strategy=multi_worker" in args
  assert "--num_workers=2" in args and "--num_workers=5" not in args
  assert any(a.startswith("--model_dir=runs/pytorch-mlp-") for a in args)
  assert any(a.startswith("--intra_op_threads=") for a in args)
  horovod = launch.build_worker_args(["--strategy=horovod"], 2)
  assert "--strategy=horovod" in horovod
  assert "--strategy=multi_worker" not in horovod


def test_ranks_get_the_torchrun_environment():
  env = launch.torchrun_env({"KEEP": "1"}, rank=1, world_size=2,
                            master_port=29511)
  assert env["KEEP"] == "1"
  assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"],
          env["LOCAL_WORLD_SIZE"]) == ("1", "1", "2", "2")
  assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29511")


def test_horovodrun_runs_the_trainer_on_localhost_with_gloo():
  command = launch.horovodrun_command(2, ["--model=mlp"])
  assert os.path.basename(command[0]) == "horovodrun"
  assert command[1:7] == ["-np", "2", "-H", "localhost:2", "--gloo",
                         "--disable-cache"]
  assert command[7:] == [sys.executable, "-m", "torch_parity.train",
                         "--model=mlp"]


@pytest.mark.parametrize("args, message", [
    (["--num_workers=1", "--", "--model=mlp"], "--num_workers=1"),
    (["--num_workers=2", "--", "--batch_size=15"], "--batch_size=15"),
    (["--num_workers=2", "--", "--loop=fit"], "--loop=fit"),
    (["--num_workers=2", "--", "--checkpoint=tf_async"],
     "--checkpoint=tf_async"),
    (["--num_workers=2", "--", "--strategy=horovod", "--all_reduce=nccl"],
     "--all_reduce=nccl"),
])
def test_bad_flags_stop_before_any_rank_starts(tmp_path, args, message):
  result = run_module("torch_parity.launch", *args,
                      f"--model_dir={tmp_path}", timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert message in result.stderr
  assert "Traceback" not in result.stderr
  assert not os.listdir(tmp_path)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("ddp")
  result = run_module("torch_parity.launch", "--num_workers=2", "--",
                      *TINY_RUN, "--train_steps=20", "--deterministic",
                      "--all_reduce_pack_mb=1", f"--model_dir={model_dir}",
                      timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return result, model_dir


def test_two_ddp_ranks_over_gloo_train_to_identical_weights(ddp_run):
  result, model_dir = ddp_run
  chief = run_record.load_run_record(str(model_dir))
  other = run_record.load_run_record(str(model_dir / "worker-1"))
  assert chief["worker"] == {"index": 0, "num_workers": 2}
  assert other["worker"] == {"index": 1, "num_workers": 2}
  assert chief["strategy"]["name"] == "multi_worker"
  assert chief["strategy"]["class"] == "DistributedDataParallel"
  assert chief["strategy"]["num_replicas"] == 2
  assert "gloo, bucket_cap_mb 1" in chief["notes"][0]
  assert chief["steps"] == other["steps"] == 20
  assert chief["weights_digest"] == other["weights_digest"]
  # Only the chief prints progress, prefixed like the TensorFlow workers.
  assert "[worker 0] step 20/20" in result.stdout
  assert "[worker 1]" not in result.stdout


def test_torchrun_runs_the_same_job_as_the_launcher(ddp_run, tmp_path):
  _, launched_dir = ddp_run
  launched = run_record.load_run_record(str(launched_dir))
  result = subprocess.run(
      [sys.executable, "-m", "torch.distributed.run", "--standalone",
       "--nproc_per_node=2", "-m", "torch_parity.train",
       "--strategy=multi_worker", "--num_workers=2", *TINY_RUN, *TWO_RANKS,
       "--train_steps=20", "--deterministic", "--all_reduce_pack_mb=1",
       f"--model_dir={tmp_path}"],
      capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
      env=subprocess_env(), check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  record = run_record.load_run_record(str(tmp_path))
  assert record["strategy"]["num_replicas"] == 2
  assert record["weights_digest"] == launched["weights_digest"]


def _descendants(pid: int) -> list:
  """Every process below `pid`, including those its threads started."""
  children = []
  for task in glob.glob(f"/proc/{pid}/task/*/children"):
    try:
      with open(task, encoding="utf-8") as f:
        children += [int(p) for p in f.read().split()]
    except FileNotFoundError:
      continue
  found = []
  for child in children:
    found.append(child)
    found.extend(_descendants(child))
  return found


def _rank_pids(launcher_pid: int, variable: str) -> dict:
  """{rank: pid} of the trainer processes below the launcher.

  DataLoader workers are forks of their rank, with its environment and
  command line; a rank is the trainer process whose parent is not one.
  """
  trainers = {}
  for pid in _descendants(launcher_pid):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0")
                   if b"=" in item)
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().split(b"\0")
      with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
      continue
    if variable.encode() in env and b"torch_parity.train" in cmdline:
      trainers[pid] = (int(env[variable.encode()]), parent)
  return {rank: pid for pid, (rank, parent) in trainers.items()
          if parent not in trainers}


def _kill_rank_1_and_wait(launcher_args: list, variable: str, progress: str):
  """Kills rank 1 of a training job; returns the launcher's exit status,
  its stderr, the seconds it took to end after the kill, and what the job
  listened on just before the kill (one job checks both)."""
  launcher = subprocess.Popen(
      [sys.executable, "-m", "torch_parity.launch", *launcher_args],
      cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  ranks = {}
  try:
    # Training progress on rank 0 means the collectives are live.
    wait_for_line(launcher.stdout, progress, timeout=240)
    ranks = _rank_pids(launcher.pid, variable)
    assert sorted(ranks) == [0, 1], ranks
    # What the live job listens on, at the same point of its progress.
    pids = [launcher.pid] + sockets.descendants(launcher.pid)
    found = sockets.listening_sockets(pids)
    environments = {pid: sockets.environment(pid) for pid in pids}
    os.kill(ranks[1], signal.SIGKILL)
    started = time.monotonic()
    # Bounded: the job must end by itself.
    _, stderr = launcher.communicate(timeout=DEAD_RANK_BOUND_S)
    ended_s = time.monotonic() - started
  finally:
    if launcher.poll() is None:
      launcher.kill()
  # Ordered by progress, checked at once: communicate() returned after the
  # launcher exited, and the launcher reaps every rank before it exits.
  # (Waiting would let the parent-death signal kill rank 0, and hide a
  # launcher that left it running.)
  with pytest.raises(ProcessLookupError):
    os.kill(ranks[0], 0)  # the surviving rank is gone too
  return (launcher.returncode, stderr, ended_s,
          sockets.Snapshot(found, environments, stderr))


def test_killed_ddp_rank_ends_the_job_with_a_clear_message(tmp_path):
  """And, while the job still trained, the ranks listened on loopback
  only."""
  code, stderr, ended_s, snapshot = _kill_rank_1_and_wait(
      ["--num_workers=2", "--", *TINY_RUN, "--train_steps=100000",
       f"--model_dir={tmp_path}"], "RANK", "[worker 0] step ")
  assert code != 0
  last = stderr.strip().splitlines()[-1]
  assert last.startswith("torch_parity.launch: rank 1 was killed by SIGKILL")
  assert ended_s < DEAD_RANK_BOUND_S
  _assert_ddp_ranks_listen_on_loopback_only(snapshot)


def _unwritable_home(tmp_path):
  """A HOME nobody can create, even root (tests run as root, where a
  chmod-ed directory stays writable): beneath a regular file (ENOTDIR), as
  a read-only HOME cannot be written (Bazel's sandbox, a shared cluster
  home)."""
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  home = blocker / "home"
  with pytest.raises(NotADirectoryError):
    os.makedirs(home / ".horovod")
  return home


def test_two_horovod_ranks_train_like_ddp_and_need_no_writable_home(
    ddp_run, tmp_path):
  _, ddp_dir = ddp_run
  ddp = run_record.load_run_record(str(ddp_dir))
  model_dir = tmp_path / "run"
  result = run_module("torch_parity.launch", "--num_workers=2", "--",
                      "--strategy=horovod", *TINY_RUN, "--train_steps=20",
                      "--deterministic", "--all_reduce_pack_mb=1",
                      f"--model_dir={model_dir}", timeout=300,
                      HOME=str(_unwritable_home(tmp_path)))
  assert result.returncode == 0, result.stderr[-3000:]
  chief = run_record.load_run_record(str(model_dir))
  other = run_record.load_run_record(str(model_dir / "worker-1"))
  assert chief["strategy"]["name"] == "horovod"
  assert chief["strategy"]["num_replicas"] == 2
  assert "fusion threshold 1 MB" in chief["notes"][0]
  assert chief["weights_digest"] == other["weights_digest"]
  # Horovod times its synchronize as DDP times its buckets' wait, so its
  # replicas exchange their data waits and contention too
  # (`replica_phases`), and the phases they moved between still add up to
  # each worker's step.
  for record in (chief, other):
    moved = record["strategy"]["phases_over_replicas"]
    assert set(moved) == {ledger_lib.DATA_WAIT, ledger_lib.CONTENTION}
    phases = record["phases"]
    parts = sum(phases[p]["mean"] for p in phases if p != ledger_lib.STEP)
    assert parts == pytest.approx(phases[ledger_lib.STEP]["mean"], rel=1e-6)
  # Same data, same averaged gradients, BatchNorm statistics averaged over
  # ranks at the end: the same training as DDP's.
  for key in ("train_loss", "eval_loss", "eval_accuracy"):
    assert chief["final"][key] == pytest.approx(ddp["final"][key],
                                                rel=1e-5), key


def test_killed_horovod_rank_ends_the_job_with_a_clear_message(tmp_path):
  """And, while the job still trained, only horovodrun's announced
  rendezvous listened beyond loopback."""
  code, stderr, ended_s, snapshot = _kill_rank_1_and_wait(
      ["--num_workers=2", "--", "--strategy=horovod", *TINY_RUN,
       "--train_steps=100000", f"--model_dir={tmp_path}"], "HOROVOD_RANK",
      "[worker 0] step ")
  assert code != 0
  last = stderr.strip().splitlines()[-1]
  assert last.startswith("torch_parity.launch: rank 1 was killed by SIGKILL")
  assert ended_s < DEAD_RANK_BOUND_S
  _assert_only_horovodruns_announced_rendezvous_is_exposed(snapshot)


def test_stuck_rank_ends_the_job_after_the_collective_timeout(tmp_path):
  run_stuck_job("torch_parity", TINY_RUN, tmp_path, unit="rank")


def _assert_ddp_ranks_listen_on_loopback_only(snapshot):
  assert snapshot.sockets, "no listening socket found at all"
  assert all(s.is_loopback for s in snapshot.sockets), snapshot.sockets
  # Not vacuous: rank 0 serves the rendezvous store on MASTER_ADDR, which
  # torch would otherwise bind to every interface.
  master_ports = {int(env["MASTER_PORT"])
                  for env in snapshot.environments.values()
                  if "MASTER_PORT" in env}
  assert len(master_ports) == 1
  assert (("127.0.0.1", master_ports.pop()) in
          {(s.address, s.port) for s in snapshot.sockets})
  assert "listens on all interfaces" not in snapshot.stderr


def _assert_only_horovodruns_announced_rendezvous_is_exposed(snapshot):
  exposed = [s for s in snapshot.sockets if not s.is_loopback]
  assert len(exposed) == 1, snapshot.sockets
  assert exposed[0].is_wildcard and "horovodrun" in exposed[0].command
  assert launch.horovod_exposure_warning() in snapshot.stderr
