"""Building blocks shared by the PyTorch zoo, set up like their Keras twins.

The Keras zoo is the reference: each block here has the same trainable
parameters, the same BatchNorm epsilon and momentum, and the same initial
weight distribution as the block it mirrors in `tfoverlap.models.layers`.
"""

import torch
from torch import nn

BN_EPSILON = 1e-5  # Keras' layers.BN_EPSILON; also torch's default
# torch weights the NEW batch statistic by momentum; the Keras side's 0.9
# weights the OLD moving value, so both update by the same rule.
BN_MOMENTUM = 0.1


def batch_norm(num_features: int, *, eps: float = BN_EPSILON) -> nn.Module:
  """BatchNorm2d with a learnable scale and shift, updated like the Keras one.

  Args:
    num_features: channels of the input.
    eps: the variance epsilon (Keras' `epsilon`).

  Returns:
    An `nn.BatchNorm2d`.
  """
  return nn.BatchNorm2d(num_features, eps=eps, momentum=BN_MOMENTUM)


def apply_keras_init(model: nn.Module) -> nn.Module:
  """Re-initializes weights from the distributions Keras' defaults draw from.

  Keras starts convolution and dense kernels Glorot-uniform and biases at
  zero; torch's own defaults (Kaiming-uniform with a=sqrt(5), uniform
  biases) draw kernels at about half that range. Starting both sides from the
  same distribution keeps early training comparable. The fans agree: Keras'
  (kh, kw, in, out) kernel and torch's (out, in, kh, kw) weight both give
  fan_in = in*kh*kw and fan_out = out*kh*kw. BatchNorm already starts at
  scale 1, shift 0 in both.

  Args:
    model: the module whose Conv2d and Linear layers are re-initialized.

  Returns:
    `model`, for chaining.
  """
  with torch.no_grad():
    for module in model.modules():
      if isinstance(module, (nn.Conv2d, nn.Linear)):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
          nn.init.zeros_(module.bias)
  return model


def float32_output(x: torch.Tensor) -> torch.Tensor:
  """Returns the model output as float32.

  Under `torch.autocast` the last layer computes in bfloat16/float16; losses
  and metrics need float32 to stay stable, as on the Keras side, where every
  zoo model ends in a float32 cast.

  Args:
    x: the model's final tensor.

  Returns:
    The same values as float32 (`x` itself when it already is).
  """
  return x.float()
