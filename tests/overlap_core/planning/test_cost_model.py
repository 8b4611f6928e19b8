"""The fitted cost model on a synthetic layer family with a known formula."""

import random

import pytest

from overlap_core.planning.cost_model import (CostModel, Sample,
                                              fit_cost_model, fit_updates)
from overlap_core.planning.graph import MODEL_INPUT, LayerGraph, LayerNode
from overlap_core.planning.profile import LayerTiming, Profile, UpdateTiming

# A roofline-like truth: time follows FLOPs and bytes moved, plus a launch
# cost; backward costs twice forward, as the study measured.
_S_PER_FLOP = 2e-11
_S_PER_BYTE = 5e-10
_LAUNCH_S = 2e-5


def conv_config(c_in, c_out, spatial, kernel):
  return {"in_channels": c_in, "out_channels": c_out, "spatial": spatial,
          "kernel": kernel,
          "flops_per_sample": 2 * c_in * c_out * kernel**2 * spatial**2,
          "bytes_per_sample": 4 * (c_in + c_out) * spatial**2}


def true_forward_s(config, batch):
  return (_S_PER_FLOP * batch * config["flops_per_sample"] +
          _S_PER_BYTE * batch * config["bytes_per_sample"] + _LAUNCH_S)


def synthetic_samples(rng, noise_frac, num_configs=24):
  samples = []
  for _ in range(num_configs):
    config = conv_config(rng.choice([16, 32, 64, 128]),
                         rng.choice([16, 32, 64, 128]),
                         rng.choice([8, 16, 32]), rng.choice([1, 3, 5]))
    for batch in (2, 4, 8):
      forward = true_forward_s(config, batch)
      jitter = 1 + rng.uniform(-noise_frac, noise_frac)
      samples.append(Sample("conv2d", config, batch, forward * jitter,
                            2 * forward * jitter))
  return samples


def test_exact_family_is_recovered_on_unseen_configurations():
  model = fit_cost_model(samples=synthetic_samples(random.Random(0), 0.0))
  family = model.families["conv2d"]
  # The truth is linear in FLOPs and bytes, inside the degree-1
  # candidate's model class: held-out error is floating-point round-off
  # only, so 1% is a generous bound that a wrong feature set misses.
  assert family.holdout_error < 0.01
  assert family.feature_set == "flops+bytes"
  assert family.backward_over_forward == pytest.approx(2.0)
  # A shape and batch never profiled (kernel 7, batch 32).
  unseen = conv_config(48, 96, 24, 7)
  node = LayerNode("x", "conv2d", unseen, ("input",), (1,), 0, 0)
  forward_s, backward_s = model.predict(node, batch_size=32)
  assert forward_s == pytest.approx(true_forward_s(unseen, 32), rel=0.01)
  assert backward_s == pytest.approx(2 * true_forward_s(unseen, 32), rel=0.01)
  assert "conv2d" in model.report()


def test_noisy_family_error_stays_near_the_noise():
  noise = 0.05
  model = fit_cost_model(samples=synthetic_samples(random.Random(1), noise))
  # Measurements are off by up to 5% (uniform); a fit that found the
  # formula errs by about that much on held-out shapes, median under 5%.
  # A model that missed the formula errs by tens of percent on these
  # shapes, whose FLOPs span four orders of magnitude.
  assert model.families["conv2d"].holdout_error < noise


def test_too_few_configurations_report_no_holdout_error():
  samples = synthetic_samples(random.Random(2), 0.0, num_configs=2)
  family = fit_cost_model(samples=samples).families["conv2d"]
  assert family.holdout_error is None
  assert "n/a (<3 configs)" in fit_cost_model(samples=samples).report()


def test_unknown_layer_type_is_named():
  model = fit_cost_model(samples=synthetic_samples(random.Random(3), 0.0))
  node = LayerNode("mystery", "lstm", {}, ("input",), (1,), 0, 0)
  with pytest.raises(KeyError, match="no fit for layer type 'lstm'"):
    model.predict(node, batch_size=1)


def test_update_fit_recovers_a_known_line_and_predicts_new_sizes():
  # An update that reads and writes each byte a fixed number of times,
  # plus a per-call cost: exactly a line in the parameter bytes.
  per_byte_s, launch_s = 3e-10, 4e-5
  sizes = (1_000, 40_000, 600_000, 2_500_000, 9_000_000)
  updates = [UpdateTiming(f"l{i}", b, launch_s + per_byte_s * b)
             for i, b in enumerate(sizes)]
  fit = fit_updates("adam", updates)
  assert fit.num_layers == 5 and fit.holdout_error < 1e-9
  node = LayerNode("fc", "linear", {}, ("input",), (1,), 100_000_000, 0)
  model = CostModel(families={}, update=fit)
  assert model.predict_update(node) == pytest.approx(
      launch_s + per_byte_s * 100_000_000, rel=1e-6)
  parameterless = LayerNode("relu", "relu", {}, ("fc",), (1,), 0, 0)
  assert model.predict_update(parameterless) == 0.0
  # A layer a profile timed keeps its own measurement.
  timed = CostModel(families={}, update=fit,
                    updates_measured={("fc", 100_000_000): 0.5})
  assert timed.predict_update(node) == 0.5
  assert "optimizer update (adam, once per step)" in model.report()


def _one_layer(update_s: float, **profile_fields):
  """A one-layer graph and its profile, whose optimizer call costs 0.7 ms
  and whose layer's update took `update_s` in all."""
  graph = LayerGraph("g", 1, (1,), 0, (
      LayerNode("fc", "linear", {}, (MODEL_INPUT,), (1,), 4096, 0),))
  profile = Profile(
      model="g", framework="x", device="cpu", warmup=0, repeats=1,
      timings=(LayerTiming("fc", "linear", 1, 1e-3, 2e-3),),
      optimizer="adam", update_call_s=7e-4,
      updates=(UpdateTiming("fc", 4096, update_s),), **profile_fields)
  return graph, profile


def test_timed_layers_keep_their_share_and_the_call_is_counted_apart():
  graph, profile = _one_layer(1e-3, gradient_sum_s_per_byte=2e-10)
  model = fit_cost_model([(graph, profile)])
  assert model.update_call_s == 7e-4
  assert model.predict_update(graph.nodes[0]) == pytest.approx(3e-4)
  # The gradient sum's rate is the profile's, and the JSON keeps it.
  assert model.gradient_sum_s_per_byte == 2e-10
  assert "gradient sum" in model.report()
  assert Profile.from_json(profile.to_json()) == profile


def test_updates_no_longer_than_the_call_still_count_as_profiled():
  # Tiny layers on a busy host: every update at or under the call's fixed
  # cost, so every share is 0. The update was timed all the same.
  graph, profile = _one_layer(5e-4)
  model = fit_cost_model([(graph, profile)])
  assert model.update.num_layers == 0
  assert model.predict_update(graph.nodes[0]) == 0.0
  assert model.update_call_s == 7e-4
  assert ("optimizer update (adam, once per step): a call 0.700 ms; no "
          "layer's share measured above" in model.report())


def test_no_updates_profiled_predicts_none_and_says_so():
  model = fit_cost_model(samples=synthetic_samples(random.Random(4), 0.0))
  node = LayerNode("fc", "linear", {}, ("input",), (1,), 4096, 0)
  assert model.update is None and model.predict_update(node) == 0.0
  assert "optimizer update: not profiled" in model.report()
  assert fit_updates("adam", []) is None


def test_profiled_layers_keep_their_times_and_the_fit_predicts_the_rest():
  samples = synthetic_samples(random.Random(5), 0.0)
  config = conv_config(512, 512, 4, 3)
  node = LayerNode("big", "conv2d", config, (MODEL_INPUT,), (1,), 0, 0)
  graph = LayerGraph("g", 1, (1,), 0, (node,))
  # Timed at batch 2 at ten times what the family's formula says: a layer
  # the fit would get wrong, as the fit got VGG-16's widest layers.
  truth_s = 10 * true_forward_s(config, 2)
  profile = Profile(model="g", framework="x", device="cpu", warmup=0,
                    repeats=1, timings=(
                        LayerTiming("big", "conv2d", 2, truth_s,
                                    2 * truth_s),))
  model = fit_cost_model([(graph, profile)], samples=samples)
  assert model.predict(node, batch_size=2) == (truth_s, 2 * truth_s)
  # The fit itself is the family's: one outlier among 73 samples barely
  # moves it, so it stays far from the timing it was not asked to repeat.
  assert model.fitted(node, batch_size=2)[0] < 0.5 * truth_s
  # A batch the profile did not time falls to the fit.
  assert model.predict(node, batch_size=4) == model.fitted(node, 4)
  # Same name, other shape (another model's "big"): not the timed layer.
  other = LayerNode("big", "conv2d", conv_config(64, 64, 4, 3),
                    (MODEL_INPUT,), (1,), 0, 0)
  assert model.predict(other, 2) == model.fitted(other, 2)
  assert "1 (layer, batch) pairs the profile timed" in model.report()
