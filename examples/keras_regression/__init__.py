"""A functional Keras model written here, trained as a regression."""
