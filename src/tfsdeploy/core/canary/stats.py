"""The nonparametric tests the canary's judge uses (pure, standard library only).

Why not scipy: scipy 1.17's wheel installs 143 MB (and needs numpy, 73 MB), about the whole size
budget of the toolkit's plain install, for four small formulas. The unit tier checks each one
against scipy.stats where scipy is installed (the ``dev`` extra), against exact sums, and by
the coverage of its intervals over seeded draws.

* ``mann_whitney``: the Mann-Whitney U test (Wilcoxon rank-sum) of two samples, with the
  Hodges-Lehmann estimate of the shift between them (the median of every pairwise difference)
  and its distribution-free confidence interval (Lehmann 1975; Bauer 1972, as R's
  ``wilcox.test(conf.int=TRUE)`` computes it: the k-th smallest and largest pairwise
  differences, k from the null distribution of U). Exact null distribution for small samples,
  the normal approximation with tie and continuity corrections beyond.
* ``wilson``: the Wilson score interval of a proportion; ``newcombe``: the interval of the
  difference of two proportions from the two Wilson intervals (Newcombe 1998, method 10).
* ``rate_test``: the exact conditional test of two error rates: given the errors of both
  slots together, the new slot's share of them is Binomial(errors, its share of requests).
* ``binomial_tail`` / ``binomial_quantile``: exact binomial tails in log space (n may be
  millions: requests), the normal approximation beyond ``EXACT_LIMIT`` terms.
* ``quantile_ranks``: the order statistics that bound a quantile with a given confidence
  (distribution-free: the rank of the q-quantile's sample is Binomial(n, q)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

_NORMAL = NormalDist()
EXACT_PAIRS = 400  # exact U distribution while n_x * n_y is at most this (no ties)
EXACT_LIMIT = 200_000  # binomial terms summed exactly up to this n


def z_quantile(p: float) -> float:
    """The standard normal's ``p`` quantile."""
    return _NORMAL.inv_cdf(p)


# -- Mann-Whitney U and the Hodges-Lehmann shift ------------------------------------------------


@dataclass(frozen=True)
class ShiftTest:
    """Sample ``x`` against sample ``y``: U of x, the two-sided p-value, the Hodges-Lehmann
    shift x - y and its confidence interval (``None`` bounds: the samples are too small for
    the interval at that confidence)."""

    u: float
    p_value: float
    estimate: float
    low: float | None
    high: float | None
    exact: bool  # the p-value and interval come from the exact null distribution


def ranks(values: Sequence[float]) -> list[float]:
    """Average ranks (1-based; tied values share the mean of their ranks)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for index in order[start:end + 1]:
            result[index] = (start + end) / 2 + 1
        start = end + 1
    return result


def _tie_term(values: Sequence[float]) -> float:
    """sum(t^3 - t) over the groups of tied values."""
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return float(sum(t ** 3 - t for t in counts.values() if t > 1))


def u_distribution(n_x: int, n_y: int) -> list[float]:
    """P(U = u) for u in 0..n_x*n_y under the null hypothesis (no ties): the number of
    arrangements of the two samples giving each U, over C(n_x + n_y, n_x)."""
    # counts[i][j][u]: arrangements of i x's and j y's with U = u; built row by row
    previous = [[1.0] for _ in range(n_y + 1)]  # i = 0: U is 0 whatever j
    for i in range(1, n_x + 1):
        current: list[list[float]] = [[1.0]]  # j = 0: U is 0
        for j in range(1, n_y + 1):
            # the largest value is an x (adds j to U) or a y (adds nothing)
            with_x, with_y = previous[j], current[j - 1]
            size = i * j + 1
            row = [0.0] * size
            for u, count in enumerate(with_y):
                row[u] += count
            for u, count in enumerate(with_x):
                row[u + j] += count
            current.append(row)
        previous = current
    counts = previous[n_y]
    total = math.comb(n_x + n_y, n_x)
    return [c / total for c in counts]


def mann_whitney(x: Sequence[float], y: Sequence[float], *, confidence: float = 0.98
                 ) -> ShiftTest:
    """The two-sided Mann-Whitney U test of ``x`` against ``y``, the Hodges-Lehmann estimate
    of the shift x - y and its ``confidence`` interval. Both samples must hold a value."""
    n_x, n_y = len(x), len(y)
    if not n_x or not n_y:
        raise ValueError("the Mann-Whitney test needs a value in each sample")
    pooled = [*x, *y]
    rank = ranks(pooled)
    u = sum(rank[:n_x]) - n_x * (n_x + 1) / 2
    pairs = n_x * n_y
    differences = sorted(a - b for a in x for b in y)
    estimate = _median_sorted(differences)
    ties = _tie_term(pooled)
    alpha = 1.0 - confidence
    if pairs <= EXACT_PAIRS and ties == 0:
        density = u_distribution(n_x, n_y)
        below = sum(density[:math.floor(u) + 1])  # P(U <= u)
        above = sum(density[math.ceil(u):])  # P(U >= u)
        p_value = min(1.0, 2 * min(below, above))
        # k: the largest count with P(U < k) <= alpha / 2 (R's qwilcox(alpha/2) + ... )
        cumulative, k = 0.0, 0
        while k < len(density) and cumulative + density[k] <= alpha / 2 + 1e-12:
            cumulative += density[k]
            k += 1
        exact = True
    else:
        n = n_x + n_y
        sigma = math.sqrt(pairs / 12 * ((n + 1) - ties / (n * (n - 1))))
        delta = u - pairs / 2
        if sigma == 0:
            p_value = 1.0
        else:
            z = (abs(delta) - 0.5) / sigma
            p_value = min(1.0, 2 * (1 - _NORMAL.cdf(max(z, 0.0))))
        k = math.floor(pairs / 2 - z_quantile(1 - alpha / 2) * sigma) if sigma else 0
        exact = False
    if k < 1:
        return ShiftTest(u, p_value, estimate, None, None, exact)
    return ShiftTest(u, p_value, estimate, differences[k - 1], differences[pairs - k], exact)


def _median_sorted(values: Sequence[float]) -> float:
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


# -- proportions --------------------------------------------------------------------------------


def wilson(successes: float, n: float, *, confidence: float = 0.98) -> tuple[float, float]:
    """The Wilson score interval of the proportion ``successes / n`` (``(0, 1)`` when n is
    0: nothing is known)."""
    if n <= 0:
        return 0.0, 1.0
    z = z_quantile(1 - (1 - confidence) / 2)
    phat = successes / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(k_new: float, n_new: float, k_old: float, n_old: float, *,
             confidence: float = 0.98) -> tuple[float, float]:
    """The interval of p_new - p_old from the two Wilson intervals (Newcombe's method 10)."""
    p_new = k_new / n_new if n_new else 0.0
    p_old = k_old / n_old if n_old else 0.0
    l_new, u_new = wilson(k_new, n_new, confidence=confidence)
    l_old, u_old = wilson(k_old, n_old, confidence=confidence)
    difference = p_new - p_old
    low = difference - math.sqrt((p_new - l_new) ** 2 + (u_old - p_old) ** 2)
    high = difference + math.sqrt((u_new - p_new) ** 2 + (p_old - l_old) ** 2)
    return max(-1.0, low), min(1.0, high)


def rate_test(k_new: int, n_new: int, k_old: int, n_old: int) -> float:
    """Two-sided p-value of equal rates: given the ``k_new + k_old`` events, the new slot's
    count is Binomial(k_new + k_old, n_new / (n_new + n_old)) when the rates are equal (the
    exact conditional test of two Poisson rates)."""
    total = k_new + k_old
    if total == 0 or n_new + n_old == 0:
        return 1.0
    share = n_new / (n_new + n_old)
    if share <= 0.0 or share >= 1.0:
        return 1.0
    upper = binomial_tail(total, share, k_new)
    lower = 1.0 - binomial_tail(total, share, k_new + 1)
    return min(1.0, 2 * min(upper, lower))


# -- the binomial --------------------------------------------------------------------------------


def binomial_tail(n: int, p: float, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, p), 0 < p < 1 (log-space terms: n may be millions)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if n > EXACT_LIMIT:
        sigma = math.sqrt(n * p * (1 - p))
        return 1 - _NORMAL.cdf((k - 0.5 - n * p) / sigma)
    log_p, log_q = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)

    def term(i: int) -> float:
        return math.exp(base - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        + i * log_p + (n - i) * log_q)

    mode = math.floor((n + 1) * p)
    total = 0.0
    if k > mode:  # the terms fall from k on: sum upwards until they vanish
        for i in range(k, n + 1):
            value = term(i)
            total += value
            if value < total * 1e-16:
                break
        return min(total, 1.0)
    for i in range(k - 1, -1, -1):  # below the mode: 1 - P(X < k), the terms fall downwards
        value = term(i)
        total += value
        if value < total * 1e-16:
            break
    return max(0.0, 1.0 - total)


def binomial_quantile(prob: float, n: int, p: float) -> int:
    """The smallest k with P(X <= k) >= prob, X ~ Binomial(n, p)."""
    if n > EXACT_LIMIT:
        sigma = math.sqrt(n * p * (1 - p))
        return max(0, min(n, math.ceil(n * p + z_quantile(prob) * sigma - 0.5)))
    low, high = 0, n
    while low < high:  # P(X <= k) = 1 - P(X >= k + 1) grows with k
        middle = (low + high) // 2
        if 1.0 - binomial_tail(n, p, middle + 1) >= prob - 1e-12:
            high = middle
        else:
            low = middle + 1
    return low


def quantile_ranks(n: int, q: float, *, confidence: float) -> tuple[int, int]:
    """1-based ranks (l, u) of the order statistics bounding the ``q`` quantile of ``n``
    samples with at least ``confidence``: P(X_(l) <= quantile <= X_(u)) >= confidence. ``l``
    is 0 or ``u`` is n + 1 when the samples are too few for that bound (unbounded)."""
    alpha = 1.0 - confidence
    low = binomial_quantile(alpha / 2, n, q)  # P(B < l) <= alpha / 2 with B ~ Binom(n, q)
    high = binomial_quantile(1 - alpha / 2, n, q) + 1
    return low, min(high, n + 1)
