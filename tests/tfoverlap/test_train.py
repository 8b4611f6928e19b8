"""The TensorFlow trainer end to end: real training, real files."""

import dataclasses
import glob
import math
import os
import statistics

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

import flags as tfo_flags
from tfoverlap import data, models, steps, trainer
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import run_record
from overlap_core.runtime import trace

from tests.helpers import REPO_ROOT, run_error_line, run_module
from tests.record_checks import check_trace_median_is_the_records
from tests.tfoverlap.train_here import train_here

tfo_flags.define_flags()
QUICK = ["--log_every_steps=10"]
DIGITS_TRAIN = 1437
# Long enough that no job of a test-owned tf.data service is collected
# while the test still looks at it.
NO_JOB_GC_MS = 3_600_000


def config_of(*args):
  """The TrainConfig the trainer builds from these command-line arguments."""
  with flagsaver.flagsaver():
    tfo_flags.FLAGS.unparse_flags()
    tfo_flags.FLAGS(["tfoverlap.train", *args])
    return tfo_flags.to_config()


def psnr_db(predicted, target) -> np.ndarray:
  """Per-image PSNR of [0, 1] images, as the trainer's evaluation has it."""
  squared = np.mean(np.square(np.asarray(target) - np.asarray(predicted)),
                    axis=(1, 2, 3))
  return -10.0 * np.log(squared + 1e-10) / math.log(10.0)


def train(tmp_path, *args, timeout=600):
  model_dir = tmp_path / "run"
  result = run_module("tfoverlap.train", f"--model_dir={model_dir}", *QUICK,
                      *args, timeout=timeout)
  assert result.returncode == 0, result.stderr[-4000:]
  return result, run_record.load_run_record(str(model_dir)), model_dir


def _readme_main_job_flags() -> list:
  """The flags of the README's main-job command, after the trainer's name."""
  with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
    for line in f:
      if "pip install . && python -m tfoverlap.train" in line:
        return line.split("python -m tfoverlap.train", 1)[1].split()
  raise AssertionError("README.md has no main-job command")


def test_main_job_learns_digits_and_reports(tmp_path):
  # The main job exactly as the README runs it, and where to write.
  result = run_module("tfoverlap.train", *_readme_main_job_flags(),
                      f"--model_dir={tmp_path}", timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  record = run_record.load_run_record(str(tmp_path))
  assert record["final"]["eval_accuracy"] >= 0.90
  assert record["final"]["eval_examples"] == 360
  assert record["steps_per_execution"] == 8
  assert record["flags"]["data"]["cache"]
  assert record["flags"]["data"]["prefetch"] != 0
  # The data wait was timed, so the verdict could judge it.
  assert "data_wait" in record["phases_measured"]
  assert "data_wait" not in record["verdict"]["unmeasured"]
  assert "Per-step breakdown" in result.stdout
  for phase in ("data_wait", "compute", "checkpoint_stall", "step"):
    assert phase in result.stdout
  assert "step 300/300" in result.stdout  # progress was shown


# One single-device run and one mirrored run of the same training, shared:
# the record's claims are read on the first, the comparison uses both.
MIRRORED_COMMON = ["--model=mlp", "--train_steps=25", "--batch_size=32",
                   "--deterministic", "--shuffle_buffer=0",
                   "--learning_rate=0.01"]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
  """(record, model_dir) of the single-device run, trace and TensorBoard
  on (neither changes what it computes)."""
  _, record, model_dir = train(tmp_path_factory.mktemp("single"),
                               *MIRRORED_COMMON, "--strategy=default")
  return record, model_dir


def test_run_record_and_trace_hold_what_they_claim(single_run):
  record, model_dir = single_run
  assert record["schema_version"] == run_record.SCHEMA_VERSION
  assert record["framework"] == "tensorflow"
  assert record["flags"]["model"]["name"] == "mlp"
  assert record["flags"]["run"]["model_dir"] == str(model_dir)
  env = record["environment"]
  assert env["tensorflow"] == tf.__version__
  assert any("CPU:0" in d for d in env["devices"])
  expected_params = models.num_params(
      models.build_model("mlp", image_size=16, num_classes=10))
  assert record["model"]["num_params"] == expected_params
  assert record["steps"] == 25
  assert record["warmup_steps"] + record["measured_steps"] == 25
  assert record["samples_per_second"] > 0
  for phase in ("data_wait", "compute", "checkpoint_stall", "step", "other"):
    stats = record["phases"][phase]
    assert {"mean", "p50", "p95", "total", "fraction"} <= set(stats)
    assert stats["p50"] <= stats["p95"] + 1e-12
  # CPU beside wall time: the timed phases and the step have it, and the
  # step's work (its process tree) is at least the training thread's.
  for phase in ("data_wait", "compute", "step"):
    assert record["phases"][phase]["thread_cpu_mean"] >= 0
  step = record["phases"]["step"]
  assert step["cpu_mean"] >= step["thread_cpu_mean"] > 0
  assert record["phases"]["compute"]["cpu_mean"] > 0
  cpu = record["cpu"]
  assert cpu["work_s_per_step"] == step["cpu_mean"]
  assert cpu["work_bound_s"] == pytest.approx(
      cpu["work_s_per_step"] / cpu["cores"])
  assert record["phases"]["compute"]["mean"] > 0
  assert record["phases"]["checkpoint_stall"]["total"] == 0
  assert 0 <= record["final"]["eval_accuracy"] <= 1
  assert record["final"]["train_loss"] > 0
  assert len(record["weights_digest"]) == 64

  events = trace.load_trace(record["outputs"]["trace"])["traceEvents"]
  step_events = [e for e in events if e.get("name") == "step"]
  assert [e["args"]["step"] for e in step_events] == list(range(1, 26))
  check_trace_median_is_the_records(record, "compute")

  event_files = glob.glob(os.path.join(record["outputs"]["tensorboard"],
                                       "events.out.tfevents.*"))
  assert event_files
  tags = set()
  for event in tf.compat.v1.train.summary_iterator(event_files[0]):
    tags.update(v.tag for v in event.summary.value)
  assert {"loss", "steps/samples_per_second",
          "steps/data_wait_fraction"} <= tags


def test_mirrored_matches_single_device_at_same_global_batch(tmp_path,
                                                            single_run):
  single, _ = single_run
  _, mirrored, _ = train(tmp_path / "mirrored", *MIRRORED_COMMON,
                         "--trace=false", "--tensorboard=false",
                         "--strategy=mirrored", "--num_devices=2")
  assert mirrored["strategy"]["num_replicas"] == 2
  assert single["strategy"]["num_replicas"] == 1
  # The same losses although the mirrored run first timed its step without
  # the all-reduce, which parts the replicas: the derivation restores them.
  for key in ("train_loss", "eval_loss", "eval_accuracy"):
    assert mirrored["final"][key] == pytest.approx(single["final"][key],
                                                   rel=1e-4, abs=1e-5), key
  # Its exposed all-reduce is derived, said so, and carried as a phase; one
  # replica has none to derive. Both derive their contention from the step
  # timed alone first, which the losses above show put everything back.
  assert mirrored["phases_derived"] == [ledger_lib.EXPOSED_COMM,
                                        ledger_lib.CONTENTION]
  assert ledger_lib.EXPOSED_COMM not in mirrored["phases_measured"]
  derivation = mirrored["strategy"][ledger_lib.EXPOSED_COMM]
  assert derivation["num_pairs"] == len(derivation["local_step_ms"]) > 0
  assert mirrored["phases"][ledger_lib.EXPOSED_COMM]["mean"] >= 0.0
  assert single["phases_derived"] == [ledger_lib.CONTENTION]
  assert ledger_lib.EXPOSED_COMM not in single["phases"]
  for record in (single, mirrored):
    reference = record["strategy"]["reference_step"]
    assert (len(reference["step_ms"]) == len(reference["later_step_ms"]) ==
            record["flags"]["run"]["reference_steps"] > 0)
    # Timed before the loop and after it: the lower median.
    assert reference["reference_ms"] == pytest.approx(min(
        statistics.median(reference["step_ms"]),
        statistics.median(reference["later_step_ms"])))
    phases = record["phases"]
    assert phases[ledger_lib.CONTENTION]["mean"] >= 0.0
    parts = sum(phases[p]["mean"] for p in phases if p != ledger_lib.STEP)
    assert parts == pytest.approx(phases[ledger_lib.STEP]["mean"], rel=1e-6)


def test_fit_loop_feeds_the_same_ledger(tmp_path):
  # The MLP is enough to show fit trains: it reached 0.96 in these 40 steps.
  _, record, _ = train(tmp_path, "--loop=fit", "--train_steps=40",
                       "--model=mlp")
  assert record["steps"] == 40
  assert "data_wait" not in record["phases_measured"]
  assert record["phases"]["compute"]["mean"] > 0
  assert record["final"]["eval_accuracy"] > 0.5
  assert any("model.fit" in note for note in record["notes"])


# EDSR x2 on the digits at their own 8x8 (low resolution 4x4): the fair
# small setting where a few dozen steps must beat bicubic upsampling. On
# --dataset=synthetic (i.i.d. noise) the best any model can do is
# nearest-neighbour, only 0.2 dB above bicubic, and 100 steps did not get
# there; on digits 40 steps reached 15.4-15.6 dB over seeds 0-2 against
# bicubic's 13.4. A model that ignores its input can at best output the mean
# training digit (11.5 dB, checked below), so beating bicubic takes having
# learned to upsample.
SR_ARGS = ["--model=edsr", "--dataset=digits", "--image_size=8",
           "--batch_size=16", "--strategy=default"]


def test_super_resolution_beats_bicubic_upsampling(tmp_path):
  _, record, _ = train(tmp_path, *SR_ARGS, "--train_steps=40",
                       "--trace=false", "--tensorboard=false")
  assert "eval_accuracy" not in record["final"]
  cfg = config_of(*SR_ARGS).data
  low_res, high_res = (np.concatenate(parts) for parts in zip(*(
      (low.numpy(), high.numpy()) for low, high in data.make_input_fn(
          cfg, split="eval", task="super_resolution", seed=0, upscale=2)(
              None))))
  assert record["final"]["eval_examples"] == len(high_res) == 360
  bicubic_db = psnr_db(tf.image.resize(low_res, high_res.shape[1:3],
                                       method="bicubic"), high_res).mean()
  train_high_res = next(iter(data.make_input_fn(
      dataclasses.replace(cfg, batch_size=DIGITS_TRAIN, shuffle_buffer=0),
      split="train", task="super_resolution", seed=0, upscale=2)(None)))[1]
  mean_image = np.broadcast_to(np.mean(train_high_res, axis=0),
                               high_res.shape)
  assert psnr_db(mean_image, high_res).mean() < bicubic_db
  assert record["final"]["eval_psnr_db"] > bicubic_db


@pytest.mark.parametrize("args, words", [
    (["--strategy=horovod"], ["--strategy=horovod", "TensorFlow 2.21"]),
    (["--all_reduce=nccl"], ["--all_reduce=nccl", "GPU"]),
    (["--strategy=mirrored", "--all_reduce=ring"], ["--all_reduce=ring"]),
    (["--strategy=default", "--all_reduce_pack_mb=4"],
     ["--all_reduce_pack_mb=4"]),
    (["--strategy=multi_worker", "--num_workers=2", "--batch_size=64"],
     ["tfoverlap.launch"]),
    (["--steps_per_execution=2", "--pipeline_stages=2",
      "--pipeline_microbatches=2", "--pipeline_split=even",
      "--num_devices=2"],
     ["--steps_per_execution=2", "pipelined"]),
    (["--steps_per_execution=2", "--loop=fit", "--strategy=mirrored"],
     ["--steps_per_execution=2", "keras-team/keras#19246", "--loop=ctl"]),
])
def test_settings_the_framework_cannot_honour_exit_2(tmp_path, args, words):
  result = run_module("tfoverlap.train", f"--model_dir={tmp_path}", *args,
                      timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert "Traceback" not in result.stderr
  for word in words:
    assert word in last


def test_missing_tfds_dataset_is_one_line(tmp_path):
  result = run_module("tfoverlap.train", "--dataset=tfds",
                      f"--data_dir={tmp_path}", "--tfds_name=mnist",
                      f"--model_dir={tmp_path / 'run'}", timeout=300)
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert "mnist" in result.stderr.strip().splitlines()[-1]


def test_unwritable_model_dir_is_one_line(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  result = run_module("tfoverlap.train", "--model=mlp", "--train_steps=2",
                      f"--model_dir={blocker / 'run'}", timeout=300)
  assert "run" in run_error_line(result, "tfoverlap.train")


# What each knob does is tested by its effect in test_data.py (and the data
# service below); here each only has to run through the whole trainer and
# land in run.json. Knobs that combine share a run; --prefetch=0 and
# --prefetch=3, and the digits' pipeline and --synthetic_on_device, cannot.
# The runs train in this process, but the one whose trainer starts a local
# tf.data service, which runs as the command does: the service's servers
# would outlive the run in a test process.
def _echoes(record, echoed):
  assert record["steps"] == 8
  for key, value in echoed.items():
    recorded = record["flags"]["data"][key]
    if isinstance(value, str):
      assert recorded.startswith(value), recorded
    else:
      assert recorded == value


@pytest.mark.parametrize("flags, echoed", [
    (dict(prefetch="3", prefetch_to_device="true", cache="true",
          shuffle_buffer="0", preprocess_cost_ms="0.5"),
     {"prefetch": 3, "prefetch_to_device": True, "cache": True,
      "preprocess_cost_ms": 0.5}),
    (dict(dataset="synthetic", synthetic_on_device="true"),
     {"synthetic_on_device": True}),
])
def test_every_input_knob_runs_through_the_trainer(tmp_path, flags, echoed):
  _echoes(train_here(model_dir=str(tmp_path / "run"), model="mlp",
                     train_steps="8", evaluate="false",
                     log_every_steps="10", **flags), echoed)


def test_a_local_data_service_runs_through_the_trainer(tmp_path):
  _, record, _ = train(tmp_path, "--model=mlp", "--train_steps=8",
                       "--evaluate=false", "--data_service=local",
                       "--prefetch=0", "--map_parallelism=1")
  _echoes(record, {"data_service": "grpc://localhost:", "prefetch": 0,
                   "map_parallelism": 1})


def test_data_service_address_feeds_the_trainer_through_that_service(
    tmp_path):
  # The service runs in this process, so its worker can be asked what it
  # served. TF 2.21 gives a dispatcher no statistics, and a worker one, a
  # private one: its task count. Each job a consumer reads becomes a task
  # on every worker; a trainer that ignored the address would leave none.
  service = tf.data.experimental.service
  dispatcher = service.DispatchServer(service.DispatcherConfig(
      port=0, job_gc_check_interval_ms=NO_JOB_GC_MS,
      job_gc_timeout_ms=NO_JOB_GC_MS))
  worker = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher.target.split("://", 1)[1]))
  try:
    assert worker._num_tasks() == 0  # pylint: disable=protected-access
    _, record, _ = train(tmp_path, "--model=mlp", "--train_steps=8",
                         "--evaluate=false", "--strategy=default",
                         f"--data_service={dispatcher.target}")
    assert record["steps"] == 8
    assert record["flags"]["data"]["data_service"] == dispatcher.target
    # The training job, never finished (the stream repeats) and never
    # collected, is still this worker's task after the trainer has gone.
    assert worker._num_tasks() >= 1  # pylint: disable=protected-access
  finally:
    worker._stop()  # pylint: disable=protected-access
    dispatcher._stop()  # pylint: disable=protected-access


@pytest.fixture
def float32_after():
  """Restores Keras' float32 policy after a test that builds under another."""
  yield
  keras.mixed_precision.set_global_policy("float32")
  keras.backend.clear_session()


MATH_OPS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
            "MatMul")


@pytest.mark.parametrize("precision, compute_dtype", [
    ("float32", tf.float32), ("mixed_float16", tf.float16),
    ("mixed_bfloat16", tf.bfloat16)])
def test_precision_sets_the_dtype_the_train_step_computes_in(
    float32_after, precision, compute_dtype):
  del float32_after
  config = config_of("--model=small_cnn", "--strategy=default",
                     "--batch_size=8", f"--precision={precision}")
  strategy = tf.distribute.get_strategy()
  # The trainer's own builder: it applies the precision policy.
  built = trainer._build_model_and_optimizer(  # pylint: disable=protected-access
      strategy, config, num_classes=10, channels=3)
  model, optimizer = built.model, built.optimizer
  train_step = steps.make_train_step(model, optimizer, strategy,
                                     task="classification",
                                     global_batch_size=8)
  batch = (tf.random.uniform([8, 16, 16, 3]), tf.zeros([8], tf.int32))
  graph = train_step.get_concrete_function(batch).graph
  math_dtypes = {(op.type, tf.as_dtype(op.get_attr("T")))
                 for op in graph.get_operations() if op.type in MATH_OPS}
  # Every convolution and matmul, forward and backward, outputs the compute
  # dtype; none is left in float32 under a mixed policy.
  assert math_dtypes == {(op, compute_dtype) for op in MATH_OPS}
  before = [v.numpy().copy() for v in model.trainable_variables]
  loss = float(train_step(batch))
  assert np.isfinite(loss)
  # The weights stay float32 and the step moved them.
  assert {v.dtype for v in model.trainable_variables} == {"float32"}
  assert not all(np.array_equal(v.numpy(), old) for v, old in
                 zip(model.trainable_variables, before))
