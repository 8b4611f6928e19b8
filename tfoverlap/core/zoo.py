"""Names of the model zoo and what each model trains on, framework-neutral.

Both framework sides build exactly these names; the flag surface offers them.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  task: str  # "classification" or "super_resolution"
  min_image_size: int  # smallest input side the architecture accepts
  upscale: int = 1  # super-resolution factor (EDSR)


MODELS = {
    "mlp": ModelSpec("classification", 1),
    "small_cnn": ModelSpec("classification", 4),
    "resnet18": ModelSpec("classification", 1),
    "resnet50": ModelSpec("classification", 1),
    "vgg16": ModelSpec("classification", 32),
    "inception_v3": ModelSpec("classification", 75),
    "wide_resnet26_2": ModelSpec("classification", 1),
    "wide_resnet50_2": ModelSpec("classification", 1),
    "wide_resnet101_2": ModelSpec("classification", 1),
    "edsr": ModelSpec("super_resolution", 2, upscale=2),
}

MODEL_NAMES = tuple(MODELS)
