"""The framework-neutral checkpoint core: file format, commits, cadence."""

import concurrent.futures
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import zlib

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from overlap_core.checkpoint import cadence
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.checkpoint import engine as checkpoint_engine
from overlap_core.checkpoint import persist
from overlap_core.checkpoint import tensor_file
from overlap_core.checkpoint.files import (CheckpointError,
                                             CorruptCheckpointError)
from overlap_core.runtime.config import CheckpointConfig

from tests.helpers import (PROGRESS_WAIT_S, REPO_ROOT, checkpoint_config,
                           subprocess_env, wait_for_line, wait_until)


def _arrays(step: int) -> dict:
  return {"layer/kernel": np.full((64, 32), step, np.float32),
          "layer/bias": np.arange(32, dtype=np.float64) + step,
          "counts": np.array([step, 2 * step], np.int64)}


# --- tensor_file -----------------------------------------------------------


def test_tensor_file_round_trips_and_the_official_reader_agrees(tmp_path):
  arrays = {"a": np.random.default_rng(0).normal(size=(3, 5)).astype(
      np.float32), "b": np.arange(7, dtype=np.int64),
            "c": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
            "d": np.array(True), "e": np.zeros((0, 4), np.float16)}
  path = str(tmp_path / "t.safetensors")
  digest, size = tensor_file.write_tensor_file(path, arrays,
                                               metadata={"group": "x"})
  assert size == os.path.getsize(path)
  with open(path, "rb") as f:
    assert digest == f"{zlib.crc32(f.read()):08x}"
  ours, metadata = tensor_file.read_tensor_file(path)
  official = safetensors.numpy.load_file(path)
  assert metadata == {"group": "x"}
  for name, array in arrays.items():
    assert ours[name].dtype == array.dtype and ours[name].shape == array.shape
    np.testing.assert_array_equal(ours[name], array)
    np.testing.assert_array_equal(official[name], array)
  assert list(ours) == list(arrays)  # write order is kept


def test_truncated_tensor_file_is_refused(tmp_path):
  path = str(tmp_path / "t.safetensors")
  tensor_file.write_tensor_file(path, _arrays(1))
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 10)
  with pytest.raises(tensor_file.TensorFileError, match="past the end"):
    tensor_file.read_tensor_file(path)


# --- checkpoint_files ------------------------------------------------------


def _write(directory, step):
  return checkpoint_files.write_checkpoint(
      str(directory), step, {"model": _arrays(step), "optimizer": {}},
      {"step": step, "epoch": 0})


def test_commit_load_and_keep_newest(tmp_path):
  for step in (10, 20, 30, 40):
    _write(tmp_path, step)
    checkpoint_files.prune(str(tmp_path), keep=2)
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [30, 40]
  loaded = checkpoint_files.load_latest(str(tmp_path))
  assert loaded.step == 40 and loaded.state["step"] == 40
  np.testing.assert_array_equal(loaded.groups["model"]["layer/kernel"],
                                _arrays(40)["layer/kernel"])
  assert sorted(os.listdir(tmp_path)) == ["ckpt-0000000030",
                                          "ckpt-0000000040"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_state"])
def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path,
                                                               damage):
  _write(tmp_path, 10)
  newest = _write(tmp_path, 20)
  victim = os.path.join(newest, "model.safetensors")
  if damage == "flip":
    with open(victim, "r+b") as f:
      f.seek(200)
      byte = f.read(1)
      f.seek(200)
      f.write(bytes([byte[0] ^ 0xFF]))
  elif damage == "truncate":
    with open(victim, "r+b") as f:
      f.truncate(100)
  else:
    os.unlink(os.path.join(newest, checkpoint_files.STATE_NAME))
  warnings = []
  loaded = checkpoint_files.load_latest(str(tmp_path), warn=warnings.append)
  assert loaded.step == 10
  assert len(warnings) == 1 and "ckpt-0000000020" in warnings[0]


def test_no_good_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
  newest = _write(tmp_path, 10)
  with open(os.path.join(newest, "model.safetensors"), "r+b") as f:
    f.truncate(50)
  with pytest.raises(CheckpointError, match="no checkpoint .* verifies"):
    checkpoint_files.load_latest(str(tmp_path), warn=lambda m: None)
  with pytest.raises(CorruptCheckpointError):
    checkpoint_files.load_checkpoint(newest)


def test_unwritable_directory_is_named(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with pytest.raises(CheckpointError, match="cannot write checkpoints to"):
    checkpoint_files.check_writable(str(blocker / "checkpoints"))


_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from overlap_core.checkpoint import engine as checkpoint_engine
    from overlap_core.checkpoint import files as checkpoint_files
    directory, start = sys.argv[1], int(sys.argv[2])
    checkpoint_files.recover(directory)  # what every writer does first
    step = start
    while True:
      step += 1
      print("begin", step, flush=True)
      arrays = {"w": np.full((512, 512), step, np.float32),
                "v": np.full((256, 512), -step, np.float64)}
      checkpoint_engine.write_snapshot(
          directory, checkpoint_engine.Snapshot(step, {"model": arrays},
                                                {"step": step}),
          to_host=lambda value: value, keep=2)
      print("committed", step, flush=True)
""")


def test_sigkill_at_random_moments_never_leaves_a_bad_checkpoint(tmp_path):
  # A writer committing ~3 MB checkpoints in a loop is killed 25 times, each
  # after a random number (0-5) of its progress lines past its first
  # commit, so the kills land at the start of a write, in its middle, and
  # in the renames and prunes. After every kill and restart (recovery
  # first), the newest checkpoint must verify and hold its own step's
  # values, at least `keep` must remain, and the step never goes backwards.
  rng = random.Random(1234)
  directory = str(tmp_path / "ckpts")
  last_step = 0
  for _ in range(25):
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, directory, str(last_step)],
        cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
        text=True)
    try:
      wait_for_line(writer.stdout, "committed", timeout=120)
      for _ in range(rng.randint(0, 5)):
        writer.stdout.readline()
      writer.send_signal(signal.SIGKILL)
    finally:
      writer.kill()
      writer.wait()
      writer.stdout.close()
    checkpoint_files.recover(directory)
    loaded = checkpoint_files.load_latest(
        directory, warn=lambda m: pytest.fail(f"corrupt after kill: {m}"))
    assert loaded.step > last_step
    assert np.all(loaded.groups["model"]["w"] == loaded.step)
    assert np.all(loaded.groups["model"]["v"] == -loaded.step)
    if last_step:
      assert len(checkpoint_files.list_checkpoints(directory)) >= 2
    last_step = loaded.step
    assert not [n for n in os.listdir(directory) if n.startswith(".")]


# --- cadence -----------------------------------------------------------------


def test_plan_interval_known_answers():
  # stall 30 ms on 100 ms steps at a 3% bound: 0.03 / (0.03 * 0.1) = 10.
  every, predicted, reason = cadence.plan_interval(
      cadence.CostEstimate(step_s=0.1, busy_step_s=0.1, stall_s=0.03,
                           persist_s=0.5), 0.03)
  assert every == 10 and predicted == pytest.approx(0.03)
  assert "overhead bound" in reason
  # A 2.5 s persist needs 25 steps of 100 ms before the next snapshot.
  every, predicted, reason = cadence.plan_interval(
      cadence.CostEstimate(0.1, 0.1, 0.001, 2.5), 0.03)
  assert every == 25 and "persist" in reason
  # A persist that slows steps from 100 to 125 ms for 1 s costs 200 ms.
  costs = cadence.CostEstimate(0.1, 0.125, 0.0, 1.0)
  assert costs.interference_s == pytest.approx(0.2)
  every, predicted, _ = cadence.plan_interval(costs, 0.05)
  assert every == 40 and predicted == pytest.approx(0.05)


def test_plan_interval_counts_the_persists_cpu_time():
  # The step times show no slowdown, but the persist's thread used 400 ms
  # of CPU while training kept 3/4 of the cores busy: 300 ms taken from
  # training. (0.001 + 0.3) / (0.03 * 0.1) = 100.3 -> every 101 steps.
  costs = cadence.CostEstimate(step_s=0.1, busy_step_s=0.1, stall_s=0.001,
                               persist_s=0.5, persist_cpu_s=0.4,
                               cpu_share=0.75)
  assert costs.interference_by_steps_s == 0.0
  assert costs.interference_s == pytest.approx(0.3)
  every, predicted, reason = cadence.plan_interval(costs, 0.03)
  assert every == 101 and predicted <= 0.03
  assert "by CPU 300.0" in reason
  # The larger of the two estimates is charged: here the step times'.
  costs = cadence.CostEstimate(0.1, 0.2, 0.0, 1.0, persist_cpu_s=0.1,
                               cpu_share=0.5)
  assert costs.interference_s == pytest.approx(0.5)


def test_plan_interval_counts_the_step_after_the_snapshot():
  # The snapshot's copy lands in the next step (160 ms against 100):
  # 60 ms per checkpoint, so at 3% every 0.06 / 0.003 = 20 steps.
  costs = cadence.CostEstimate(0.1, 0.1, 0.0, 0.0, after_snapshot_s=0.16)
  assert costs.after_snapshot_extra_s == pytest.approx(0.06)
  every, _, reason = cadence.plan_interval(costs, 0.03)
  assert every == 20 and "after-snapshot step 60.0 ms" in reason


def _drive_with_a_dear_first_step(policy, steps, num_steps=1):
  """Steps of 100 ms, except the one after each snapshot (160 ms); spans
  of `num_steps` steps, as a loop with several steps per call reports."""
  due, after_snapshot = [], False
  for step in steps:
    if step % num_steps:
      continue
    extra_s = 0.06 if after_snapshot else 0.0
    policy.observe_step(0.1 + extra_s / num_steps, persisting=False,
                        num_steps=num_steps)
    after_snapshot = policy.is_due(step)
    if after_snapshot:
      due.append(step)
      policy.observe_stall(0.0)
      policy.observe_persist(0.0)
  return due


@pytest.mark.parametrize("num_steps", [1, 4])
def test_auto_cadence_charges_the_step_after_each_snapshot(num_steps):
  policy = cadence.CadencePolicy(cadence.AUTO, max_overhead_frac=0.03,
                                 probe_steps=num_steps)
  due = _drive_with_a_dear_first_step(policy, range(1, 401), num_steps)
  estimate = policy.local_estimate()
  assert estimate.after_snapshot_extra_s == pytest.approx(0.06)
  assert policy.every_steps == 20
  assert all(b - a == 20 for a, b in zip(due[1:], due[2:]))


def _drive(policy, steps, step_s, stall_s, persist_s, agree=None):
  """Simulates training: returns the steps at which checkpoints happened."""
  due = []
  for step in steps:
    policy.observe_step(step_s, persisting=False)
    if policy.is_due(step, agree=agree):
      due.append(step)
      policy.observe_stall(stall_s)
      policy.observe_persist(persist_s)
  return due


def test_fixed_cadence_is_every_n_absolute_steps():
  policy = cadence.CadencePolicy(25, first_step=11)
  assert _drive(policy, range(11, 101), 0.1, 0.01, 0.1) == [25, 50, 75, 100]


def test_auto_cadence_probes_plans_and_adapts():
  logged = []
  policy = cadence.CadencePolicy(cadence.AUTO, max_overhead_frac=0.03,
                                 probe_steps=10, log=logged.append)
  due = _drive(policy, range(1, 201), 0.1, 0.03, 0.2)
  assert due[0] == 10  # the probe
  assert policy.every_steps == 10
  assert all(b - a == 10 for a, b in zip(due[1:], due[2:]))
  assert "every 10 steps" in logged[0]
  # The snapshot gets 4x dearer: the interval grows to keep the bound.
  due = _drive(policy, range(201, 601), 0.1, 0.12, 0.2)
  assert policy.every_steps == 40
  assert [d.every_steps for d in policy.decisions] == [10, 40]
  assert due[-1] - due[-2] == 40


def test_workers_with_different_costs_agree_on_one_cadence():
  # Two workers measure different costs; `agree` is the all-reduce maximum
  # both would get, so both plan from the same numbers.
  workers = [cadence.CadencePolicy(cadence.AUTO) for _ in range(2)]
  costs = [(0.1, 0.03, 0.5), (0.12, 0.0, 0.0)]  # only worker 0 persists
  due = [[], []]
  for step in range(1, 301):
    for worker, (step_s, _, _) in zip(workers, costs):
      worker.observe_step(step_s, persisting=False)
    estimates = [w.local_estimate().to_vector() for w in workers]
    agreed = [max(column) for column in zip(*estimates)]
    for index, (worker, (_, stall_s, persist_s)) in enumerate(zip(workers,
                                                                  costs)):
      if worker.is_due(step, agree=lambda vector: agreed):
        due[index].append(step)
        if stall_s:
          worker.observe_stall(stall_s)
          worker.observe_persist(persist_s)
  assert due[0] == due[1] and len(due[0]) > 5
  assert workers[0].decisions == workers[1].decisions


# --- the engine --------------------------------------------------------------


def _engine(directory, **kwargs):
  def snapshot(step):
    return checkpoint_engine.Snapshot(step=step,
                                  groups={"model": _arrays(step)},
                                  state={"step": step})
  return checkpoint_engine.CheckpointEngine(str(directory), checkpoint_config(kwargs),
                                            take_snapshot=snapshot,
                                            log=lambda m: None, **kwargs)


def _blocked_writer():
  """to_host that blocks until released: a persist that takes as long as the
  test wants (a slow disk, or one hung in the filesystem)."""
  release = threading.Event()

  def to_host(value):
    release.wait()
    return value

  return to_host, release


def _in_call_to(thread: threading.Thread, function_name: str) -> bool:
  """Whether `thread` is running `function_name` now (e.g. blocked in it).

  Looks at the thread's stack: the engine says nothing while it waits, and
  a test that only slept "long enough" before releasing would pass or fail
  with the host's speed.
  """
  frame = sys._current_frames().get(thread.ident)  # pylint: disable=protected-access
  while frame is not None:
    if frame.f_code.co_name == function_name:
      return True
    frame = frame.f_back
  return False


def test_busy_policy_wait_holds_the_save_until_the_persist_ends(tmp_path):
  to_host, release = _blocked_writer()
  engine = _engine(tmp_path, every_steps=1, if_busy="wait", to_host=to_host)
  saved = {}

  def train():
    for step in (1, 2):
      saved[step] = engine.is_due(step) and engine.save(step)

  # The training thread; this one decides when the persist of step 1 ends.
  trainer = threading.Thread(target=train, daemon=True)
  try:
    trainer.start()
    wait_until(lambda: (_in_call_to(trainer, "_wait_for_persist")
                        or not trainer.is_alive()),
               "the save of step 2 waiting for the persist of step 1")
    assert trainer.is_alive(), "the save of step 2 did not wait"
    assert engine.last_saved_step == 1  # step 2's snapshot is not taken yet
  finally:
    release.set()
  trainer.join(timeout=PROGRESS_WAIT_S)
  assert not trainer.is_alive() and saved == {1: True, 2: True}
  engine.close()
  stats = engine.stats()
  assert stats["num_saved"] == stats["num_persisted"] == 2
  assert stats["num_busy_waits"] == 1 and stats["busy_wait_s"] > 0
  assert stats["num_skipped_busy"] == 0
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [1, 2]
  assert json.dumps(stats)  # run.json can hold it


def test_busy_policy_skip_drops_checkpoints_while_the_persist_runs(
    tmp_path):
  to_host, release = _blocked_writer()
  engine = _engine(tmp_path, every_steps=1, if_busy="skip", to_host=to_host)
  try:
    # The persist of step 1 cannot end before `release`: every later due
    # step finds it running. Bounded: an engine that waited would hang.
    saved = _run_bounded(lambda: [engine.save(step) for step in range(1, 6)
                                  if engine.is_due(step)])
  finally:
    release.set()
  engine.close()
  assert saved == [True, False, False, False, False]
  stats = engine.stats()
  assert stats["num_skipped_busy"] == 4 and stats["num_busy_waits"] == 0
  assert stats["num_saved"] == stats["num_persisted"] == 1
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == [1]
  assert json.dumps(stats)  # run.json can hold it


def _nice_of_this_thread() -> int:
  return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_persist_thread_lowers_its_own_priority_only(tmp_path):
  """Training keeps its priority; the persist yields the cores to it."""
  training = _nice_of_this_thread()
  expected = min(19, training + persist.PERSIST_NICE_INCREMENT)
  seen = []
  threads = persist.PersistThread(timeout_s=60)
  threads.start(1, lambda: seen.append(_nice_of_this_thread()) or 0.0)
  assert threads.wait()
  assert seen == [expected] and threads.nice == expected
  assert _nice_of_this_thread() == training
  # The engine's persists run so, and run.json says at what nice value.
  engine = _engine(tmp_path, every_steps=1)
  assert engine.is_due(1)
  engine.save(1)
  engine.close()
  assert engine.stats()["persist_nice"] == expected


def test_engine_measures_the_persists_cpu_and_the_trainings_share(tmp_path):
  engine = _engine(tmp_path, every_steps=2)
  for step in range(1, 7):
    sum(i * i for i in range(20_000))  # the step: work on this thread
    if engine.is_due(step):
      engine.save(step)
      engine.wait_until_finished()
  engine.close()
  stats = engine.stats()
  assert stats["persist_cpu_s"]["count"] == stats["persist_s"]["count"] == 3
  # Writing files takes CPU, and one thread cannot use more CPU than the
  # wall time it ran (1 ms: the two clocks are read a few instructions
  # apart).
  for cpu_s, wall_s in zip(engine.persist_cpu_s, engine.persist_s):
    assert 0 < cpu_s <= wall_s + 1e-3
  estimate = engine.policy.local_estimate()
  assert estimate.persist_cpu_s == pytest.approx(
      statistics.median(engine.persist_cpu_s))
  # Steps that ran no persist measured the share of the cores in use.
  assert 0 < estimate.cpu_share <= 1


def test_resumed_engine_keeps_the_cadence_and_names_the_restore(tmp_path):
  engine = _engine(tmp_path, every_steps=10)
  engine.resumed_from(20, str(tmp_path))
  due = [step for step in range(21, 41) if engine.is_due(step)]
  engine.close()
  assert due == [30, 40]  # absolute steps, as in an uninterrupted run
  assert engine.stats()["restore"] == {"step": 20, "path": str(tmp_path)}


def test_a_failing_persist_raises_on_the_training_thread(tmp_path):
  def failing_to_host(value):
    raise OSError(28, "No space left on device")
  engine = _engine(tmp_path, every_steps=2, to_host=failing_to_host)
  assert engine.is_due(1) is False
  assert engine.is_due(2)
  engine.save(2)
  with pytest.raises(CheckpointError, match="step 2 failed while persisting"
                     ".*No space left"):
    engine.close()
  assert checkpoint_files.list_checkpoints(str(tmp_path)) == []
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


def test_warn_policy_trains_on_and_counts_failures(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  logged = []
  engine = checkpoint_engine.CheckpointEngine(
      str(blocker / "ckpts"),
      CheckpointConfig(mode="async", every_steps=1, keep=3, on_error="warn"),
      take_snapshot=lambda step: checkpoint_engine.Snapshot(step, {"m": {}}, {}),
      log=logged.append)
  for step in range(1, 4):
    if engine.is_due(step):
      engine.save(step)
    engine.wait_until_finished()
  engine.close()
  assert engine.stats()["num_failed"] == 4  # the directory, then 3 saves
  assert any("cannot write checkpoints" in m for m in logged)


# --- bounded waits -------------------------------------------------------------


def _run_bounded(body, limit_s=120):
  """Runs `body` on a thread; a hang fails the test instead of freezing it.

  The limit is not a timing claim: a correct engine returns within about
  its tiny persist_timeout_s, a broken one never.
  """
  outcome = {}

  def run():
    try:
      outcome["value"] = body()
    except BaseException as e:  # pylint: disable=broad-except
      outcome["error"] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(timeout=limit_s)
  assert not thread.is_alive(), "the engine hung on a blocked persist"
  if "error" in outcome:
    raise outcome["error"]
  return outcome.get("value")


def test_a_hung_persist_raises_on_close_instead_of_hanging(tmp_path):
  to_host, release = _blocked_writer()
  engine = _engine(tmp_path, every_steps=1, to_host=to_host,
                   persist_timeout_s=0.2)
  try:
    engine.save(1)
    with pytest.raises(CheckpointError, match="step 1 failed: its persist "
                       "did not finish within 0.2 s"):
      _run_bounded(engine.close)
    assert engine.stats()["num_failed"] == 1
  finally:
    release.set()


def test_a_hung_persist_under_warn_trains_on_and_fails_each_checkpoint(
    tmp_path):
  to_host, release = _blocked_writer()
  logged = []
  engine = checkpoint_engine.CheckpointEngine(
      str(tmp_path),
      CheckpointConfig(mode="async", every_steps=1, keep=3, on_error="warn"),
      to_host=to_host, persist_timeout_s=0.2, log=logged.append,
      take_snapshot=lambda step: checkpoint_engine.Snapshot(
          step, {"model": _arrays(step)}, {"step": step}))

  def train():
    for step in range(1, 6):
      if engine.is_due(step):
        engine.save(step)
    engine.finish(5)

  try:
    _run_bounded(train)
    stats = engine.stats()
    # Step 2 waited for step 1's persist until its deadline; 3, 4, 5 and the
    # final save failed at once while it still hung; close did not wait.
    assert stats["num_failed"] == 5 and stats["num_persisted"] == 0
    assert "did not finish within 0.2 s" in stats["errors"][0]
    assert "still running" in stats["errors"][-1]
    assert checkpoint_files.list_checkpoints(str(tmp_path)) == []
  finally:
    release.set()
  # Released, the persist of step 1 completes whole; the engine books it.
  # (Its deadline has passed, so the engine's own waits return at once.)
  future = engine._persists._future  # pylint: disable=protected-access
  _run_bounded(lambda: concurrent.futures.wait([future]))
  engine.wait_until_finished()
  assert engine.stats()["num_persisted"] == 1, engine.stats()["errors"]
  assert checkpoint_files.load_latest(str(tmp_path)).step == 1


def test_the_training_error_is_reported_not_hidden_by_a_hung_persist(
    tmp_path):
  to_host, release = _blocked_writer()
  engine = _engine(tmp_path, every_steps=1, to_host=to_host,
                   persist_timeout_s=0.2)

  def failing_training_loop():
    engine.save(1)
    try:
      raise RuntimeError("the training error")
    except BaseException:
      # What both trainers do on the way out.
      with contextlib.suppress(Exception):
        engine.close()
      raise

  try:
    with pytest.raises(RuntimeError, match="the training error"):
      _run_bounded(failing_training_loop)
  finally:
    release.set()


def test_persist_timeout_must_be_positive(tmp_path):
  with pytest.raises(ValueError, match="persist_timeout_s=0"):
    _engine(tmp_path, persist_timeout_s=0)
