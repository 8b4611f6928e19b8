"""Names of the model zoo and what each model trains on, framework-neutral.

Both framework sides build exactly these names; the flag surface offers them.
`validate_model_args` is the one check of a build request, so both sides'
`build_model` refuse the same requests with the same messages.
"""

import dataclasses

# The tasks a model trains on; each side's steps pick loss and metric by them.
CLASSIFICATION = "classification"
SUPER_RESOLUTION = "super_resolution"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  task: str  # CLASSIFICATION or SUPER_RESOLUTION
  min_image_size: int  # smallest input side the architecture accepts
  upscale: int = 1  # super-resolution factor (EDSR)


MODELS = {
    "mlp": ModelSpec(CLASSIFICATION, 1),
    "small_cnn": ModelSpec(CLASSIFICATION, 4),
    "resnet18": ModelSpec(CLASSIFICATION, 1),
    "resnet50": ModelSpec(CLASSIFICATION, 1),
    "vgg16": ModelSpec(CLASSIFICATION, 32),
    "vgg19": ModelSpec(CLASSIFICATION, 32),
    "inception_v3": ModelSpec(CLASSIFICATION, 75),
    "wide_resnet26_2": ModelSpec(CLASSIFICATION, 1),
    "wide_resnet50_2": ModelSpec(CLASSIFICATION, 1),
    "wide_resnet101_2": ModelSpec(CLASSIFICATION, 1),
    "edsr": ModelSpec(SUPER_RESOLUTION, 2, upscale=2),
}

MODEL_NAMES = tuple(MODELS)

# torchvision's VGG configurations D (VGG-16) and E (VGG-19): output channels
# of each 3x3 convolution, "M" for each 2x2 max pooling. Both sides build
# their VGGs from these, so the two stacks cannot drift apart.
VGG_CONFIGS = {
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
              512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


def collect_builders(modules) -> dict:
  """Maps every zoo name to its framework's builder, `build_<name>`.

  Each framework side keeps one module per architecture; the names come from
  `MODELS` alone, so a side cannot offer a model the other lacks.

  Args:
    modules: the side's model modules; each name's builder is found in one.

  Returns:
    {name: builder} in the order of `MODEL_NAMES`.

  Raises:
    ValueError: naming the model, if no module defines its builder.
  """
  builders = {}
  for name in MODEL_NAMES:
    found = [getattr(m, f"build_{name}") for m in modules
             if hasattr(m, f"build_{name}")]
    if len(found) != 1:
      raise ValueError(f"model {name!r}: {len(found)} modules define "
                       f"build_{name}; allowed: exactly 1")
    builders[name] = found[0]
  return builders


def validate_model_args(name: str, *, image_size: int, num_classes: int,
                        channels: int) -> ModelSpec:
  """Checks a request to build zoo model `name`, before any framework work.

  Args:
    name: the model name.
    image_size: the input side for a classifier; the high-resolution output
      side for a super-resolution model.
    num_classes: number of logits; unchecked for super-resolution models.
    channels: image channels.

  Returns:
    The model's `ModelSpec`.

  Raises:
    ValueError: naming the argument, the value received and what is allowed,
      for an unknown name, an image_size below the model's minimum or not a
      multiple of its upscale factor, or a non-positive num_classes or
      channels.
  """
  if name not in MODELS:
    raise ValueError(f"name={name!r}: unknown model; allowed: "
                     f"{', '.join(MODEL_NAMES)}")
  spec = MODELS[name]
  if image_size < spec.min_image_size:
    raise ValueError(f"image_size={image_size}: model {name!r} needs at "
                     f"least {spec.min_image_size}")
  if image_size % spec.upscale:
    raise ValueError(f"image_size={image_size}: model {name!r} needs a "
                     f"multiple of {spec.upscale} (its upscale factor)")
  if spec.task == CLASSIFICATION and num_classes < 1:
    raise ValueError(f"num_classes={num_classes}: allowed: at least 1")
  if channels < 1:
    raise ValueError(f"channels={channels}: allowed: at least 1")
  return spec
