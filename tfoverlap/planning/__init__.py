"""TensorFlow planning side: the Keras layer graph and the layer profiler."""
