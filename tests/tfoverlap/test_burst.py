"""The TensorFlow burst runtime: split layers, the unsplit loss and grads."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfoverlap import burst

from tests.burst_plans import assert_split_placements

# float32 sums of the same per-sample terms in another grouping (two parts
# concatenated instead of one batch): a few ulps per reduction, far below
# 1e-5 relative on values of order 1e-3 to 1.
RTOL, ATOL = 1e-5, 1e-6


def _model():
  keras.utils.set_random_seed(0)
  return keras.Sequential([
      keras.Input((8, 8, 1)),
      keras.layers.Conv2D(4, 3, padding="same", activation="relu",
                          name="conv"),
      keras.layers.Flatten(name="flat"),
      keras.layers.Dense(16, activation="relu", name="fc1"),
      keras.layers.Dense(10, name="fc2")])


def _loss_and_grad_tensors(model, forward, x, y):
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  with tf.GradientTape() as tape:
    loss = loss_fn(y, forward(x, training=True))
  return loss, tape.gradient(loss, model.trainable_variables)


def _loss_and_grads(model, forward, x, y):
  loss, grads = _loss_and_grad_tensors(model, forward, x, y)
  return float(loss), [g.numpy() for g in grads]


def test_split_layers_match_the_unsplit_model(two_cpu_devices):
  model = _model()
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(10, 8, 8, 1)), tf.float32)
  y = tf.constant(rng.integers(0, 10, size=(10,)))
  widths = {"conv": 2, "flat": 2, "fc1": 1, "fc2": 2}
  placements = []
  forward = burst.make_burst_forward(model, widths, two_cpu_devices,
                                     placements=placements)
  loss, grads = _loss_and_grads(model, forward, x, y)
  ref_loss, ref_grads = _loss_and_grads(model, model, x, y)
  assert loss == pytest.approx(ref_loss, rel=RTOL)
  for g, ref in zip(grads, ref_grads):
    np.testing.assert_allclose(g, ref, rtol=RTOL, atol=ATOL)
  # The width-2 layers really ran as two parts of 5, one on each device.
  for layer in ("conv", "flat", "fc2"):
    parts = [(n, d) for l, n, d in placements if l == layer]
    assert [n for n, _ in parts] == [5, 5], placements
    assert parts[0][1].endswith("CPU:0") and parts[1][1].endswith("CPU:1")
  assert not [p for p in placements if p[0] == "fc1"]


def test_each_part_computes_its_backward_on_its_device(two_cpu_devices):
  # In a tf.function, as the trainer's step runs it: the tape alone would
  # place every gradient op where tape.gradient is called.
  model = _model()
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(10, 8, 8, 1)), tf.float32)
  y = tf.constant(rng.integers(0, 10, size=(10,)))
  forward = burst.make_burst_forward(
      model, {"conv": 2, "flat": 2, "fc1": 1, "fc2": 2}, two_cpu_devices)
  placements = {}
  step = burst.record_first_step_placements(
      tf.function(lambda batch: _loss_and_grad_tensors(model, forward,
                                                       *batch)),
      model, placements)
  loss, grads = step((x, y))
  ref_loss, ref_grads = _loss_and_grads(model, model, x, y)
  assert float(loss) == pytest.approx(ref_loss, rel=RTOL)
  for g, ref in zip(grads, ref_grads):
    np.testing.assert_allclose(g.numpy(), ref, rtol=RTOL, atol=ATOL)
  assert_split_placements(placements, split=("conv", "fc2"), whole=("fc1",))


def test_a_plan_that_does_not_fit_the_model_is_refused(two_cpu_devices):
  model = _model()
  with pytest.raises(ValueError, match="'fc2' of the model has no width"):
    burst.make_burst_forward(model, {"conv": 1, "flat": 1, "fc1": 1},
                             two_cpu_devices)
  with pytest.raises(ValueError, match="width 4; allowed: 1 to 2"):
    burst.make_burst_forward(model, {"conv": 4, "flat": 1, "fc1": 1,
                                     "fc2": 1}, two_cpu_devices)
