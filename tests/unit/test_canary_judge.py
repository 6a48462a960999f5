"""The canary judge's statistics on synthetic samples with known shifts and noise: a known
effect gives the known classification, and at no effect the false-failure rate, measured over
many seeded draws, stays within the test's level. The formulas are checked against
scipy.stats where it is installed (the dev extra), and against exact sums."""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Sequence

import pytest

from tfsdeploy.core.canary import judge, stats
from tfsdeploy.core.canary.judge import Classification, MetricResult, score

LIMITS = [10 * 1.8**i for i in range(33)]  # TFServing's latency buckets, us
DRAWS = 400
LEVEL = 1 - judge.CONFIDENCE  # 2 %, two-sided: 1 % on each side


def latencies(rng: random.Random, n: int, median_ms: float, *, cv: float = 0.25
              ) -> list[float]:
    """Right-skewed latencies (lognormal) around ``median_ms``."""
    return [median_ms * math.exp(rng.gauss(0.0, cv)) for _ in range(n)]


def histogram(values_ms: Sequence[float]) -> list[tuple[float, float]]:
    """The cumulative TFServing histogram (us) of ``values_ms``."""
    counts = [0] * (len(LIMITS) + 1)
    for value in values_ms:
        counts[bisect.bisect_right(LIMITS, value * 1000)] += 1
    bounds = [*LIMITS, math.inf]
    cumulative, total = [], 0
    for bound, count in zip(bounds, counts, strict=True):
        total += count
        cumulative.append((bound, float(total)))
    return cumulative


def upper_limit(rate: float, draws: int) -> float:
    """What a rate measured over ``draws`` reaches at most when its truth is ``rate`` (4
    standard deviations: a test failing by chance once in 30,000 runs)."""
    return rate + 4 * math.sqrt(rate * (1 - rate) / draws)


# -- the formulas ----------------------------------------------------------------------------


def test_the_exact_u_distribution_is_a_distribution() -> None:
    density = stats.u_distribution(5, 7)
    assert len(density) == 36 and sum(density) == pytest.approx(1.0)
    assert density == pytest.approx(density[::-1])  # symmetric about n_x n_y / 2
    assert density[0] == pytest.approx(1 / math.comb(12, 5))


@pytest.mark.parametrize(("n_x", "n_y"), [(5, 5), (7, 9), (20, 20), (60, 45), (300, 250)])
def test_mann_whitney_agrees_with_scipy(n_x: int, n_y: int) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(n_x * 1000 + n_y)
    x, y = latencies(rng, n_x, 11.0), latencies(rng, n_y, 10.0)
    ours = stats.mann_whitney(x, y)
    theirs = scipy_stats.mannwhitneyu(x, y, alternative="two-sided",
                                      method="exact" if ours.exact else "asymptotic")
    assert ours.u == theirs.statistic
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9)
    # Hodges-Lehmann: the median of every pairwise difference
    assert ours.estimate == pytest.approx(statistics.median(a - b for a in x for b in y))


def test_binomials_and_wilson_agree_with_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    for n, p, k in ((55, 0.01, 4), (100, 0.3, 20), (5000, 0.01, 70), (10, 0.5, 10)):
        assert stats.binomial_tail(n, p, k) == pytest.approx(scipy_stats.binom.sf(k - 1, n, p),
                                                             rel=1e-9)
        for prob in (0.005, 0.5, 0.995):
            assert stats.binomial_quantile(prob, n, p) == scipy_stats.binom.ppf(prob, n, p)
    for k, n in ((0, 50), (10, 100), (99, 100)):
        low, high = stats.wilson(k, n, confidence=0.98)
        ci = scipy_stats.binomtest(k, n).proportion_ci(0.98, "wilson")
        assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_the_shift_interval_covers_the_true_shift_at_its_confidence() -> None:
    rng = random.Random(7)
    covered = 0
    for _ in range(DRAWS):
        x = [v + 2.0 for v in latencies(rng, 30, 10.0)]  # shifted by exactly 2 ms
        test = stats.mann_whitney(x, latencies(rng, 40, 10.0))
        assert test.low is not None and test.high is not None
        covered += test.low <= 2.0 <= test.high
    assert covered / DRAWS >= judge.CONFIDENCE - 4 * math.sqrt(0.02 * 0.98 / DRAWS)


# -- latency: known effects, and the false-failure rate at none --------------------------------


def classify_latency(rng: random.Random, shift: float, n: int = 150) -> MetricResult:
    old = latencies(rng, n, 40.0)
    new = latencies(rng, n, 40.0 * (1 + shift))
    return judge.classify_shift("latency", old, new, allowed=0.10, slack=1.0, critical=True)


def test_a_release_25_percent_slower_is_high_every_time() -> None:
    rng = random.Random(25)
    results = [classify_latency(rng, 0.25) for _ in range(DRAWS)]
    assert all(r.classification is Classification.HIGH for r in results)
    effects = sorted(r.effect or 0.0 for r in results)
    assert 0.20 < effects[len(effects) // 2] < 0.30  # the estimate finds the shift


def test_a_release_5_percent_slower_passes() -> None:
    # over a full step's samples (the judge keeps 600 a side) the estimate's noise is ~2 %:
    # a 5 % shift stays under the 12.5 % allowed (10 % + 1 ms of 40 ms); over 150 samples it
    # would cross it in ~2 % of draws, as Kayenta's rule (the estimate against the threshold)
    # says it should
    rng = random.Random(5)
    results = [classify_latency(rng, 0.05, n=600) for _ in range(DRAWS // 4)]
    high = sum(r.classification is Classification.HIGH for r in results)
    assert high == 0, [r.describe() for r in results if r.classification is Classification.HIGH]


def test_at_no_effect_the_test_rejects_within_its_level_and_the_judge_fails_nothing() -> None:
    rng = random.Random(0)
    rejected = failed = 0
    for _ in range(DRAWS):
        old, new = latencies(rng, 100, 40.0), latencies(rng, 100, 40.0)
        test = stats.mann_whitney(new, old)
        assert test.low is not None and test.high is not None
        rejected += test.low > 0 or test.high < 0
        failed += judge.classify_shift("latency", old, new, allowed=0.10,
                                       slack=1.0).classification is Classification.HIGH
    assert rejected / DRAWS <= upper_limit(LEVEL, DRAWS)
    assert failed / DRAWS <= upper_limit(LEVEL / 2, DRAWS)


def test_too_few_samples_for_the_interval_are_no_data() -> None:
    result = judge.classify_shift("latency", [1.0, 2.0], [5.0, 6.0], allowed=0.1)
    assert result.classification is Classification.NODATA
    assert "too few samples for a 98% interval" in result.note


# -- the P99 of the live traffic's histograms -----------------------------------------------------


def test_a_tail_twice_as_slow_is_high_and_the_same_tail_passes() -> None:
    rng = random.Random(99)
    failures = passes = 0
    for _ in range(100):
        old = latencies(rng, 3000, 10.0)
        base = latencies(rng, 1000, 10.0)
        slow_tail = [v if v < 13.0 else v * 2.0 for v in base]  # the slowest ~15 % doubled
        failures += judge.classify_quantile(
            "p99", 0.99, histogram(old), histogram(slow_tail),
            allowed=0.2).classification is Classification.HIGH
        passes += judge.classify_quantile(
            "p99", 0.99, histogram(old), histogram(base),
            allowed=0.2).classification is Classification.PASS
    assert failures == 100
    assert passes >= 100 * (1 - upper_limit(LEVEL / 2, 100))


# -- errors ----------------------------------------------------------------------------------------


def test_errors_known_effect_and_no_effect() -> None:
    rng = random.Random(3)
    high = false = 0
    for _ in range(DRAWS):
        old = sum(rng.random() < 0.002 for _ in range(4000))
        worse = sum(rng.random() < 0.03 for _ in range(1000))
        same = sum(rng.random() < 0.002 for _ in range(1000))
        high += judge.classify_errors(old, 4000, worse, 1000,
                                      allowed=0.005).classification is Classification.HIGH
        test_low, _ = stats.newcombe(same, 1000, old, 4000, confidence=judge.CONFIDENCE)
        false += test_low > 0
    assert high == DRAWS
    assert false / DRAWS <= upper_limit(LEVEL / 2, DRAWS)


# -- the score ------------------------------------------------------------------------------


def metric(name: str, classification: Classification, critical: bool = False
           ) -> MetricResult:
    return MetricResult(name, classification, critical, "%")


def test_the_score_is_the_share_passing_and_critical_metrics_fail_alone() -> None:
    every = [metric("latency", Classification.PASS, True), metric("median", Classification.LOW),
             metric("p99", Classification.HIGH), metric("errors", Classification.PASS, True)]
    assert score(every, pass_score=95, marginal_score=75) == judge.Score(
        75.0, "marginal", "score 75 < 95 (p99 high)")
    assert score(every[:1] + every[2:3], pass_score=95, marginal_score=75).label == "fail"
    critical = [metric("latency", Classification.HIGH, True), *every[1:]]
    assert score(critical, pass_score=95, marginal_score=75).score == 0.0
    nodata = [metric("median", Classification.NODATA), every[0]]
    assert score(nodata, pass_score=95, marginal_score=75).label == "pass"
