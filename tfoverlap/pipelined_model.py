"""`model.fit` over pipeline stages: a Keras model whose train step is GPipe.

For a Keras user with a functional model of their own: wrap it, compile,
fit. `train_step` runs the GPipe schedule of `tfoverlap.pipeline` (stages
on their devices, micro-batches, gradients summed and applied once), so
callbacks, metrics, `evaluate` and `predict` work as they do for the model
itself; evaluation and prediction run the whole model, unsplit.

  import keras
  from tfoverlap.pipelined_model import PipelinedModel

  piped = PipelinedModel(model, cut_layers=["features_16"],
                         devices=["/gpu:0", "/gpu:1"], num_microbatches=4)
  piped.compile(optimizer="sgd",
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                metrics=["accuracy"])
  piped.fit(dataset, epochs=3)   # batches must divide by num_microbatches

`python -m tfoverlap.plan` prints the layers where the model can be cut and
the split it would choose. The wrapped model's variables are the ones
trained: save or checkpoint `model` as usual (its variable paths are
unchanged). Not supported: sample weights, and loss scaling
(`LossScaleOptimizer`, mixed_float16).
"""

from typing import Sequence

import keras
import tensorflow as tf

from tfoverlap.pipeline import PipelineRuntime


class PipelinedModel(keras.Model):
  """Wraps a functional model; `fit` runs it as a GPipe pipeline.

  Args:
    model: a functional Keras model with one input and one output.
    cut_layers: the layers stages 0..S-2 end with (cut points).
    devices: one device per stage ("/gpu:0", "/cpu:1", ...).
    num_microbatches: M; every training batch must divide by it.

  Raises:
    ValueError: a model with several inputs or outputs, a cut layer that
      is no cut point, or one device too many or too few.
  """

  def __init__(self, model: keras.Model, *, cut_layers: Sequence[str],
               devices: Sequence[str], num_microbatches: int, **kwargs):
    super().__init__(name=kwargs.pop("name", f"{model.name}_pipelined"),
                     **kwargs)
    self.inner = model
    self._runtime = PipelineRuntime(model, cut_layers, devices=devices,
                                 num_microbatches=num_microbatches)
    self.built = True

  @property
  def runtime(self) -> PipelineRuntime:
    """The stages, their devices and the schedule."""
    return self._runtime

  def compile(self, *args, jit_compile="auto", **kwargs):
    """`keras.Model.compile`, always without XLA.

    Raises:
      ValueError: for jit_compile=True.
    """
    # XLA compiles a step into clusters that ignore the stages' device
    # scopes (Keras' "auto" turns it on where a GPU exists); the schedule
    # needs TensorFlow's executor and its placement.
    if jit_compile not in ("auto", False):
      raise ValueError(f"Invalid value for argument `jit_compile`. Received: "
                       f"{jit_compile!r}; allowed: False (a pipelined step "
                       "places ops on its stages' devices, which XLA would "
                       "not keep)")
    super().compile(*args, jit_compile=False, **kwargs)

  def call(self, inputs, training=False):
    return self.inner(inputs, training=training)

  def train_step(self, data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if sample_weight is not None:
      raise ValueError("PipelinedModel.fit does not take sample weights")
    num_microbatches = self._runtime.num_microbatches

    def loss_fn(targets, outputs):
      # The compiled loss is a micro-batch mean; over M equal micro-batches
      # the M means over M add up to the batch mean fit reports.
      return self.compute_loss(x=None, y=targets, y_pred=outputs,
                               training=True) / num_microbatches

    loss, grads, y_pred = self._runtime.forward_backward(
        x, y, loss_fn, return_outputs=True)
    self._loss_tracker.update_state(loss, sample_weight=tf.shape(x)[0])
    self.optimizer.apply_gradients(
        zip(grads, self.inner.trainable_variables))
    return self.compute_metrics(x, y, y_pred, sample_weight=None)
