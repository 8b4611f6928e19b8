"""The cost model's regression: weighted polynomial least squares of
standardized features, and group k-fold."""

import numpy as np
import pytest

from overlap_core.planning.polyfit import PolynomialFit, group_k_fold


def _quadratic(x):
  """Two targets, each a polynomial of degree 2 in both features."""
  return np.stack([3.0 + 2.0 * x[:, 0] - x[:, 1] * x[:, 0],
                   0.5 * x[:, 1] ** 2 + 1e-9 * x[:, 0]], axis=1)


def test_a_polynomial_of_the_degree_is_recovered_whatever_the_scales():
  # FLOPs-sized and kernel-sized features side by side: unscaled, the
  # monomials would span 20 orders of magnitude.
  rng = np.random.default_rng(0)
  x = np.stack([rng.uniform(1e8, 1e9, 40), rng.uniform(1, 7, 40)], axis=1)
  weights = rng.uniform(0.1, 2.0, 40)
  fit = PolynomialFit.fit(x, _quadratic(x), degree=2, sample_weight=weights)
  unseen = np.stack([rng.uniform(1e8, 1e9, 5), rng.uniform(1, 7, 5)], axis=1)
  np.testing.assert_allclose(fit.predict(unseen), _quadratic(unseen),
                             rtol=1e-6)


def test_weights_decide_which_samples_the_line_follows():
  # A line cannot pass through all four points; weighted heavily, the
  # first two are fitted almost exactly.
  x = np.array([[0.0], [1.0], [2.0], [3.0]])
  y = np.array([[0.0], [1.0], [5.0], [0.0]])
  fit = PolynomialFit.fit(x, y, degree=1,
                          sample_weight=[1e6, 1e6, 1.0, 1.0])
  np.testing.assert_allclose(fit.predict(x[:2]), y[:2], atol=1e-4)


def test_a_constant_feature_and_collinear_monomials_still_fit():
  # Few profiled shapes: one feature never varies and another is twice a
  # third. The fit still reproduces the samples, and predicts finitely.
  rng = np.random.default_rng(1)
  base = rng.uniform(0.0, 1.0, 8)
  x = np.stack([base, 2.0 * base, np.full(8, 7.0)], axis=1)
  y = (1.0 + 4.0 * base)[:, np.newaxis]
  fit = PolynomialFit.fit(x, y, degree=2)
  np.testing.assert_allclose(fit.predict(x), y, atol=1e-9)
  assert np.all(np.isfinite(fit.predict(x + 1.0)))


def test_group_k_fold_keeps_groups_whole_and_tests_each_sample_once():
  groups = [0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 4, 5, 5]
  folds = list(group_k_fold(groups, n_splits=4))
  assert len(folds) == 4
  tested = np.concatenate([test for _, test in folds])
  assert sorted(tested) == list(range(len(groups)))
  for train, test in folds:
    assert not set(np.take(groups, train)) & set(np.take(groups, test))
    assert sorted(np.concatenate([train, test])) == list(range(len(groups)))
  # Largest group first, each to the lightest fold: 4, 3, 2+1, 2+1.
  assert sorted(len(test) for _, test in folds) == [3, 3, 3, 4]


def test_more_folds_than_groups_is_refused():
  with pytest.raises(ValueError, match="3 folds need as many groups"):
    list(group_k_fold([0, 0, 1], n_splits=3))
