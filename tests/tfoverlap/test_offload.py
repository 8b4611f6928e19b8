"""TensorFlow CPU offload: each Conv/Dense input goes to the host and comes
back once per step, with the bytes counted, and training computes exactly
what it computes without offload (the layers recomputed in backward run
the same ops on the same values, so the results are bit-identical).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from overlap_core.runtime.config import OffloadConfig
from tfoverlap import distribute, offload

from tests.helpers import run_module
from tests.tfoverlap.executed_graphs import executed_functions
from tests.record_checks import (copied_ms, derived_offload_spans_us,
                                 offload_copy_spans_us)
from tests.tfoverlap.train_here import train_here

BATCH = 2


def _tiny_model():
  # Seeded initializers, not only the global seed: an unseeded initializer
  # draws its seed from process-wide state that tests run earlier in this
  # process can leave anywhere, and both runs must start from one model.
  inputs = keras.layers.Input((8, 8, 3))
  # Named: Keras numbers unnamed layers per process, whatever ran before.
  x = keras.layers.Conv2D(
      4, 3, padding="same", activation="relu", name="conv",
      kernel_initializer=keras.initializers.GlorotUniform(seed=1))(inputs)
  x = keras.layers.BatchNormalization()(x)
  x = keras.layers.Flatten()(x)
  return keras.Model(inputs, keras.layers.Dense(
      5, name="logits",
      kernel_initializer=keras.initializers.GlorotUniform(seed=2))(x))


def _make_step(model, optimizer):
  @tf.function
  def step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return step


def _batch(rng):
  return (rng.standard_normal((BATCH, 8, 8, 3)).astype("float32"),
          rng.integers(0, 5, BATCH))


def _train(config, num_steps=3, **offload_args):
  model = _tiny_model()
  offloader = (offload.apply_offload(model, config, **offload_args)
               if config else None)
  step = _make_step(model, keras.optimizers.SGD(0.1, momentum=0.9))
  rng = np.random.default_rng(1)
  for _ in range(num_steps):
    loss = step(*_batch(rng))
  return float(loss), [w.numpy() for w in model.weights], offloader


def test_weighted_layer_inputs_go_to_host_and_come_back():
  loss, weights, offloader = _train(OffloadConfig(("activations",)))
  summary = offloader.summary(num_steps=3)
  assert offloader.layer_names == ["conv", "logits"]
  # Per step: the Conv's input (8*8*3 floats per example) and the Dense
  # layer's (8*8*4); BatchNorm's input stays with TensorFlow's tape.
  per_step_bytes = BATCH * (8 * 8 * 3 + 8 * 8 * 4) * 4
  for direction in ("to_host", "to_device"):
    assert summary[direction]["tensors"] == 3 * 2
    assert summary[direction]["bytes"] == 3 * per_step_bytes
    # Each copy timed in the graph, one time per copy.
    assert summary[direction]["timed_copies"] == 3 * 2
    assert summary[direction]["copy_ms"]["min"] >= 0
  assert summary["copies_timed_with"] == "tf.timestamp"
  base_loss, base_weights, _ = _train(None)
  assert loss == base_loss
  for got, want in zip(weights, base_weights):
    np.testing.assert_array_equal(got, want)


def _ancestors(nodes: dict, name: str) -> set:
  """The nodes `name` waits for in a GraphDef: its data and control
  inputs, and theirs."""
  seen, todo = set(), [name]
  while todo:
    for source in nodes[todo.pop()].input:
      source = source.lstrip("^").split(":")[0]
      if source in nodes and source not in seen:
        seen.add(source)
        todo.append(source)
  return seen


def test_each_weight_update_waits_for_the_recomputations_read():
  # Backward reads an offloaded layer's weights again, to recompute it. The
  # weights' own gradients do not need that read, and Grappler's dependency
  # optimization dropped the control edge that ordered it before the
  # optimizer's update: about one offloaded step in 25 then computed the
  # input's gradient from updated weights. Checked in the graph TensorFlow
  # runs (the step's partition graph, after Grappler), not in the trace,
  # where that edge still stands.
  model = _tiny_model()
  offload.apply_offload(model, OffloadConfig(("activations",)),
                        time_copies=False)
  step = _make_step(model, keras.optimizers.SGD(0.1, momentum=0.9))
  batch = _batch(np.random.default_rng(1))
  updates = {op.name for op in step.get_concrete_function(
      *batch).graph.get_operations() if op.type == "AssignAddVariableOp"}
  # The step's function is the one whose trace holds the step's updates.
  (function,) = executed_functions(lambda: step(*batch), updates)
  checked = 0
  for partition in function.partition_graphs:
    nodes = {node.name: node for node in partition.node}
    for update in (n for n in partition.node
                   if n.op == "AssignAddVariableOp"):
      reads = [n.name for n in partition.node if n.op == "ReadVariableOp"
               and n.input[0] == update.input[0]]
      unordered = set(reads) - _ancestors(nodes, update.name)
      assert not unordered, (update.name, sorted(unordered))
      # A weight of an offloaded layer: read in forward and in backward.
      checked += len(reads) >= 2
  # Conv and Dense, kernel and bias.
  assert checked >= 4


def test_copy_times_become_the_offload_copy_phase():
  _, _, offloader = _train(OffloadConfig(("activations",)), num_steps=2)
  (copy, copy_start, copy_end), (compute, compute_start, compute_end) = (
      offloader.split_compute(10.0, 11.0))
  assert (copy, compute) == ("offload", "compute")
  assert copy_start == 10.0 and compute_end == 11.0
  summary = offloader.summary(num_steps=2)
  copied_s = sum(summary[d]["copy_ms"]["total"]
                 for d in ("to_host", "to_device")) / 1e3
  # The phase is the copies' time, the per-copy times add up to it.
  assert copy_end == compute_start == pytest.approx(10.0 + copied_s,
                                                   rel=1e-9, abs=1e-12)
  # Taken once: the next step starts from nothing.
  assert offloader.split_compute(12.0, 13.0)[0][2] == 12.0


def test_untimed_copies_are_counted_only():
  _, _, offloader = _train(OffloadConfig(("activations",)),
                           time_copies=False)
  summary = offloader.summary(num_steps=3)
  assert summary["to_device"]["tensors"] == 3 * 2
  assert summary["to_device"]["copy_ms"] is None
  assert summary["copies_timed_with"] is None


def _restore_devices(graph) -> dict:
  """{op name: device} of the restores (the copies back to the device)."""
  return {op.name: op.device for op in graph.get_operations()
          if op.type == "Identity" and "offload_to_device" in op.name}


def test_a_restore_is_placed_where_its_layer_computes(two_cpu_devices):
  # No strategy: inside a tf.function a tensor's device is unset, so the
  # restore goes where the layer's variables live.
  model = _tiny_model()
  offload.apply_offload(model, OffloadConfig(("activations",)))
  step = _make_step(model, keras.optimizers.SGD(0.1))
  graph = step.get_concrete_function(
      *_batch(np.random.default_rng(1))).graph
  devices = _restore_devices(graph)
  assert len(devices) == 2  # the Conv's input and the Dense layer's
  variable_device = model.get_layer("conv").kernel.value.device
  assert set(devices.values()) == {variable_device}
  # Two replicas: each restores onto its own device.
  strategy = distribute.mirrored_strategy(two_cpu_devices)
  with strategy.scope():
    model = _tiny_model()
    optimizer = keras.optimizers.SGD(0.1)
  offload.apply_offload(model, OffloadConfig(("activations",)),
                        num_replicas=2)
  replica_step = _make_step(model, optimizer).python_function

  @tf.function
  def step(images, labels):
    return strategy.run(replica_step, args=(images, labels))

  devices = _restore_devices(step.get_concrete_function(
      *_batch(np.random.default_rng(1))).graph)
  assert sorted(tf.DeviceSpec.from_string(d).device_index
                for d in devices.values()) == [0, 0, 1, 1]


def test_nothing_offloaded_installs_nothing():
  assert offload.apply_offload(_tiny_model(), OffloadConfig()) is None


def _run(capsys, model_dir, **flags):
  """Trains small_cnn 4 deterministic steps in this process, as
  tests.record_checks.run_small_cnn runs the command; (what it wrote to
  stderr, run.json).

  In this process, not the command: what is checked is what the trainer
  records, and each command would spend most of its time starting Python
  and TensorFlow.
  """
  capsys.readouterr()
  record = train_here(**{
      "model_dir": str(model_dir), "model": "small_cnn",
      "strategy": "default", "batch_size": "16", "train_steps": "4",
      "seed": "3", "deterministic": "true", "progress": "false", **flags})
  return capsys.readouterr().err, record


def test_trainer_records_offload_and_matches_the_plain_run(tmp_path, capsys):
  _, plain = _run(capsys, tmp_path / "plain")
  stderr, offloaded = _run(capsys, tmp_path / "offloaded",
                           offload="activations")
  assert plain["offload"] is None
  section = offloaded["offload"]
  assert section["offloaded_layers"] == ["conv1_1", "conv1_2", "conv2_1",
                                         "conv2_2", "fc1", "fc2"]
  # Counted before evaluation: one restore per save, 6 layers x 4 steps.
  assert section["to_host"]["tensors"] == section["to_device"]["tensors"] == 24
  assert section["to_host"]["bytes"] == section["to_device"]["bytes"] > 0
  assert offloaded["weights_digest"] == plain["weights_digest"]
  assert offloaded["final"] == plain["final"]
  assert stderr.count(offload.NO_GPU_NOTICE) == 1
  # Op determinism refuses tf.timestamp: the copies are counted, not
  # timed; the phase is still derived, from the step timed alone with and
  # without offload (whose calibration steps are not counted above).
  assert section["to_host"]["copy_ms"] is None
  assert any("not timed" in note for note in offloaded["notes"])
  derived_offload_spans_us(offloaded)


def test_no_step_timed_alone_leaves_offload_without_a_phase(tmp_path,
                                                            capsys):
  # Under op determinism, with no reference step, nothing times offload.
  _, record = _run(capsys, tmp_path, offload="activations",
                   reference_steps="0")
  assert record["offload"]["phase_from"] is None
  assert "offload" not in record["phases"]


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_trainer_times_copies_into_the_offload_copy_phase(
    tmp_path, capsys, steps_per_execution):
  # At 2 steps per call, each call's copy time is divided among its steps.
  # The step timed alone, which would derive the phase, is asked off.
  _, record = _run(capsys, tmp_path, offload="activations",
                   deterministic="false", reference_steps="0",
                   steps_per_execution=str(steps_per_execution))
  section = record["offload"]
  assert section["copies_timed_with"] == "tf.timestamp"
  for direction in ("to_host", "to_device"):
    # Counted as before, and now each copy timed.
    assert section[direction]["tensors"] == 24
    assert section[direction]["timed_copies"] == 24
    assert section[direction]["copy_ms"]["min"] >= 0
  spans_us = offload_copy_spans_us(record)
  # Each step's phase is its copies' time, or less where capped at the
  # compute span; the trace rounds each span to a nanosecond.
  assert sum(spans_us) / 1e3 <= copied_ms(section) + 1e-6 * len(spans_us)


@pytest.mark.parametrize("args, flag", [
    (["--offload=activations", "--offload_non_blocking"],
     "--offload_non_blocking=True"),
    (["--offload=activations", "--offload_prefetch"],
     "--offload_prefetch=True"),
    (["--offload=parameters"], "--offload=parameters"),
    (["--offload=activations", "--loop=fit"], "--loop=fit"),
])
def test_trainer_refuses_what_tensorflow_cannot_express(args, flag):
  result = run_module("tfoverlap.train", "--model=mlp", "--train_steps=1",
                      *args, timeout=120)
  assert result.returncode == 2, result.stderr
  # The last line: TensorFlow's own start-up logging may come before it.
  assert "Traceback" not in result.stderr
  assert flag in result.stderr.strip().splitlines()[-1], result.stderr
