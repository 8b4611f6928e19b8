"""What the checkpoint tests of both frameworks share.

Faults: kills triggered by progress, and full disks. A kill is triggered by
what the process has printed (a step reached, a final save begun), never by
a delay, so a fast machine and a slow one kill at the same points. And a
script run without the checkout, to show that checkpoints load without it.
And one writer per model directory, the same check for both trainers.
"""

import os
import queue
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Callable, List, Optional, Sequence, Tuple

from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint.engine import checkpoint_dir
from overlap_core.runtime import dir_lock, run_record

from tests.helpers import REPO_ROOT, subprocess_env, wait_until

# A trainer's progress line: "step  12/60  loss ...", one per step with
# --log_every_steps=1. It is printed after the step's checkpoint stall, so
# a kill right after the line of a checkpoint step lands in its persist.
_STEP_LINE = re.compile(r"^step\s+(\d+)/")


def run_killed_when(command: Sequence[str], kill_when: Callable[[str], bool],
                    *, line_timeout_s: float) -> Tuple[int, List[str], str]:
  """Runs `command`, SIGKILLing it right after a line that `kill_when` picks.

  The process runs in a session of its own, and the whole group is killed,
  so helper processes (data loader workers) die with it.

  Args:
    command: the command line; it runs in the checkout with its modules on
      the path.
    kill_when: called with each stdout line, in order; True kills now.
    line_timeout_s: the longest wait for the next line; past it the
      process is killed and the test fails.

  Returns:
    (the return code, -SIGKILL where the kill landed; the stdout lines read
    before the kill; the stderr text).
  """
  with tempfile.TemporaryFile(mode="w+") as stderr:
    process = subprocess.Popen(
        list(command), cwd=REPO_ROOT, env=subprocess_env(),
        stdout=subprocess.PIPE, stderr=stderr, text=True,
        start_new_session=True)
    lines: "queue.Queue" = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process, lines),
                              daemon=True)
    reader.start()
    try:
      seen = _read_until(process, lines, kill_when, line_timeout_s)
    finally:
      _kill_group(process)  # nothing outlives the test, killed or not
      process.wait()
      reader.join(timeout=60)
      process.stdout.close()
    stderr.seek(0)
    return process.returncode, seen, stderr.read()


def _read_lines(process, lines) -> None:
  for line in process.stdout:
    lines.put(line)
  lines.put(None)


def _read_until(process, lines, kill_when, line_timeout_s) -> List[str]:
  seen = []
  while True:
    try:
      line = lines.get(timeout=line_timeout_s)
    except queue.Empty:
      raise AssertionError(
          f"{' '.join(process.args)} printed no line for {line_timeout_s} "
          f"s; its last lines: {seen[-5:]}") from None
    if line is None:
      return seen
    seen.append(line.rstrip("\n"))
    if kill_when(seen[-1]):
      _kill_group(process)
      return seen


def _kill_group(process) -> None:
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass  # it had ended already


def limit_file_size(max_bytes: int):
  """A preexec_fn under which a write past `max_bytes` fails with EFBIG.

  Python ignores SIGXFSZ, so the write raises OSError mid-file, as a full
  disk does with ENOSPC.
  """
  def apply():
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
  return apply


def check_full_disk_outcome(result: subprocess.CompletedProcess, policy: str,
                            model_dir: str) -> None:
  """What a run whose saves after step 10 hit a full disk must leave.

  With on_error=raise, one line naming the failed save of step 20; with
  warn, training on, the failures counted. Either way the good checkpoint
  of step 10 alone, and nothing half-written.
  """
  if policy == "raise":
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "checkpoint of step 20 failed" in last and "too large" in last
  else:
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training goes on" in result.stderr
    record = run_record.load_run_record(model_dir)
    assert record["checkpoint"]["num_failed"] >= 2
  directory = checkpoint_dir(model_dir)
  assert checkpoint_files.list_checkpoints(directory) == [10]
  assert checkpoint_files.load_latest(directory).step == 10
  assert not [n for n in os.listdir(directory) if n.startswith(".")]


def damage(path: str) -> None:
  """Overwrites 64 bytes inside a file, as bit rot would."""
  with open(path, "r+b") as f:
    f.seek(1000)
    f.write(b"\x00" * 64)


def check_fell_back(result: subprocess.CompletedProcess, model_dir: str, *,
                    restored_step: int, num_steps: int) -> None:
  """A run whose newest checkpoint was damaged: it said so, restored the
  one before, and trained on from there."""
  assert "skipping corrupt checkpoint" in result.stderr
  assert "checksum mismatch" in result.stderr
  record = run_record.load_run_record(model_dir)
  assert record["checkpoint"]["restore"]["step"] == restored_step
  assert record["steps"] == num_steps


def resume_from(stopped, model_dir, *, drop=()) -> str:
  """Copies a stopped run's checkpoints into `model_dir`, less the steps
  in `drop`, so each test resumes its own copy of one shared run."""
  directory = str(model_dir / "checkpoints")
  shutil.copytree(str(stopped / "checkpoints"), directory)
  for step in drop:
    shutil.rmtree(os.path.join(directory,
                               checkpoint_files.checkpoint_dir_name(step)))
  return directory


def check_resumed_like(model_dir, whole_dir, *, step: int,
                       num_steps: int) -> None:
  """A deterministic run resumed in `model_dir` from the checkpoint of
  `step` of the uninterrupted run in `whole_dir` took `num_steps` more
  steps, bit-identical to that run's."""
  resumed = run_record.load_run_record(str(model_dir))
  whole = run_record.load_run_record(str(whole_dir))
  assert f"resumed from the checkpoint of step {step}" in resumed["notes"]
  assert resumed["steps"] == num_steps
  assert resumed["weights_digest"] == whole["weights_digest"]


def newest_checkpoint(directory: str) -> Optional[
    checkpoint_files.LoadedCheckpoint]:
  """The newest checkpoint, which must verify: a kill may cost steps, never
  a good checkpoint."""
  def fail(message):
    raise AssertionError(f"a kill left a bad checkpoint: {message}")
  loaded = checkpoint_files.load_latest(directory, warn=fail)
  if loaded is not None:
    assert loaded.state["step"] == loaded.step, loaded.path
  return loaded


# Kills after random steps, before the one after the last step. With a
# checkpoint every 3 steps, each random kill lands in a step or in a
# persist (a third of the steps start one, which then runs on through the
# next steps); two such kills, each on the state the one before left, and
# the kill in the final save cover every kind of moment, while each kill
# costs a trainer process.
NUM_RANDOM_KILLS = 2


def checkpoint_identity(directory: str, step: int) -> tuple:
  """Changes whenever the checkpoint of `step` is written again."""
  info = os.stat(os.path.join(directory,
                              checkpoint_files.checkpoint_dir_name(step)))
  return info.st_ino, info.st_mtime_ns


def kill_trainer_at_random_steps(command: Sequence[str], directory: str, *,
                                 total_steps: int, num_kills: int,
                                 rng: random.Random) -> int:
  """Kills a trainer after random step lines, then once after its last one.

  Each run restores the newest checkpoint and is killed after the line of a
  step drawn from those it has left (before its last), so kills land in
  steps, snapshots and persists alike; a last run is killed after its
  final step line, in the final save. After every run the newest
  checkpoint must verify.

  Args:
    command: the trainer's command line, with --log_every_steps=1.
    directory: its checkpoint directory.
    total_steps: its --train_steps.
    num_kills: the runs killed before the last step.
    rng: draws the steps (seeded by the caller).

  Returns:
    How many kills landed (the one after the last step may come too late).
  """
  landed = 0
  for run in range(num_kills + 1):
    newest = newest_checkpoint(directory)
    first = (newest.step if newest else 0) + 1
    kill_step = (rng.randint(first, total_steps - 1)
                 if run < num_kills and first < total_steps else total_steps)

    def reached(line, kill_step=kill_step):
      match = _STEP_LINE.match(line)
      return bool(match) and int(match.group(1)) >= kill_step

    returncode, _, stderr = run_killed_when(command, reached,
                                            line_timeout_s=240)
    assert returncode in (0, -signal.SIGKILL), stderr[-3000:]
    landed += returncode == -signal.SIGKILL
    newest_checkpoint(directory)
  return landed


def run_without_checkout(script: str, *args: str, cwd: str) -> None:
  """Runs `python -c script args...` with nothing of the checkout on the
  path, as a user without tfoverlap would."""
  env = dict(subprocess_env())
  env.pop("PYTHONPATH", None)
  subprocess.run([sys.executable, "-c", script, *args], cwd=cwd, env=env,
                 check=True, timeout=120)


def check_one_writer_per_model_dir(module: str, model_dir: str,
                                   args: Sequence[str]) -> None:
  """A second trainer on a live run's --model_dir exits 2 naming the holder;
  once the holder is SIGKILLed, the next run resumes from its checkpoint.

  Args:
    module: the trainer ("tfoverlap.train").
    model_dir: the directory both use.
    args: the flags both use, with a checkpoint mode and cadence; no
      --train_steps (the holder runs until it is killed).
  """
  command = [sys.executable, "-m", module, f"--model_dir={model_dir}",
             *args]
  checkpoints = checkpoint_dir(model_dir)
  with tempfile.TemporaryFile(mode="w+") as holder_stderr:
    holder = subprocess.Popen(
        command + ["--train_steps=1000000"], cwd=REPO_ROOT,
        env=subprocess_env(), stdout=subprocess.DEVNULL,
        stderr=holder_stderr, start_new_session=True)
    try:
      wait_until(lambda: holder.poll() is not None or (
          os.path.isdir(checkpoints)
          and checkpoint_files.list_checkpoints(checkpoints)),
                 "the holder's first checkpoint", timeout_s=240)
      holder_stderr.seek(0)
      assert holder.poll() is None, holder_stderr.read()[-3000:]
      second = subprocess.run(command + ["--train_steps=5"], cwd=REPO_ROOT,
                              env=subprocess_env(), capture_output=True,
                              text=True, timeout=240, check=False)
      assert second.returncode == 2, second.stderr[-3000:]
      line = second.stderr.strip().splitlines()[-1]
      assert (f"--model_dir={model_dir}: in use by pid {holder.pid} on host "
              f"{socket.gethostname()}, started ") in line, line
    finally:
      _kill_group(holder)
      holder.wait()
  # Its LOCK still names it, and must not keep the next run out.
  assert dir_lock.read_holder(model_dir).pid == holder.pid, (
      dir_lock.read_holder(model_dir))
  # The kill may land between a write's last fsync and its rename; the next
  # writer promotes that complete copy before it restores (`recover`).
  # Settling the directory the same way first makes `newest` the step the
  # next run must resume from, whichever moment the kill hit.
  checkpoint_files.recover(checkpoints)
  newest = newest_checkpoint(checkpoints).step
  third = subprocess.run(command + [f"--train_steps={newest + 2}"],
                         cwd=REPO_ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=240,
                         check=False)
  assert third.returncode == 0, third.stderr[-3000:]
  record = run_record.load_run_record(model_dir)
  assert record["checkpoint"]["restore"]["step"] == newest, record["checkpoint"]
  assert record["steps"] == 2, record["notes"]
