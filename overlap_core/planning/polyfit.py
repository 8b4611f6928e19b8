"""Weighted polynomial least squares and group k-fold, in NumPy.

What the cost model fits (`cost_model`): each feature standardized, every
monomial of the standardized features up to a degree, and a weighted least
squares fit of several targets at once with an intercept. The intercept is
fitted apart (features and targets centred on their weighted means), so
that where the monomials are collinear, as few profiled shapes make them,
the minimum-norm solution spreads over the monomials and not the constant.

  fit = PolynomialFit.fit(x, y, degree=2, sample_weight=w)
  predicted = fit.predict(x_new)          # [n, targets]
  for train, test in group_k_fold(groups, n_splits=5): ...
"""

import dataclasses
import itertools
from typing import Iterator, List, Sequence, Tuple

import numpy as np


def _monomials(num_features: int, degree: int) -> List[Tuple[int, ...]]:
  """Feature-index tuples of every monomial of degree 1 to `degree`."""
  return [combo for d in range(1, degree + 1)
          for combo in itertools.combinations_with_replacement(
              range(num_features), d)]


@dataclasses.dataclass(frozen=True)
class PolynomialFit:
  """A fitted polynomial of standardized features; see the module doc."""
  mean: np.ndarray
  scale: np.ndarray
  monomials: Tuple[Tuple[int, ...], ...]
  coefficients: np.ndarray  # [monomials, targets]
  intercept: np.ndarray  # [targets]

  @classmethod
  def fit(cls, x, y, *, degree: int, sample_weight=None) -> "PolynomialFit":
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    weights = (np.ones(len(x)) if sample_weight is None
               else np.asarray(sample_weight, dtype=np.float64))
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    # A feature constant over the samples carries nothing to scale.
    scale[scale == 0.0] = 1.0
    monomials = tuple(_monomials(x.shape[1], degree))
    design = cls._expand((x - mean) / scale, monomials)
    centre = np.average(design, axis=0, weights=weights)
    target_centre = np.average(y, axis=0, weights=weights)
    root = np.sqrt(weights)[:, np.newaxis]
    coefficients = np.linalg.lstsq(root * (design - centre),
                                   root * (y - target_centre), rcond=None)[0]
    return cls(mean=mean, scale=scale, monomials=monomials,
               coefficients=coefficients,
               intercept=target_centre - centre @ coefficients)

  @staticmethod
  def _expand(standardized: np.ndarray, monomials) -> np.ndarray:
    return np.stack([np.prod(standardized[:, list(m)], axis=1)
                     for m in monomials], axis=1)

  def predict(self, x) -> np.ndarray:
    standardized = (np.asarray(x, dtype=np.float64) - self.mean) / self.scale
    return (self._expand(standardized, self.monomials) @ self.coefficients
            + self.intercept)


def group_k_fold(groups: Sequence[int], n_splits: int
                 ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
  """(train indices, test indices) per fold; no group is split between a
  fold's two sides. Groups go, largest first, to the fold holding the
  fewest samples so far, so the folds come out about equal."""
  groups = np.asarray(groups)
  names, sizes = np.unique(groups, return_counts=True)
  if n_splits > len(names):
    raise ValueError(f"{n_splits} folds need as many groups; "
                     f"there are {len(names)}")
  fold_of_group = {}
  fold_sizes = np.zeros(n_splits, dtype=np.int64)
  # Largest first; among equal sizes, in the groups' order.
  for index in sorted(range(len(names)), key=lambda i: (-sizes[i], i)):
    lightest = int(np.argmin(fold_sizes))
    fold_of_group[names[index]] = lightest
    fold_sizes[lightest] += sizes[index]
  folds = np.array([fold_of_group[g] for g in groups])
  for fold in range(n_splits):
    yield np.flatnonzero(folds != fold), np.flatnonzero(folds == fold)
