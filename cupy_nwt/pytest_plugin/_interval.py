"""Confidence intervals the throughput gate judges with: distribution-free, exact for small samples.

A benchmark's rounds are not normal (a stalled round is 10x off, bursts of prefetched batches are
fast), so no mean and standard deviation here. Two rank-based intervals instead, both exact under
the only assumption that the rounds of one run are exchangeable (their order carries no trend):

* **the change between two runs** (:func:`shift_interval`): the Hodges-Lehmann estimate of the
  shift between the logs of the two runs' rounds (the median of every pairwise difference
  ``log new_j - log old_i``), and the confidence interval that inverts the Mann-Whitney test:
  the k-th smallest and k-th largest pairwise difference, k from the exact null distribution of
  the U statistic (Lehmann, *Nonparametrics*, 1975, ch. 2). In logs, so the shift is a ratio and
  reads as a percentage; one wild round moves at most one of the n*m differences.
* **the noise of one run** (:func:`median_halfwidth`): half the width, in logs, of the
  order-statistic interval for the median of its rounds (the binomial sign-test interval). The
  fixture runs rounds until this is small enough; the interval of a change between two such runs
  is about sqrt(2) times as wide.

Neither interval knows about changes of the machine *between* runs: the gate's limit is what
absorbs those (see :mod:`cupy_nwt.pytest_plugin._gate`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..errors import ArgumentError

CONFIDENCE = 0.95
#: above this many pairs the U distribution is replaced by its normal approximation (exact costs O(n*n*m); at 50|50 both agree).
EXACT_PAIRS = 2_500
#: above this many pairs of rounds the signed-rank distribution is replaced by its normal approximation.
EXACT_PAIRED = 60


@dataclass(frozen=True)
class Shift:
    """``log(new / old)``: its estimate and confidence interval (``-inf``/``inf`` when too few rounds)."""

    estimate: float
    low: float
    high: float

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) orderings give each U = 0..n*m: the q-binomial coefficient [n+m, n]."""
    poly = [1] + [0] * (n * m)
    for i in range(1, n + 1):
        # times (1 - q^(m+i)), then divided by (1 - q^i): each partial product is [m+i, i], a polynomial
        for j in range(len(poly) - 1, m + i - 1, -1):
            poly[j] -= poly[j - m - i]
        for j in range(i, len(poly)):
            poly[j] += poly[j - i]
    return tuple(poly)


def u_rank(n: int, m: int, confidence: float = CONFIDENCE) -> int:
    """The largest k with P(U < k) <= (1 - confidence) / 2 under no change; 0: no finite interval.

    The interval of the shift is then the k-th smallest to the k-th largest pairwise difference.
    """
    tail = (1.0 - confidence) / 2.0
    if n * m <= EXACT_PAIRS:
        counts = _u_counts(n, m)
        total, k, below = math.comb(n + m, n), 0, 0
        while k < len(counts) and (below + counts[k]) / total <= tail:
            below += counts[k]
            k += 1
        return k
    z = statistics.NormalDist().inv_cdf(1.0 - tail)
    return max(0, math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12) + 0.5))


def shift_interval(old: Sequence[float], new: Sequence[float], confidence: float = CONFIDENCE) -> Shift:
    """Hodges-Lehmann shift of ``log(new)`` against ``log(old)`` with its Mann-Whitney interval.

    All figures must be positive and finite (checked by the caller).
    """
    a, b = [math.log(x) for x in old], [math.log(y) for y in new]
    diffs = sorted(y - x for x in a for y in b)
    k = u_rank(len(a), len(b), confidence)
    estimate = statistics.median(diffs)
    if k == 0:
        return Shift(estimate, -math.inf, math.inf)
    return Shift(estimate, diffs[k - 1], diffs[-k])


def sign_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2; 0: no finite interval."""
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0
    while k <= n and (below + math.comb(n, k)) / 2**n <= tail:
        below += math.comb(n, k)
        k += 1
    return k


def median_halfwidth(values: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """Half the width, in logs (~ a relative figure), of the order-statistic interval of the median.

    ``inf`` with too few values for any finite interval at this confidence (fewer than 6 at 95%).
    """
    xs = sorted(math.log(v) for v in values)
    k = sign_rank(len(xs), confidence)
    if k == 0:
        return math.inf
    return (xs[-k] - xs[k - 1]) / 2.0


def rounds_for(halfwidth: float, rounds: int, target: float) -> int:
    """Rounds a run needs for ``target`` half-width when ``rounds`` gave ``halfwidth`` (width ~ 1/sqrt(n))."""
    if halfwidth <= target:
        return rounds
    if not math.isfinite(halfwidth):
        return 2 * rounds
    return math.ceil(rounds * (halfwidth / target) ** 2)


@lru_cache(maxsize=256)
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2**n sign patterns give each signed-rank sum W = 0..n(n+1)/2."""
    poly = [1] + [0] * (n * (n + 1) // 2)
    for i in range(1, n + 1):
        for j in range(len(poly) - 1, i - 1, -1):
            poly[j] += poly[j - i]
    return tuple(poly)


def signed_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The largest k with P(W < k) <= (1 - confidence) / 2 for the signed-rank sum W; 0: no finite interval."""
    tail = (1.0 - confidence) / 2.0
    if n > EXACT_PAIRED:
        z = statistics.NormalDist().inv_cdf(1.0 - tail)
        return max(0, math.floor(n * (n + 1) / 4 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24) + 0.5))
    counts, total = _signed_rank_counts(n), 2**n
    k, below = 0, 0
    while k < len(counts) and (below + counts[k]) / total <= tail:
        below += counts[k]
        k += 1
    return k


def paired_interval(old: Sequence[float], new: Sequence[float], confidence: float = CONFIDENCE) -> Shift:
    """The change ``log(new / old)`` of rounds measured in pairs, side by side in time.

    Each pair's log-ratio has the machine's drift between pairs taken out; the estimate is the
    one-sample Hodges-Lehmann one (the median of the Walsh averages of the pairs' log-ratios) and the
    interval inverts the Wilcoxon signed-rank test: exact, and finite from 6 pairs on at 95%.
    """
    if len(old) != len(new) or not old:
        raise ArgumentError("paired_interval needs the same number (>= 1) of rounds on each side")
    d = [math.log(y) - math.log(x) for x, y in zip(old, new)]
    walsh = sorted((d[i] + d[j]) / 2.0 for i in range(len(d)) for j in range(i, len(d)))
    estimate = statistics.median(walsh)
    k = signed_rank(len(d), confidence)
    if k == 0:
        return Shift(estimate, -math.inf, math.inf)
    return Shift(estimate, walsh[k - 1], walsh[-k])
