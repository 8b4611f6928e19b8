"""The PyTorch model zoo: one builder per name of `overlap_core.runtime.zoo`.

Each name builds the same architecture as `tfoverlap.models` does, with the
same trainable parameter count at every image size, so runs of the two
frameworks can be compared model for model. Models take NCHW float32 input
and return float32 under `torch.autocast`. Classifiers map
[B, channels, image_size, image_size] images to logits [B, num_classes] (no
softmax); "edsr" maps [B, channels, image_size // 2, image_size // 2]
low-resolution images to [B, channels, image_size, image_size].

Module paths equal the Keras layer names with "." for "_" (the Keras layer
"layer2_0_downsample_0" is `layer2[0].downsample[0]` here), so weights can be
matched by name. Weights start from the distributions Keras' defaults use.
This package imports torch and the framework-neutral `overlap_core`, never
TensorFlow.

Usage:

  model = build_model("resnet18", image_size=32, num_classes=10)
  logits = model(images)  # images: [B, 3, 32, 32]
"""

from torch import nn

from overlap_core.runtime import zoo
from torch_parity.models import edsr
from torch_parity.models import inception
from torch_parity.models import mlp
from torch_parity.models import resnet
from torch_parity.models import small_cnn
from torch_parity.models import vgg

_BUILDERS = zoo.collect_builders(
    (edsr, inception, mlp, resnet, small_cnn, vgg))


def build_model(name: str, *, image_size: int, num_classes: int,
                channels: int = 3) -> nn.Module:
  """Builds the zoo model `name`, in training mode, on the CPU.

  Args:
    name, image_size, num_classes, channels: as
      `overlap_core.runtime.zoo.validate_model_args` checks them ("edsr"
      ignores num_classes).

  Returns:
    An `nn.Module` of float32 parameters.

  Raises:
    ValueError: what `zoo.validate_model_args` raises for a bad request,
      the same as on the Keras side.
  """
  zoo.validate_model_args(name, image_size=image_size,
                          num_classes=num_classes, channels=channels)
  return _BUILDERS[name](image_size=image_size, num_classes=num_classes,
                         channels=channels)


def num_params(model: nn.Module) -> int:
  """Counts the trainable parameters, as `tfoverlap.models.num_params` does.

  The Keras side counts `trainable_weights`, which leaves out BatchNorm's
  moving mean and variance; here those are the `running_mean` and
  `running_var` buffers (with `num_batches_tracked`), which
  `parameters()` leaves out too. A parameter with requires_grad=False is
  left out, as a non-trainable Keras weight is. So both definitions count
  the same scalars: kernels, biases and BatchNorm scale and shift.

  Args:
    model: an `nn.Module`.

  Returns:
    The number of scalars in the parameters that require gradients.
  """
  return sum(p.numel() for p in model.parameters() if p.requires_grad)
