"""Keras's own MobileNetV2, untrained, on images made by a tf.data graph."""
