"""The median of a few repeats, with a distribution-free interval.

Benchmarks (`benchmarks.harness`) and comparisons (`overlap_compare`) both
judge repeated measurements this way: per-repeat values, or ratios paired
by repeat, and the order-statistics interval of their median.
"""

import math
from typing import List, Optional, Sequence

# The interval's coverage. 0.90, not 0.95, because the order-statistics
# interval of the median from n paired ratios covers with probability
# 1 - 2 * 0.5**n at best (the range [min, max]): 5 repeats, what the issue
# asks of a quiet-host rerun, reach 93.75%, while 95% would need 6. Each
# summary records the coverage it really has.
DEFAULT_CONFIDENCE = 0.90


def _binomial_cdf_half(k: int, n: int) -> float:
  """P(X <= k) for X ~ Binomial(n, 1/2)."""
  return sum(math.comb(n, i) for i in range(0, k + 1)) / 2 ** n


def median_interval(values: Sequence[float],
                    confidence: float = DEFAULT_CONFIDENCE) -> dict:
  """The median and its distribution-free interval from order statistics.

  Why order statistics and not a bootstrap: the repeats are few (3-9), and
  a percentile bootstrap of so few values never reaches past [min, max]
  while claiming a coverage it does not have. The order-statistics interval
  [x_(k), x_(n+1-k)] covers the true median with probability exactly
  1 - 2 P(Binomial(n, 1/2) <= k - 1), assuming only independent repeats,
  whatever the distribution (the step-time levels here are bimodal).

  Returns:
    {"n", "median", "low", "high", "confidence" (the coverage really
    reached), "requested_confidence"}. When even [min, max] covers less
    than requested, low and high are None: no interval at that confidence
    exists from these repeats, and any target lies inside it.

  Raises:
    ValueError: no values, a NaN, or confidence outside (0, 1).
  """
  if not 0 < confidence < 1:
    raise ValueError(f"confidence: got {confidence}; allowed: 0 < c < 1")
  values = sorted(float(v) for v in values)
  if not values:
    raise ValueError("values: got none; at least one repeat is needed")
  if any(math.isnan(v) for v in values):
    raise ValueError(f"values: {values} holds a NaN")
  n = len(values)
  mid = n // 2
  median = values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2
  best = None
  for k in range(1, (n + 1) // 2 + 1):
    coverage = 1 - 2 * _binomial_cdf_half(k - 1, n)
    if coverage >= confidence:
      best = (k, coverage)  # a larger k is a narrower interval
  summary = {"n": n, "median": median, "requested_confidence": confidence,
             "method": "order statistics of the median"}
  if best is None:
    summary.update(low=None, high=None, confidence=None)
  else:
    k, coverage = best
    summary.update(low=values[k - 1], high=values[n - k],
                   confidence=coverage)
  return summary


def paired_ratios(numerators: Sequence[Optional[float]],
                  denominators: Sequence[Optional[float]]) -> List[float]:
  """numerator / denominator within each repeat; repeats missing either drop.

  Raises:
    ValueError: lengths differ, or a denominator is 0.
  """
  if len(numerators) != len(denominators):
    raise ValueError(f"got {len(numerators)} numerators and "
                     f"{len(denominators)} denominators; pair by repeat")
  ratios = []
  for top, bottom in zip(numerators, denominators):
    if top is None or bottom is None:
      continue
    if bottom == 0:
      raise ValueError("a denominator is 0; the ratio is undefined")
    ratios.append(top / bottom)
  return ratios


def summarize_ratios(numerators: Sequence[Optional[float]],
                     denominators: Sequence[Optional[float]],
                     confidence: float = DEFAULT_CONFIDENCE) -> dict:
  """Median of the per-repeat ratios with its interval, and the ratios.

  Ratios are taken within a repeat because the two sides of one repeat ran
  minutes apart under the same load; a ratio of medians would pair a fast
  minute of one side with a slow one of the other.
  """
  ratios = paired_ratios(numerators, denominators)
  summary = median_interval(ratios, confidence)
  summary["per_repeat"] = ratios
  return summary


def format_interval(summary: dict, digits: int = 3) -> str:
  """'1.004 [0.968, 1.030] (90%)', or '1.004 [no interval from 3 repeats]'."""
  median = f"{summary['median']:.{digits}f}"
  if summary.get("low") is None or summary.get("high") is None:
    return f"{median} [no interval from {summary['n']} repeat(s)]"
  return (f"{median} [{summary['low']:.{digits}f}, "
          f"{summary['high']:.{digits}f}] "
          f"({100 * summary['confidence']:.0f}%)")
