"""TensorFlow pipeline stages as separate processes (--pipeline_runtime=
processes): real stage servers and a real client on loopback.

The equivalence check is the in-process one of test_pipeline.py (its
helpers, its tolerances: the same kernels on the same float64 values, in
another summation order), run by a client process of its own, since
connecting to a cluster changes the whole process's TensorFlow context.
That client is this file run as a script. On one host it then times
each stage alone, as the trainer does before training, and checks that
the run trains on from exactly the state it would have had without.
"""

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import tensorflow as tf

from overlap_core.runtime import processes
from tests.helpers import REPO_ROOT, subprocess_env, wait_until
from tests.tfoverlap.train_here import train_here

STAGES = 2
MICROBATCHES = 4
# Every process on one thread pool of one thread: three TensorFlow
# processes on a small host.
THREADS = ["--intra_op_threads=1", "--inter_op_threads=1"]
PIPELINE_FLAGS = ["--strategy=mirrored", f"--num_devices={STAGES}",
                  f"--pipeline_stages={STAGES}",
                  f"--pipeline_microbatches={MICROBATCHES}",
                  "--pipeline_split=even", "--pipeline_runtime=processes"]
TIMEOUT_S = 240
# Each stage's calls timed alone before a launched job trains: enough to
# check what run.json holds of them, fewer than a run's default.
REFERENCE_STEPS = 3


def _tf_config(client: str, stages: list, role: str, index: int) -> str:
  return json.dumps({"cluster": {"chief": [client], "worker": stages},
                     "task": {"type": role, "index": index}})


def _start_stage_servers(client: str, stages: list) -> list:
  """The stage servers, as a user on several hosts starts them: the
  trainer's own command with TF_CONFIG naming this task a worker."""
  return [subprocess.Popen(
      [sys.executable, "-m", "tfoverlap.train", *PIPELINE_FLAGS, *THREADS],
      cwd=REPO_ROOT, env=subprocess_env(
          TF_CONFIG=_tf_config(client, stages, "worker", k)))
          for k in range(len(stages))]


@pytest.mark.parametrize("hosts", [("127.0.0.1", "127.0.0.1"),
                                   ("127.0.0.1", "127.0.0.2")],
                         ids=["one_host", "two_loopback_hosts"])
def test_two_stage_processes_train_like_the_unsplit_model(hosts):
  ports = processes.free_ports(STAGES + 1)
  client = f"127.0.0.1:{ports[0]}"
  stages = [f"{host}:{port}" for host, port in zip(hosts, ports[1:])]
  servers = _start_stage_servers(client, stages)
  # Once: the calibration is the same on loopback hosts.
  times_stages_alone = hosts[0] == hosts[1]
  try:
    result = _run_client(client, stages, servers, times_stages_alone)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pipelined like the unsplit model" in result.stdout
    if times_stages_alone:
      assert "stages timed alone, the same training after" in result.stdout
    # The client gone, each stage server ends by itself, successfully.
    for server in servers:
      assert server.wait(timeout=30) == 0
  finally:
    processes.stop_processes(servers, grace_s=2)


def _run_client(client: str, stages: list, servers: list,
                times_stages_alone: bool):
  """This file run as the cluster's client, to its end; a stage server
  that dies first (its port taken before it bound it, say) fails the test
  at once, where the client would wait for the cluster until the timeout.

  Returns:
    The client's subprocess.CompletedProcess.
  """
  with tempfile.TemporaryFile("w+") as out, \
      tempfile.TemporaryFile("w+") as err:
    runner = subprocess.Popen(
        [sys.executable, "-m", "tests.tfoverlap.test_pipeline_processes",
         client, ",".join(stages), str(int(times_stages_alone))],
        cwd=REPO_ROOT, env=subprocess_env(), stdout=out, stderr=err,
        text=True)
    try:
      wait_until(lambda: runner.poll() is not None or any(
          server.poll() not in (None, 0) for server in servers),
                 "the client's end", timeout_s=TIMEOUT_S)
      dead = [server.returncode for server in servers
              if server.poll() not in (None, 0)]
      assert runner.poll() is not None or not dead, (
          f"a stage server exited {dead[0]} before the client ended")
    finally:
      processes.stop_processes([runner], grace_s=2)
    out.seek(0)
    err.seek(0)
    return subprocess.CompletedProcess(runner.args, runner.returncode,
                                       out.read(), err.read())


def _launch(model_dir, *flags) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "-m", "tfoverlap.launch", "--", *PIPELINE_FLAGS,
       "--model=mlp", "--batch_size=32", f"--model_dir={model_dir}",
       "--tensorboard=false", "--trace=false", *flags],
      cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


def _launched_record(model_dir, *flags) -> dict:
  """The run.json of a launched job that must succeed."""
  job = _launch(model_dir, *flags)
  _, err = job.communicate(timeout=TIMEOUT_S)
  assert job.returncode == 0, err[-3000:]
  with open(model_dir / "run.json", encoding="utf-8") as f:
    return json.load(f)


def test_launched_job_measures_each_stage_and_checkpoints_whole_model(
    tmp_path):
  job = _launch(tmp_path / "piped", "--train_steps=6", "--checkpoint=sync",
                "--checkpoint_every=6", "--evaluate=false",
                f"--reference_steps={REFERENCE_STEPS}")
  _, err = job.communicate(timeout=TIMEOUT_S)
  assert job.returncode == 0, err[-3000:]
  assert "listens on all interfaces" in err  # said, not hidden
  with open(tmp_path / "piped" / "run.json", encoding="utf-8") as f:
    record = json.load(f)
  section = record["pipeline"]
  assert section["runtime"] == "processes"
  assert section["sources"]["bubble"].startswith("measured")
  assert section["sources"]["stage_compute"].startswith("measured")
  # Each stage was timed alone first (the default --reference_steps), one
  # at a time: the mean stage's stage_compute beyond that is contention.
  assert "contention" in record["phases_derived"]
  assert "contention" not in record["phases_measured"]
  reference = record["strategy"]["reference_step"]
  assert [row["stage"] for row in reference["per_stage"]] == [0, 1]
  for row in reference["per_stage"]:
    assert len(row["step_ms"]) == REFERENCE_STEPS
    assert min(row["step_ms"]) > 0
    assert row["reference_ms"] == pytest.approx(
        statistics.median(row["step_ms"]))
  assert reference["reference_ms"] == pytest.approx(statistics.mean(
      row["reference_ms"] for row in reference["per_stage"]))
  # Transfer is not timed apart here (the ledger has no such phase);
  # contention is carved out of the mean stage's stage_compute.
  compute_span_ms = sum(1e3 * record["phases"][phase]["p50"]
                        for phase in ("stage_compute", "contention",
                                      "bubble"))
  for k, row in enumerate(section["per_stage"]):
    assert row["device"] == f"/job:worker/replica:0/task:{k}"
    # Forward and backward were stamped, not only the update.
    assert row["compute_ms"] > row["update_ms"] > 0
    assert row["bubble_ms"] > 0
    # Each stage's phases tile every step's span; their medians add up to
    # about the median span (medians of parts are not parts of the median).
    total_ms = row["compute_ms"] + row["bubble_ms"] + row["transfer_ms"]
    assert total_ms == pytest.approx(compute_span_ms, rel=0.25)
  # The checkpoint of variables that lived on the stage servers has the
  # files and tensor names of an unpipelined run's.
  train_here(model="mlp", batch_size="32", train_steps="6",
             checkpoint="sync", checkpoint_every="6", evaluate="false",
             trace="false", tensorboard="false", strategy="default",
             model_dir=str(tmp_path / "plain"))
  # --checkpoint=sync writes TensorFlow's own format: one data shard per
  # task that held variables, the same names.
  names = [sorted(tf.train.list_variables(
      str(tmp_path / run / "checkpoints" / "ckpt-6")))
           for run in ("piped", "plain")]
  assert any("model" in name for name, _ in names[0])
  assert names[0] == names[1]


def test_stages_apart_run_on_their_stand_ins_and_measure_their_waits(
    tmp_path):
  record = _launched_record(tmp_path / "apart", "--train_steps=6",
                            "--evaluate=false", "--pipeline_stages_apart",
                            f"--reference_steps={REFERENCE_STEPS}", *THREADS)
  section = record["pipeline"]
  assert section["stages_apart"] is True
  assert section["sources"]["bubble"].startswith("measured")
  for row in section["per_stage"]:
    # Each stage stamped its own forwards, backwards and update.
    assert row["compute_ms"] > row["update_ms"] > 0
  assert math.isfinite(record["final"]["train_loss"])
  # As the pipeline's, its stages' compute beyond each stage timed alone
  # is contention: the fidelity benchmark's bubble cell holds the change
  # in bubble and contention together against the saving.
  assert "contention" in record["phases_derived"]
  assert "contention" in record["phases"]


def test_steps_apart_in_alternate_blocks_are_each_halfs_own(tmp_path):
  # --paired_removal=pipeline_waits: blocks of 2 steps, with, without,
  # without, with, the steps without run apart on stand-ins made before
  # training, which the run keeps after its calibration.
  record = _launched_record(tmp_path / "paired", "--train_steps=8",
                            "--evaluate=false",
                            "--paired_removal=pipeline_waits",
                            "--paired_block_steps=2",
                            f"--reference_steps={REFERENCE_STEPS}", *THREADS)
  section = record["paired_removal"]
  assert section["cause"] == "pipeline_waits"
  for half in section["halves"].values():
    assert half["steps"] > 0
    # Both halves' stages were stamped: their waits are bubble, and
    # their compute beyond each stage timed alone is contention.
    assert half["phases_ms"]["bubble"] > 0
    assert "contention" in half["phases_ms"]
  assert math.isfinite(record["final"]["train_loss"])


def _stage_server_pid(launcher_pid: int, stage: int) -> int:
  for child in os.listdir("/proc"):
    if not child.isdigit():
      continue
    try:
      with open(f"/proc/{child}/stat", encoding="ascii") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{child}/environ", "rb") as f:
        env = f.read().split(b"\0")
    except OSError:
      continue
    if parent != launcher_pid:
      continue
    for entry in env:
      if entry.startswith(b"TF_CONFIG="):
        task = json.loads(entry[len(b"TF_CONFIG="):])["task"]
        if task == {"type": "worker", "index": stage}:
          return int(child)
  raise AssertionError(f"no stage {stage} server under {launcher_pid}")


def test_a_killed_stage_ends_the_job_with_one_line(tmp_path):
  # No stage timed alone first: what is tested starts after step 2.
  job = _launch(tmp_path / "killed", "--train_steps=100000",
                "--checkpoint=sync", "--checkpoint_every=2",
                "--evaluate=false", "--reference_steps=0")
  try:
    checkpoints = tmp_path / "killed" / "checkpoints"

    def saved_step_2() -> bool:
      assert job.poll() is None, job.stderr.read()[-3000:]
      return (checkpoints / "ckpt-2.index").is_file()

    # Progress, not time: the job has trained and saved step 2.
    wait_until(saved_step_2, "the job saving step 2", timeout_s=TIMEOUT_S)
    os.kill(_stage_server_pid(job.pid, 1), signal.SIGKILL)
    killed_s = time.monotonic()
    _, err = job.communicate(timeout=60)
    ended_s = time.monotonic() - killed_s
  finally:
    if job.poll() is None:
      job.kill()
  assert job.returncode != 0
  lines = [l for l in err.splitlines() if l.startswith("tfoverlap.launch:")
           and "warning" not in l]
  assert lines == ["tfoverlap.launch: stage 1 was killed by SIGKILL; "
                   "stopping the other 2 process(es)"], err[-3000:]
  assert "Traceback" not in err
  # Within the launcher's poll and its grace for the others, not a hang.
  assert ended_s < processes.STOP_GRACE_S + 10


def _train_in_step(model, runtime, loss_fn):
  """`test_pipeline._train`, its update inside the traced step as the
  trainer's: an update issued eagerly to a stage server is not ordered
  before the next step's reads of the same variables (seen: the third
  step read weights the second update had not yet written)."""
  # pylint: disable=g-import-not-at-top
  import keras
  import tensorflow as tf
  from tests.tfoverlap import test_pipeline as same

  optimizer = keras.optimizers.SGD(same.LEARNING_RATE)

  @tf.function
  def step(inputs, targets):
    loss, grads = runtime.forward_backward(inputs, targets, loss_fn)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss, grads

  losses, first_grads = [], None
  for inputs, targets in same._batches():
    loss, grads = step(inputs, targets)
    losses.append(float(loss))
    if first_grads is None:
      first_grads = [g.numpy() for g in grads]
  return losses, first_grads, [w.numpy() for w in model.weights]


def _client_main(client: str, stages: list,
                 times_stages_alone: bool) -> None:
  """The client of the equivalence test: the unsplit model's reference on
  this process, then the same steps through the stage servers (and with
  `times_stages_alone`, `_check_stages_alone`)."""
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import cluster
  from tfoverlap import pipeline, pipeline_processes, steps
  from tests.tfoverlap import test_pipeline as same

  pipeline_processes.connect_client(
      cluster.PipelineCluster(client=client, stages=tuple(stages),
                              role=cluster.PIPELINE_CLIENT, stage_index=0,
                              source="TF_CONFIG"),
      intra_op_threads=1, inter_op_threads=1)
  model = same._model("small_cnn")
  initial = model.get_weights()
  loss_fn = steps.make_pipeline_loss("classification", same.BATCH)
  expected = same._train(model, same._unsplit_step(model, loss_fn))
  model.set_weights(initial)
  cuts = pipeline.plan_cut_layers(model, same.CONFIG,
                                  batch_size=same.BATCH // MICROBATCHES)
  runtime = pipeline_processes.ProcessPipelineRuntime(
      model, cuts, num_microbatches=MICROBATCHES)
  # Each stage's weights live on its server.
  for k, stage in enumerate(runtime.stages):
    for variable in stage.variables:
      assert variable.value.device.startswith(
          f"/job:worker/replica:0/task:{k}/"), variable.value.device
  got = _train_in_step(model, runtime, loss_fn)
  same._assert_close(np.array(got[0]), np.array(expected[0]))
  for g, e in zip(got[1], expected[1]):
    same._assert_close(g, e)
  for g, e, start in zip(got[2], expected[2], initial):
    same._assert_moved_alike(g, e, start)
  print("pipelined like the unsplit model", flush=True)
  if times_stages_alone:
    _check_stages_alone(model, runtime, loss_fn)
    print("stages timed alone, the same training after", flush=True)


def _check_stages_alone(model, runtime, loss_fn) -> None:
  """Each stage timed alone, one at a time, with the run's own step
  (`reference_step.calibrate`), then two steps trained at once: bit for
  bit the two steps trained from the same state without the calibration.
  (At once: reading the variables first would wait for the put-back,
  which a run's first step does not.)"""
  # pylint: disable=g-import-not-at-top
  import keras
  from overlap_core.runtime import contention
  from tfoverlap import reference_step
  from tests.tfoverlap import test_pipeline as same

  # Momentum: the optimizer has slots for the calibration to disturb.
  optimizer = keras.optimizers.SGD(same.LEARNING_RATE, momentum=0.9)
  optimizer.build(model.trainable_variables)
  batches = same._batches()
  runtime.measure_stages(*batches[0], loss_fn)
  train_step = runtime.make_train_step(optimizer, loss_fn)
  variables = list(model.variables) + list(optimizer.variables)
  start = [v.numpy() for v in variables]

  def train_two_steps():
    losses = [float(train_step(batch)) for batch in batches[1:]]
    return losses, [v.numpy() for v in variables]

  reference = reference_step.calibrate(
      train_step, batches[0], model=model, optimizer=optimizer,
      num_steps=2, pipeline=runtime)
  runtime.release_stand_ins()
  after_calibration = train_two_steps()
  for variable, value in zip(variables, start):
    variable.assign(value)
    variable.numpy()  # waits for the assign on its stage server
  without = train_two_steps()
  assert after_calibration[0] == without[0]
  for got, expected in zip(after_calibration[1], without[1]):
    np.testing.assert_array_equal(got, expected)
  # The steps moved the weights: the comparison is of training.
  assert not all(np.array_equal(a, b) for a, b in zip(without[1], start))
  assert isinstance(reference, contention.StagesAlone)
  # One reference per stage, each from its own stamps: the busy time of
  # its forwards, backwards and update, with no neighbour in between.
  assert len(reference.stages) == runtime.num_stages
  for stage in reference.stages:
    assert len(stage.step_s) == 2 and min(stage.step_s) > 0


if __name__ == "__main__":
  _client_main(sys.argv[1], sys.argv[2].split(","), sys.argv[3] == "1")
