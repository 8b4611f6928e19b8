"""Another framework's profile and cut names, read onto this graph."""

import pytest

from overlap_core.planning import foreign
from overlap_core.planning.graph import chain
from overlap_core.planning.profile import LayerTiming, Profile

# Keras' spelling: the ReLU fused into the convolution, a cast at the end.
KERAS = chain("m", [("features_0", "conv2d", {}), ("classifier_0", "dense", {}),
                    ("out", "activation", {})], param_bytes=[4, 4, 0])


def _torch_profile(layers):
  return Profile(model="m", framework="torch 2.13.0", device="cpu",
                 warmup=1, repeats=1, threads=1, timings=tuple(
                     LayerTiming(name, op, 8, fwd, 2 * fwd)
                     for name, op, fwd in layers))


def test_a_layer_the_graph_lacks_is_charged_to_the_one_before():
  profile = foreign.translate_profile(_torch_profile([
      ("features.0", "conv2d", 1.0), ("features.1", "relu", 0.5),
      ("classifier.0", "linear", 2.0), ("float_1", "float", 0.25)]), KERAS)
  times = {t.layer: (t.forward_s, t.backward_s) for t in profile.timings}
  # Every step's total is kept: the ReLU in the convolution, the cast in
  # the classifier, and Keras' cast layer, a type torch never timed, free.
  assert times == {"features_0": (1.5, 3.0), "classifier_0": (2.25, 4.5),
                   "out": (0.0, 0.0)}


def test_a_layer_with_weights_the_profile_misses_is_refused():
  with pytest.raises(ValueError, match="no timing of layer 'classifier_0'"):
    foreign.translate_profile(_torch_profile([
        ("features.0", "conv2d", 1.0), ("fc", "linear", 2.0)]), KERAS)


def test_cut_names_resolve_in_either_spelling():
  assert foreign.resolve_layer(KERAS, "features.0") == "features_0"
  assert foreign.resolve_layer(KERAS, "features_0") == "features_0"
  assert foreign.resolve_layer(KERAS, "relu_2") == "relu_2"  # refused later
