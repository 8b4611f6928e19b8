"""TensorFlow pipeline stages on the 2 logical CPU devices conftest.py makes.

A 2-stage x 4-micro-batch GPipe step is compared with the unsplit model
trained on the same micro-batches; the traced step is read for where each
stage's convolutions, forward and backward, were placed; and the trainer
runs pipelined jobs whose checkpoints pipelined and unpipelined runs
resume.
"""

import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from overlap_core.runtime import pipeline_stats
from overlap_core.runtime.config import ConfigError, PipelineConfig
from tfoverlap import pipeline, steps
from tfoverlap.models import build_model

from tests.helpers import run_module
from tests.tfoverlap.executed_graphs import executed_functions
from tests.tfoverlap.train_here import train_here

IMAGE_SIZE = 32
BATCH = 8
MICROBATCHES = 4
# Three updates: each step's loss, the first step's gradients, and the
# weights and statistics after the last (later steps start from weights
# the pipelined updates made, so an error in an update carries forward).
STEPS = 3
LEARNING_RATE = 0.05
CONFIG = PipelineConfig(stages=2, microbatches=MICROBATCHES, split="even")
# float64 weights and activations: the pipelined and the unsplit step run
# the same kernels on the same values and differ only in summation order
# and in grappler's rewrites of two differently shaped graphs. But the
# zoo's last layer casts the logits to float32, so the loss and the
# gradient entering backward carry float32 rounding, ~1e-7 relative, and
# ResNet's last BatchNorms (2 values per channel: a micro-batch of 2 at 1x1
# pixels) amplify differences further; seen: 3e-7 relative on one weight
# near zero, 4e-8 of its tensor's largest value. So, as on the torch side,
# each tensor is compared at its own scale: rtol 1e-6 and atol 1e-6 x its
# largest magnitude. A real fault (a micro-batch lost, a stage's gradient
# not chained, gradients applied per micro-batch) changes results by
# percent of that scale.
RTOL = 1e-6
SCALE_ATOL = 1e-6
# After three steps ResNet's 2-value BatchNorms have amplified those
# differences step by step (the normalized pair is about +-1 whatever
# its values, and the gradient through it is 1 / their distance): seen,
# 7e-6 of the distance a tensor moved over the three steps, the same with
# a float64 loss, so summation order alone does it. VGG-16, without
# BatchNorm, stays within 1e-15. So the weights after the last step are
# held to how far each tensor moved: within 1e-4 of that distance, a
# margin of 15 over what was seen; a lost micro-batch (a quarter of a
# step's gradient) or an unchained stage changes the move by percent.
MOVED_ATOL = 1e-4


def _assert_close(got, want):
  scale = float(np.max(np.abs(want))) + 1e-12
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=SCALE_ATOL * scale)


def _assert_moved_alike(got, want, start):
  moved = float(np.max(np.abs(want - start))) + 1e-12
  np.testing.assert_allclose(got - start, want - start, rtol=0,
                             atol=MOVED_ATOL * moved)


def _model(name: str) -> keras.Model:
  keras.utils.set_random_seed(0)
  keras.config.set_dtype_policy("float64")
  try:
    model = build_model(name, image_size=IMAGE_SIZE, num_classes=10)
  finally:
    keras.config.set_dtype_policy("float32")
  # Dropout's masks come from a seed state that the split consumes in
  # another order; without dropout, the comparison is of arithmetic alone.
  for layer in model.layers:
    if isinstance(layer, keras.layers.Dropout):
      layer.rate = 0.0
  return model


def _batches():
  generator = np.random.default_rng(1)
  return [(tf.constant(generator.normal(size=(BATCH, IMAGE_SIZE, IMAGE_SIZE,
                                              3))),
           tf.constant(generator.integers(0, 10, size=(BATCH,)), tf.int32))
          for _ in range(STEPS)]


def _unsplit_step(model, loss_fn):
  """The reference: the whole model, one tape per micro-batch, summed."""

  @tf.function
  def step(inputs, targets):
    total, sums = 0.0, None
    for x, y in zip(tf.split(inputs, MICROBATCHES),
                    tf.split(targets, MICROBATCHES)):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      grads = tape.gradient(loss, model.trainable_variables)
      sums = grads if sums is None else [a + b for a, b in zip(sums, grads)]
      total += loss
    return total, sums

  return step


def _train(model, step):
  """STEPS SGD steps; the losses, the first gradients, the final weights."""
  optimizer = keras.optimizers.SGD(LEARNING_RATE)
  losses, first_grads = [], None
  for inputs, targets in _batches():
    loss, grads = step(inputs, targets)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    losses.append(float(loss))
    if first_grads is None:
      first_grads = [g.numpy() for g in grads]
  return losses, first_grads, [w.numpy() for w in model.weights]


def test_two_stages_train_like_the_unsplit_model(two_cpu_devices):
  # ResNet-18 has what VGG-16 would add (convolutions, pooling, a dense
  # head) and what it lacks (skip connections, BatchNorm statistics); a
  # plain stack's split is held to the unsplit model by the stage-process
  # test (small_cnn, test_pipeline_processes.py) and by PyTorch's
  # pipeline tests (VGG-16).
  model = _model("resnet18")
  initial = model.get_weights()
  loss_fn = steps.make_pipeline_loss("classification", BATCH)
  expected = _train(model, _unsplit_step(model, loss_fn))
  model.set_weights(initial)
  cuts = pipeline.plan_cut_layers(model, CONFIG,
                                  batch_size=BATCH // MICROBATCHES)
  runtime = pipeline.PipelineRuntime(model, cuts, devices=two_cpu_devices,
                                  num_microbatches=MICROBATCHES)
  got = _train(model, tf.function(
      lambda x, y: runtime.forward_backward(x, y, loss_fn)))
  _assert_close(np.array(got[0]), np.array(expected[0]))
  for g, e in zip(got[1], expected[1]):
    _assert_close(g, e)
  # Weights and BatchNorm statistics after the last update.
  for g, e, start in zip(got[2], expected[2], initial):
    _assert_moved_alike(g, e, start)
  # The stages hold the model's own variables, every one exactly once.
  stage_vars = [id(v) for s in runtime.stages for v in s.trainable_variables]
  assert sorted(stage_vars) == sorted(id(v)
                                      for v in model.trainable_variables)


def _device_index(op) -> int:
  spec = tf.DeviceSpec.from_string(op.device)
  assert spec.device_type == "CPU", op.device
  return spec.device_index


def test_each_stage_runs_forward_and_backward_on_its_own_device(
    two_cpu_devices):
  model = build_model("vgg16", image_size=IMAGE_SIZE, num_classes=10)
  cuts = pipeline.plan_cut_layers(model, CONFIG, batch_size=2)
  runtime = pipeline.PipelineRuntime(model, cuts, devices=two_cpu_devices,
                                  num_microbatches=MICROBATCHES)
  loss_fn = steps.make_pipeline_loss("classification", BATCH)
  step = runtime.make_train_step(keras.optimizers.SGD(0.01), loss_fn)
  spec = (tf.TensorSpec((BATCH, IMAGE_SIZE, IMAGE_SIZE, 3)),
          tf.TensorSpec((BATCH,), tf.int32))
  graph = step.get_concrete_function(spec).graph
  convs_per_stage = [
      sum(isinstance(model.get_layer(l), keras.layers.Conv2D) for l in layers)
      for layers in runtime.stage_layers()]
  assert all(convs_per_stage), convs_per_stage  # both stages have convs
  for op_type in ("Conv2D", "Conv2DBackpropFilter"):
    found = [0, 0]
    for op in graph.get_operations():
      if op.type == op_type:
        found[_device_index(op)] += 1
    # Every convolution of stage k, forward and weight gradient, once per
    # micro-batch, on device k and nowhere else.
    assert found == [MICROBATCHES * c for c in convs_per_stage], op_type

  # That is where the trace asked for them. Where they ran: TensorFlow
  # places the function's ops, rewrites them (grappler; oneDNN fuses a
  # convolution with its bias into _MklNativeFusedConv2D on this host)
  # and cuts the result into one partition graph per device, which that
  # device's executor runs. (Per-op step stats, which would time each
  # kernel, stay empty for eager functions outside the profiler.) The
  # step's own function is the one whose graph before optimization holds
  # the traced step's weight-gradient ops, by name.
  step_gradients = {op.name for op in graph.get_operations()
                    if op.type == "Conv2DBackpropFilter"}
  ran = {"forward": [0, 0], "weight gradient": [0, 0]}
  for function in executed_functions(
      lambda: step((tf.random.normal((BATCH, IMAGE_SIZE, IMAGE_SIZE, 3)),
                    tf.zeros((BATCH,), tf.int32))), step_gradients):
    for partition in function.partition_graphs:
      for node in partition.node:
        kind = ("weight gradient" if "Conv2DBackpropFilter" in node.op
                else "forward" if ("Conv2D" in node.op and
                                   "Backprop" not in node.op) else None)
        if kind:
          ran[kind][tf.DeviceSpec.from_string(node.device).device_index] += 1
  for kind, found in ran.items():
    assert found == [MICROBATCHES * c for c in convs_per_stage], (kind, ran)


def test_stage_models_share_the_models_layers_and_refuse_a_non_cut():
  model = build_model("resnet18", image_size=IMAGE_SIZE, num_classes=10)
  first, second = pipeline.build_stages(model, ["layer2_1_out"])
  assert first.get_layer("conv1") is model.get_layer("conv1")
  assert second.get_layer("fc") is model.get_layer("fc")
  x = tf.random.normal((2, IMAGE_SIZE, IMAGE_SIZE, 3))
  np.testing.assert_allclose(second(first(x)), model(x), rtol=1e-5,
                             atol=1e-5)  # float32: the same ops, in order
  with pytest.raises(ValueError, match="not cut points"):
    pipeline.build_stages(model, ["layer2_1_conv1"])
  with pytest.raises(ConfigError, match="--pipeline_split=auto"):
    pipeline.plan_cut_layers(model, PipelineConfig(stages=2), batch_size=2)


def test_measurements_partition_the_compute_span(two_cpu_devices):
  model = build_model("small_cnn", image_size=16, num_classes=10)
  cuts = pipeline.plan_cut_layers(model, CONFIG, batch_size=2)
  runtime = pipeline.PipelineRuntime(model, cuts, devices=two_cpu_devices,
                                  num_microbatches=MICROBATCHES)
  loss_fn = steps.make_pipeline_loss("classification", BATCH)
  inputs, targets = steps.example_batch(model, "classification", BATCH)
  # An optimizer with state of its own (a step count, momentum slots) that
  # an update would change.
  optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  optimizer.build(model.trainable_variables)
  optimizer.iterations.assign(5)
  for slot in optimizer.variables:
    if slot.path.endswith("_momentum"):
      slot.assign(tf.fill(slot.shape, 0.5))
  before = [v.numpy() for v in model.weights + optimizer.variables]
  runtime.measure_stages(inputs, targets, loss_fn, optimizer=optimizer,
                         repeats=1)
  for old, new in zip(before, model.weights + optimizer.variables):
    np.testing.assert_array_equal(old, new.numpy())
  compute_s, transfer_s = runtime.stage_seconds()
  update_s = runtime.update_seconds()
  assert len(compute_s) == 2 and all(s > 0 for s in compute_s)
  # Each stage's update is timed and counted in its compute, as PyTorch
  # counts optimizer.step() in stage_compute.
  assert len(update_s) == 2 and all(0 < u < c
                                    for u, c in zip(update_s, compute_s))
  span_end = 10.0 + sum(compute_s) + sum(transfer_s)  # a span they fit in
  parts = runtime.record_step(10.0, span_end)
  assert [p for p, _, _ in parts] == [pipeline_stats.STAGE_COMPUTE,
                                      pipeline_stats.TRANSFER,
                                      pipeline_stats.BUBBLE]
  assert parts[0][1] == 10.0 and parts[-1][2] == span_end
  assert all(a[2] == b[1] for a, b in zip(parts, parts[1:]))
  section = runtime.describe(CONFIG)
  assert section["bubble_fraction_theory"] == pytest.approx(1 / 5)
  rows = section["per_stage"]
  assert [s["device"] for s in rows] == two_cpu_devices
  assert rows[0]["predicted_ms"] is None  # no profile
  for row, compute, update in zip(rows, compute_s, update_s):
    assert row["compute_ms"] == pytest.approx(1e3 * compute)
    assert row["update_ms"] == pytest.approx(1e3 * update)
  assert "derived" in section["sources"]["bubble"]
  assert "update" in section["sources"][pipeline_stats.UPDATE]


def _checkpoint_files(ckpt) -> dict:
  """{relative path: None, or a safetensors file's tensor names}."""
  files = {}
  for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
    names = None
    if path.suffix == ".safetensors":
      with open(path, "rb") as f:
        # The format's header: its length (8 bytes, little-endian), then
        # JSON naming every tensor.
        header = f.read(int.from_bytes(f.read(8), "little"))
      names = sorted(k for k in json.loads(header) if k != "__metadata__")
    files[str(path.relative_to(ckpt))] = names
  return files


def test_pipelined_checkpoints_are_unpipelined_ones(tmp_path):
  """Same engine, same files: a pipelined checkpoint has the files and
  tensors of an unpipelined one; a pipelined run resumes from it to
  exactly the weights of a run never stopped, and so does an unpipelined
  run."""
  common = {"model": "small_cnn", "image_size": "8", "batch_size": "16",
            "checkpoint": "async", "checkpoint_every": "2",
            "deterministic": "true", "evaluate": "false", "trace": "false",
            "tensorboard": "false"}
  piped_flags = {"strategy": "mirrored", "num_devices": "2",
                 "pipeline_stages": "2", "pipeline_microbatches": "4",
                 "pipeline_split": "even"}

  def train(model_dir, steps, **flags):
    return train_here(**common, train_steps=str(steps),
                       model_dir=str(model_dir), **flags)

  whole_dir = tmp_path / "piped"
  whole = train(whole_dir, 4, **piped_flags)
  section = whole["pipeline"]
  assert section["stages"] == 2 and section["micro_batches"] == 4
  assert whole["phases"][pipeline_stats.STAGE_COMPUTE]["total"] > 0
  assert whole["phases"]["compute"]["total"] == 0  # replaced by the three
  ckpt = whole_dir / "checkpoints" / "ckpt-0000000004"
  with open(ckpt / "state.json", encoding="utf-8") as f:
    assert json.load(f)["step"] == 4

  plain_dir = tmp_path / "plain"
  train(plain_dir, 4, strategy="default")
  piped_files = _checkpoint_files(ckpt)
  assert "model.safetensors" in piped_files
  assert piped_files == _checkpoint_files(
      plain_dir / "checkpoints" / "ckpt-0000000004")

  # Stopped after step 2 and resumed, pipelined both times. The whole
  # run's step-2 checkpoint is the one a run stopped there leaves (the same
  # flags, deterministic), so a copy without the later checkpoint is that
  # stopped run's directory.
  stopped_dir = tmp_path / "stopped"
  shutil.copytree(whole_dir, stopped_dir)
  shutil.rmtree(stopped_dir / "checkpoints" / "ckpt-0000000004")
  assert (stopped_dir / "checkpoints" / "ckpt-0000000002").is_dir()
  resumed = train(stopped_dir, 4, **piped_flags)
  assert resumed["checkpoint"]["restore"]["step"] == 2
  assert resumed["pipeline"]["stages"] == 2
  assert resumed["weights_digest"] == whole["weights_digest"]

  unpiped = train(whole_dir, 4, strategy="default")
  assert unpiped["pipeline"] is None
  assert unpiped["checkpoint"]["restore"]["step"] == 4
  assert unpiped["weights_digest"] == whole["weights_digest"]


def test_auto_split_from_a_profile_puts_predictions_beside_measurements(
    tmp_path, capsys):
  """--plan_profile with --pipeline_split=auto: the trainer splits by the
  profile's cost model and run.json shows each stage's predicted time."""
  job = {"model": "small_cnn", "image_size": "8", "batch_size": "16",
         "strategy": "mirrored", "num_devices": "2", "pipeline_stages": "2",
         "pipeline_microbatches": "4"}
  # The profile the planning command writes for this job (the command: it
  # sets the threads it times layers on, which only a fresh process can).
  # The trainer reads its layer graph at the micro-batch, 16 / 4 = 4; the
  # profile brackets it so the cost model interpolates.
  planned = run_module("tfoverlap.plan",
                       *(f"--{name}={value}" for name, value in job.items()),
                       "--plan_batch_sizes=2,4,8",
                       "--plan_warmup=1", "--plan_repeats=1",
                       f"--plan_output_dir={tmp_path / 'plan'}", timeout=600)
  assert planned.returncode == 0, planned.stderr[-4000:]
  profile_path = tmp_path / "plan" / "profile.json"

  capsys.readouterr()
  section = train_here(**job, train_steps="2", evaluate="false",
                        trace="false", tensorboard="false",
                        pipeline_split="auto", plan_profile=str(profile_path),
                        model_dir=str(tmp_path / "run"))["pipeline"]
  assert not [l for l in capsys.readouterr().err.splitlines()
              if l.startswith("pipeline: warning:")]
  assert section["split"] == "auto" and len(section["cut_layers"]) == 1
  for row in section["per_stage"]:
    assert row["predicted_ms"] > 0 and row["predicted_memory_mb"] > 0, row
    assert row["compute_ms"] > 0, row
    # The update is timed and predicted inside the stage's compute.
    assert row["predicted_update_ms"] is not None, row
    assert 0 < row["update_ms"] < row["compute_ms"], row
  # A profile PyTorch's planning command wrote is taken the same way, with
  # one line: tests/overlap_core/planning/test_round_trip.py runs that path.


def test_stages_apart_compute_on_what_crossed_and_not_on_their_neighbour(
    two_cpu_devices):
  # The MLP: what is checked is which tensors each stage computes on, not
  # the layers' arithmetic, which the tests above hold VGG and ResNet to.
  model = _model("mlp")
  loss_fn = steps.make_pipeline_loss("classification", BATCH)
  cuts = pipeline.plan_cut_layers(model, CONFIG,
                                  batch_size=BATCH // MICROBATCHES)
  runtime = pipeline.PipelineRuntime(model, cuts, devices=two_cpu_devices,
                                     num_microbatches=MICROBATCHES)
  (inputs, targets), (other_inputs, _) = _batches()[:2]
  weights = [w.numpy() for w in model.weights]
  stand_ins = pipeline.make_stand_ins(runtime, inputs, targets, loss_fn)
  for got, want in zip(model.weights, weights):
    np.testing.assert_array_equal(got.numpy(), want)  # nothing trained
  real_loss, real_grads = tf.function(
      lambda x, y: runtime.forward_backward(x, y, loss_fn))(inputs, targets)
  apart = tf.function(lambda x, y: runtime.forward_backward(
      x, y, loss_fn, stand_ins=stand_ins))
  # On the batch they were taken from, the stages apart compute what the
  # pipeline does: the stand-ins are what crossed each cut.
  loss, grads = apart(inputs, targets)
  _assert_close(loss.numpy(), real_loss.numpy())
  for g, e in zip(grads, real_grads):
    _assert_close(g.numpy(), e.numpy())
  # On other inputs the last stage computes as before: its input is the
  # stand-in, not the first stage's output, which changed.
  last = {id(v) for v in runtime.stages[-1].trainable_variables}
  other_loss, other_grads = apart(other_inputs, targets)
  _assert_close(other_loss.numpy(), real_loss.numpy())
  changed = []
  for v, g, e in zip(model.trainable_variables, other_grads, real_grads):
    if id(v) in last:
      _assert_close(g.numpy(), e.numpy())
    else:
      changed.append(not np.allclose(g.numpy(), e.numpy()))
  assert any(changed)  # the first stage did see the other inputs
