"""Each metric of a canary step classified High, Low or Pass, and the step's score (pure).

The semantics are Kayenta's (spinnaker/kayenta, kayenta-judge), read there and written here
in our own terms:

* A metric is classified by comparing the canary (the new slots) with its baseline (the old
  slots of the same host, under the same traffic at the same moment: the baseline Kayenta
  recommends, deployed beside the canary rather than production at large).
* ``classifiers/metric/MannWhitneyClassifier.scala``: a two-sided Mann-Whitney U test with
  a confidence interval of the Hodges-Lehmann shift; High when the interval's lower bound is
  above ``tolerance`` x |estimate| AND the effect size reaches the allowed increase; Low the
  mirror image; Pass otherwise. ``NetflixACAJudge.scala`` builds it with ``tolerance = 0.25``
  and ``confLevel = 0.98``: ``TOLERANCE`` and ``CONFIDENCE`` here. Identical samples, or a
  single value in both, are Pass; an empty sample is NODATA (Kayenta's NaN strategy
  ``remove``, its default: NaN values are dropped, and a metric left with no value has no
  data).
* A critical metric that is not Pass fails the canary alone (``isCriticalMetric`` in
  MannWhitneyClassifier.scala; ``criticalFailures`` in ``scorers/WeightedSumScorer.scala``
  sets the score to 0), and a critical metric with no data fails it too.
* ``scorers/WeightedSumScorer.scala``: the score is the share of Pass among the classified
  metrics, in percent (NODATA left out); ``classifiers/score/ThresholdScoreClassifier.scala``:
  score >= pass -> Pass, >= marginal -> Marginal, else Fail.

Where this judge differs, and why:

* Direction: every metric here is harmful only when it grows (latency, errors, differing
  answers: Kayenta's ``direction: increase``, under which it never classifies Low). Low is
  still reported (the new release is significantly better), and counts as passing.
* The effect size is read in the metric's own terms (a relative shift of latency, a
  difference of error rates in points, a share of differing answers) against the policy's
  allowed increase, instead of Kayenta's mean ratio or CLES: an operator sets "median +10 %".
* What is measured. TFServing's metrics (``:tensorflow:serving:request_latency``) are a
  histogram whose buckets grow by 1.8x (``Buckets::Exponential(10, 1.8, 33)``,
  servables/tensorflow/util.cc) and a ``_sum`` printed with 6 significant digits
  (util/prometheus_exporter.cc: ``absl::StrCat`` of a double): neither resolves a 10 %
  shift (40 and 50 ms share one bucket; a long-lived server's sum moves in steps of seconds).
  So ``latency`` is measured by the judge itself: during the step it sends the same request
  to each old slot and each new slot of the host in turn (``stats.mann_whitney`` on those
  per-request latencies, as many on each side, taken at the same moments under the same live
  load: the equal-sized baseline Kayenta asks for). The live traffic's histograms give
  ``median`` and ``p99`` (each quantile bounded by distribution-free order-statistic
  intervals: their rank is Binomial(n, q)), its counters the server ``errors`` (the
  difference of two proportions with Newcombe's interval, an exact conditional binomial
  test). The same Kayenta rule classifies all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from tfsdeploy.core.canary import stats

if TYPE_CHECKING:
    from tfsdeploy.core.inventory.canary_policy import OutputRule

CONFIDENCE = 0.98  # NetflixACAJudge.scala: confLevel = 0.98
TOLERANCE = 0.25  # NetflixACAJudge.scala: tolerance = 0.25 (a fraction of the estimate)
METRICS = ("latency", "median", "p99", "errors", "outputs")  # what ``critical`` may name


class Classification(StrEnum):
    """One metric's classification (Kayenta's labels)."""

    HIGH = "high"  # significantly higher than the old slots, beyond the allowed increase
    LOW = "low"  # significantly lower beyond it (better: these metrics harm only upwards)
    PASS = "pass"
    NODATA = "nodata"  # the metric could not be computed (why: the result's note)


@dataclass(frozen=True)
class MetricResult:
    """One metric of one step: the effect (new against old), its interval, the p-value, the
    allowed increase and the classification; ``old``/``new`` are each side's own figure."""

    name: str  # latency, median, p99, errors, or "output <name>"
    classification: Classification
    critical: bool
    unit: str  # "%": a relative shift (0.1 = +10 %); "pp": points of a rate; "share"
    effect: float | None = None
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    allowed: float | None = None
    old: float | None = None
    new: float | None = None
    note: str = ""

    @property
    def failing(self) -> bool:
        """High (the only harmful classification), or NODATA on a critical metric."""
        return self.classification is Classification.HIGH or (
            self.critical and self.classification is Classification.NODATA)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready result (an unbounded interval side is null)."""
        return {"metric": self.name, "classification": str(self.classification),
                "critical": self.critical, "unit": self.unit, "effect": _round(self.effect),
                "low": _round(self.low), "high": _round(self.high),
                "p_value": _significant(self.p_value), "allowed": _round(self.allowed),
                "old": _round(self.old), "new": _round(self.new), "note": self.note}

    def describe(self) -> str:
        """``median +25.1% [+20.3%, +29.8%] p=0.0001 > allowed +12.5%: high (critical)``."""
        tag = " (critical)" if self.critical else ""
        if self.classification is Classification.NODATA:
            return f"{self.name}: nodata{tag}: {self.note}"
        interval = f" [{self.format(self.low, -1)}, {self.format(self.high, 1)}]"
        p_value = "" if self.p_value is None else f" p={_p(self.p_value)}"
        allowed = "" if self.allowed is None else f" (allowed +{self.format(self.allowed, 0)[1:]})"
        figures = f"; {self.note}" if self.note else ""
        return (f"{self.name} {self.format(self.effect, 0)}{interval}{p_value}{allowed}: "
                f"{self.classification}{tag}{figures}")

    def format(self, value: float | None, side: int) -> str:
        """An effect or a bound in the metric's unit (``side``: -1 lower, 1 upper bound)."""
        if value is None:
            return "-inf" if side < 0 else "+inf"
        if self.unit == "pp":
            return f"{value * 100:+.2f}pp"
        if self.unit == "%":
            return f"{value * 100:+.1f}%"
        return f"{value:+.2%}"


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _significant(value: float | None) -> float | None:
    """A p-value to 3 significant digits (a tiny one stays a tiny number, never 0)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.3g}")


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def kayenta_rule(effect: float, low: float | None, high: float | None, allowed: float
                 ) -> Classification:
    """MannWhitneyClassifier.scala's rule: High when the interval's lower bound is above
    ``TOLERANCE`` x |effect| and the effect is beyond the allowed increase; Low the mirror."""
    if low is not None and low > TOLERANCE * abs(effect) and effect > allowed:
        return Classification.HIGH
    if high is not None and high < -TOLERANCE * abs(effect) and effect < -allowed:
        return Classification.LOW
    return Classification.PASS


# -- latency: per-request samples, Mann-Whitney U and Hodges-Lehmann ----------------------------


def classify_shift(name: str, old: Sequence[float], new: Sequence[float], *,
                   allowed: float, slack: float = 0.0, critical: bool = False) -> MetricResult:
    """The new slots' samples (per-request latencies, ms) against the old slots': the
    Hodges-Lehmann shift relative to the old samples' median, its ``CONFIDENCE`` interval and
    the Mann-Whitney p-value. ``allowed``: the relative increase allowed; ``slack``: an
    absolute one in the samples' unit, added to it (a 0.5 ms model is not failed on a 0.3 ms
    scheduler hiccup)."""
    values = {"old": [v for v in old if math.isfinite(v)],
              "new": [v for v in new if math.isfinite(v)]}  # Kayenta's NaN strategy: remove
    base = _median(values["old"]) if values["old"] else None
    result = MetricResult(name, Classification.NODATA, critical, "%",
                          old=base, new=_median(values["new"]) if values["new"] else None)
    if not values["old"] or not values["new"]:
        return _with(result, note=f"no sample from the "
                                  f"{'old' if not values['old'] else 'new'} slots")
    if sorted(values["old"]) == sorted(values["new"]) or len(set(values["old"])
                                                            | set(values["new"])) == 1:
        return _with(result, classification=Classification.PASS, effect=0.0, low=0.0,
                     high=0.0, p_value=1.0, note="identical samples")
    test = stats.mann_whitney(values["new"], values["old"], confidence=CONFIDENCE)
    scale = base if base else 1.0
    relative_allowed = allowed + slack / scale
    effect = test.estimate / scale
    low = None if test.low is None else test.low / scale
    high = None if test.high is None else test.high / scale
    figures = (f"median old {_ms(base)}, new {_ms(result.new)} over {len(values['old'])}/"
               f"{len(values['new'])} requests")
    if test.low is None or test.high is None:
        return _with(result, effect=effect, p_value=test.p_value, allowed=relative_allowed,
                     note=f"too few samples for a {CONFIDENCE:.0%} interval ({figures})")
    return _with(result, classification=kayenta_rule(effect, low, high, relative_allowed),
                 effect=effect, low=low, high=high, p_value=test.p_value,
                 allowed=relative_allowed, note=figures)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f} ms" if value >= 100 else f"{value:.3g} ms"


def _with(result: MetricResult, **changes: Any) -> MetricResult:
    return MetricResult(**{**result.__dict__, **changes})


# -- a tail quantile from the step's histograms -------------------------------------------------


Histogram = Sequence[tuple[float, float]]  # cumulative (upper bound in us, count)


def value_at_rank(cumulative: Histogram, rank: float) -> float | None:
    """The ``rank``-th smallest sample (1-based, fractional allowed) of a cumulative
    histogram, in ms, the samples spread evenly in their bucket (as
    ``guard.interpolated_quantile_ms``); None beyond the samples or in the open +Inf
    bucket (the value is unbounded)."""
    if not cumulative or rank > cumulative[-1][1] or rank <= 0:
        return None
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank and count > below:
            if not math.isfinite(bound):
                return None
            return (lower + (bound - lower) * (rank - below) / (count - below)) / 1000.0
        lower, below = bound, count
    return None


def count_above(cumulative: Histogram, limit_ms: float) -> float:
    """How many samples are above ``limit_ms`` (spread evenly in their bucket)."""
    limit = limit_ms * 1000.0
    total = cumulative[-1][1] if cumulative else 0.0
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if limit < bound:
            if not math.isfinite(bound):
                return total - below
            return total - (below + (count - below) * (limit - lower) / (bound - lower))
        lower, below = bound, count
    return total - below


def classify_quantile(name: str, q: float, old: Histogram, new: Histogram, *, allowed: float,
                      slack_ms: float = 0.0, critical: bool = False) -> MetricResult:
    """The new slots' ``q`` quantile against the old slots', over the step's requests.

    Effect: new / old - 1. Interval: each quantile bounded by order statistics at
    ``1 - (1 - CONFIDENCE) / 2`` (their rank is Binomial(n, q) whatever the distribution),
    the ratio's interval from the four bounds (so at least ``CONFIDENCE`` jointly). p-value:
    how unlikely the new slots' count of requests above the old quantile is if their quantile
    were the old one (two-sided binomial).
    """
    n_old = old[-1][1] if old else 0.0
    n_new = new[-1][1] if new else 0.0
    q_old = value_at_rank(old, max(q * n_old, 1.0)) if n_old else None
    q_new = value_at_rank(new, max(q * n_new, 1.0)) if n_new else None
    result = MetricResult(name, Classification.NODATA, critical, "%", old=q_old, new=q_new)
    if not q_old or q_new is None:
        side = "old" if not q_old else "new"
        return _with(result, note=f"no {name} on the {side} slots (no successful request, "
                                  "or all in the open bucket)")
    single = 1 - (1 - CONFIDENCE) / 2
    old_low, old_high = _quantile_bounds(old, round(n_old), q, single)
    new_low, new_high = _quantile_bounds(new, round(n_new), q, single)
    effect = q_new / q_old - 1
    low = None if new_low is None or old_high is None else new_low / old_high - 1
    high = None if new_high is None or not old_low else new_high / old_low - 1
    above = round(count_above(new, q_old))
    served = round(n_new)
    expected = 1.0 - q
    p_up = stats.binomial_tail(served, expected, above)
    p_down = 1.0 - stats.binomial_tail(served, expected, above + 1)
    relative_allowed = allowed + slack_ms / q_old
    figures = f"old {_ms(q_old)} over {round(n_old)} req, new {_ms(q_new)} over {served} req"
    return _with(result, classification=kayenta_rule(effect, low, high, relative_allowed),
                 effect=effect, low=low, high=high, p_value=min(1.0, 2 * min(p_up, p_down)),
                 allowed=relative_allowed, note=figures)


def _quantile_bounds(cumulative: Histogram, n: int, q: float, confidence: float
                     ) -> tuple[float | None, float | None]:
    low_rank, high_rank = stats.quantile_ranks(n, q, confidence=confidence)
    low = value_at_rank(cumulative, low_rank) if low_rank >= 1 else 0.0
    high = value_at_rank(cumulative, high_rank) if high_rank <= n else None
    return low, high


# -- server errors -------------------------------------------------------------------------------


def classify_errors(old_errors: int, old_requests: int, new_errors: int, new_requests: int,
                    *, allowed: float, critical: bool = False) -> MetricResult:
    """The new slots' server-error rate against the old slots': the difference in points,
    its Newcombe interval, the exact conditional binomial test's p-value; ``allowed``: the
    increase allowed, a fraction (0.005 = 0.5 point)."""
    old_rate = old_errors / old_requests if old_requests else 0.0
    new_rate = new_errors / new_requests if new_requests else 0.0
    result = MetricResult("errors", Classification.NODATA, critical, "pp", old=old_rate,
                          new=new_rate, allowed=allowed)
    if not old_requests or not new_requests:
        return _with(result, note="no request on the "
                                  f"{'old' if not old_requests else 'new'} slots")
    low, high = stats.newcombe(new_errors, new_requests, old_errors, old_requests,
                               confidence=CONFIDENCE)
    effect = new_rate - old_rate
    figures = (f"old {old_errors} of {old_requests} ({old_rate:.2%}), new {new_errors} of "
               f"{new_requests} ({new_rate:.2%})")
    classification = Classification.PASS if old_errors == new_errors == 0 else \
        kayenta_rule(effect, low, high, allowed)
    return _with(result, classification=classification, effect=effect, low=low, high=high,
                 p_value=stats.rate_test(new_errors, new_requests, old_errors, old_requests),
                 note=figures)


# -- the prediction comparison's outputs ---------------------------------------------------------


def output_metric(figure: Mapping[str, Any], *, rule: OutputRule | None, critical: bool
                  ) -> MetricResult:
    """One compared output (``OutputFigure.as_dict()``: what the record keeps) as a metric:
    the share of differing values (rows, for a classifier) with its Wilson interval and the
    binomial test against the share its rule allows (``rule``: the policy's, None: the
    default tolerances); its classification is the comparison's own verdict (High when it
    failed)."""
    kind, noise = str(figure["kind"]), float(figure["noise"])
    compared, differing = int(figure["compared"]), int(figure["differing"])
    fraction = rule.max_agreement_drop if rule and kind == "classifier" else (
        rule.max_mismatch_fraction if rule else 0.0)
    # classifier: noise is the old slot's agreement with itself; exact: its own unequal share
    allowed = min(1.0, (1.0 - noise if kind == "classifier" else
                        noise if kind == "exact" else 0.0) + fraction)
    low, high = stats.wilson(differing, compared, confidence=CONFIDENCE)
    if 0 < allowed < 1 and compared:
        p_value = stats.binomial_tail(compared, allowed, differing)
    else:
        p_value = 1.0 if differing <= allowed * compared else 0.0
    rate = differing / compared if compared else 0.0
    note = f"{differing} of {compared} differ ({kind})"
    if not figure["ok"]:
        note += f": {figure['reason']}"
    return MetricResult(f"output {figure['name']}",
                        Classification.PASS if figure["ok"] else Classification.HIGH, critical,
                        "share", effect=rate, low=low, high=high, p_value=p_value,
                        allowed=allowed, new=rate, note=note)


# -- the score ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """The step's score (percent of passing metrics, 0 on a critical failure) and what it
    classifies as against the policy's thresholds."""

    score: float
    label: str  # pass, marginal, fail
    reason: str = ""


def score(metrics: Sequence[MetricResult], *, pass_score: float, marginal_score: float
          ) -> Score:
    """WeightedSumScorer.scala (one group) and ThresholdScoreClassifier.scala."""
    critical = [m for m in metrics if m.critical and m.failing]
    if critical:
        return Score(0.0, "fail", f"critical {critical[0].name} {critical[0].classification}")
    counted = [m for m in metrics if m.classification is not Classification.NODATA]
    if not counted:
        return Score(100.0, "pass", "no metric could be classified")
    passing = sum(1 for m in counted if m.classification is not Classification.HIGH)
    value = round(100.0 * passing / len(counted), 2)
    if value >= pass_score:
        return Score(value, "pass")
    failing = ", ".join(m.name for m in counted if m.classification is Classification.HIGH)
    label = "marginal" if value >= marginal_score else "fail"
    threshold = pass_score if label == "marginal" else marginal_score
    return Score(value, label, f"score {value:g} < {threshold:g} ({failing} high)")
