"""The model: MobileNetV2 from keras.applications, at a small size.

`weights=None` builds it untrained, so nothing is downloaded, and lets it
take any image side of 32 or more. `alpha` thins every layer: 0.35 is the
narrowest width Keras offers, which keeps a CPU step short.
"""

import keras


def build(image_size, num_classes):
  """The trainer passes these two by keyword, because the signature names
  them; it returns the model alone, so the task is classification."""
  return keras.applications.MobileNetV2(
      input_shape=(image_size, image_size, 3), alpha=0.35, weights=None,
      classes=num_classes,
      # The trainers' classification loss reads logits.
      classifier_activation=None)
