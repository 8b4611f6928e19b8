"""PipelinedModel: Keras `fit` over 2 stages on the 2 logical CPU devices
trains as `fit` of the model itself does."""

import keras
import numpy as np

from tfoverlap.models import build_model
from tfoverlap.pipelined_model import PipelinedModel

BATCH = 8
# float64 weights, but the zoo's last layer casts the logits to float32:
# the loss, and the gradient entering backward, carry float32 rounding
# (~1e-7 relative). The pipelined step sums per-micro-batch gradients
# where fit takes the gradient of the batch mean; small_cnn has no
# BatchNorm or dropout, so that order is the only difference. Seen: 9e-8
# relative on a bias near zero. Each tensor is compared at its own scale,
# rtol 1e-6 and atol 1e-6 x its largest magnitude; a lost micro-batch or a
# gradient applied per micro-batch moves weights by percent of it.
RTOL = 1e-6
SCALE_ATOL = 1e-6


def _fit(model, x, y):
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True), metrics=["accuracy"])
  history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                      verbose=0)
  return history.history


def test_fit_of_the_pipelined_model_matches_plain_fit(two_cpu_devices):
  keras.utils.set_random_seed(0)
  keras.config.set_dtype_policy("float64")
  try:
    model = build_model("small_cnn", image_size=8, num_classes=10)
  finally:
    keras.config.set_dtype_policy("float32")
  initial = model.get_weights()
  rng = np.random.default_rng(2)
  x = rng.normal(size=(3 * BATCH, 8, 8, 3))
  y = rng.integers(0, 10, size=(3 * BATCH,))
  plain = _fit(model, x, y)
  expected = [w.numpy() for w in model.weights]
  model.set_weights(initial)
  piped = PipelinedModel(model, cut_layers=["pool1"],
                         devices=two_cpu_devices, num_microbatches=4)
  history = _fit(piped, x, y)
  for got, want in zip(model.weights, expected):
    scale = float(np.max(np.abs(want))) + 1e-12
    np.testing.assert_allclose(got.numpy(), want, rtol=RTOL,
                               atol=SCALE_ATOL * scale)
  # The reported loss is a float32 mean: the same rounding argument.
  np.testing.assert_allclose(history["loss"], plain["loss"], rtol=RTOL)
  np.testing.assert_allclose(history["accuracy"], plain["accuracy"])
  # evaluate runs the whole, unsplit model.
  assert np.isfinite(piped.evaluate(x, y, batch_size=BATCH, verbose=0)[0])
