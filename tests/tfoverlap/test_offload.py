"""TensorFlow CPU offload: each Conv/Dense input goes to the host and comes
back once per step, with the bytes counted, and training computes exactly
what it computes without offload (the layers recomputed in backward run
the same ops on the same values, so the results are bit-identical).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from overlap_core.runtime import run_record
from overlap_core.runtime.config import OffloadConfig
from tfoverlap import offload

from tests.helpers import run_module

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


def _train(config, num_steps=3):
  model = _tiny_model()
  offloader = offload.apply_offload(model, config) if config else None
  optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  rng = np.random.default_rng(1)

  @tf.function
  def step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  for _ in range(num_steps):
    loss = step(rng.standard_normal((BATCH, 8, 8, 3)).astype("float32"),
                rng.integers(0, 5, BATCH))
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
    assert summary[direction]["copy_ms"] is None  # inside the graph
  base_loss, base_weights, _ = _train(None)
  assert loss == base_loss
  for got, want in zip(weights, base_weights):
    np.testing.assert_array_equal(got, want)


def test_nothing_offloaded_installs_nothing():
  assert offload.apply_offload(_tiny_model(), OffloadConfig()) is None


def _run(tmp_path, name, *args):
  model_dir = tmp_path / name
  result = run_module("tfoverlap.train", f"--model_dir={model_dir}",
                      "--model=small_cnn", "--strategy=default",
                      "--batch_size=16", "--train_steps=4", "--seed=3",
                      "--deterministic", "--progress=false", *args,
                      timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return result, run_record.load_run_record(str(model_dir))


def test_trainer_records_offload_and_matches_the_plain_run(tmp_path):
  _, plain = _run(tmp_path, "plain")
  result, offloaded = _run(tmp_path, "offloaded", "--offload=activations")
  assert plain["offload"] is None
  section = offloaded["offload"]
  assert section["offloaded_layers"] == ["conv1_1", "conv1_2", "conv2_1",
                                         "conv2_2", "fc1", "fc2"]
  # Counted before evaluation: one restore per save, 6 layers x 4 steps.
  assert section["to_host"]["tensors"] == section["to_device"]["tensors"] == 24
  assert section["to_host"]["bytes"] == section["to_device"]["bytes"] > 0
  assert offloaded["weights_digest"] == plain["weights_digest"]
  assert offloaded["final"] == plain["final"]
  assert result.stderr.count(offload.NO_GPU_NOTICE) == 1


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
