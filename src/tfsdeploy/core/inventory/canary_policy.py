"""A model's canary policy and its prediction-comparison policy (pure, light: the catalog
holds them). The analysis is in ``canary``, the comparison in ``compare``."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from tfsdeploy.core.errors import ConfigError, Problem, shown

Kind = Literal["regressor", "classifier", "exact"]
KINDS: tuple[str, ...] = ("regressor", "classifier", "exact")


class Verdict(StrEnum):
    """The outcome of a judgement (a canary step, a comparison)."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    MARGINAL = "marginal"  # a canary step whose score is between marginal and pass


@dataclass(frozen=True)
class OutputRule:
    """How one output is compared (see the module's docstring)."""

    kind: Kind
    atol: float = 1e-6
    rtol: float = 1e-6
    max_mismatch_fraction: float = 0.0  # regressor, exact
    max_agreement_drop: float = 0.0  # classifier: fraction of rows, 0.01 = 1 point


@dataclass(frozen=True)
class ComparisonPolicy:
    """Whether and how a canary's answers are compared with the old release's.

    The default tolerances are golden.py's: the new release must answer as the old one did
    (a new image, new batching or thread flags, a re-exported model). A retrained model is
    expected to answer differently: name its outputs in ``outputs`` with the tolerances that
    separate an acceptable change from a broken one.
    """

    enabled: bool = True
    samples: int = 200  # requests sent, golden ones first, then a sample of the corpus
    corpus: str | None = None  # TFRecord of PredictionLog, or JSON lines
    outputs: Mapping[str, OutputRule] = field(default_factory=dict)
    worst: int = 5  # worst examples reported per output
    seed: int = 0  # the corpus sample is the same on every host and every run

    def __post_init__(self) -> None:
        # read-only, as the catalog's other mappings (validation reports a non-mapping)
        if isinstance(self.outputs, Mapping):
            object.__setattr__(self, "outputs", MappingProxyType(dict(self.outputs)))


def validate_comparison(policy: ComparisonPolicy, *, field: str = "rollout.canary.comparison",
                        file: str | None = None) -> list[Problem]:
    """Every bad value of ``policy``, located under ``field``, each with its fix."""
    problems: list[Problem] = []

    def add(message: str, fix: str, name: str) -> None:
        problems.append(Problem(message, fix, file=file, field=f"{field}.{name}"))

    if not isinstance(policy.enabled, bool):
        add(f"enabled {shown(policy.enabled)} is not True or False", "write enabled=True",
            "enabled")
    if not _is_int(policy.samples) or policy.samples < 1:
        add(f"samples {shown(policy.samples)} is not a positive integer",
            "send a bounded sample, e.g. samples=200", "samples")
    if policy.corpus is not None and (not isinstance(policy.corpus, str)
                                      or not policy.corpus.strip()):
        add(f"corpus {shown(policy.corpus)} is not a file path",
            "name a TFRecord of PredictionLog or a JSON-lines file, or leave it None",
            "corpus")
    if not _is_int(policy.worst) or policy.worst < 0:
        add(f"worst {shown(policy.worst)} is not an integer >= 0",
            "report e.g. worst=5 examples per output", "worst")
    if not _is_int(policy.seed):
        add(f"seed {shown(policy.seed)} is not an integer", "write e.g. seed=0", "seed")
    if not isinstance(policy.outputs, Mapping):
        add(f"outputs {shown(policy.outputs)} is not a mapping of output name to OutputRule",
            "write outputs={'probabilities': OutputRule(kind='classifier')}", "outputs")
        return problems
    for name, rule in policy.outputs.items():
        problems += _rule_problems(rule, field=f"{field}.outputs.{name}", file=file)
    return problems


def _rule_problems(rule: object, *, field: str, file: str | None) -> list[Problem]:
    if not isinstance(rule, OutputRule):
        return [Problem(f"{shown(rule)} is not an OutputRule", "write OutputRule(kind='regressor', "
                        "atol=..., rtol=...)", file=file, field=field)]
    problems = []
    if rule.kind not in KINDS:
        problems.append(Problem(f"kind {shown(rule.kind)} is not one of {', '.join(KINDS)}",
                                "name how the output is compared", file=file,
                                field=f"{field}.kind"))
    for name in ("atol", "rtol"):
        value = getattr(rule, name)
        if not _is_number(value) or value < 0:
            problems.append(Problem(f"{name} {shown(value)} is not a number >= 0",
                                    f"write e.g. {name}=1e-6", file=file,
                                    field=f"{field}.{name}"))
    for name in ("max_mismatch_fraction", "max_agreement_drop"):
        value = getattr(rule, name)
        if not _is_number(value) or not 0 <= value <= 1:
            problems.append(Problem(f"{name} {shown(value)} is not a fraction in [0, 1]",
                                    f"write it as a fraction: {name}=0.01 is 1%", file=file,
                                    field=f"{field}.{name}"))
    return problems


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    # an int is finite whatever its size (math.isfinite of one beyond a float overflows)
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, int) or math.isfinite(value)))


# upper bounds: beyond them a value is a typo (and a number beyond a float overflows when
# the canary uses it)
MAX_STEP_S = 86_400.0
MAX_COUNT = 1_000_000_000
MAX_RATIO = 1000.0

Inconclusive = Literal["extend", "fail", "pass"]
INCONCLUSIVE_POLICIES: tuple[str, ...] = ("extend", "fail", "pass")


# the metrics a step classifies (core/canary/judge.py), as ``critical`` names them
METRIC_NAMES: tuple[str, ...] = ("latency", "median", "p99", "errors", "outputs")


@dataclass(frozen=True)
class CanaryPolicy:
    """How a model's canary moves traffic and judges each step (``Rollout.canary``).

    ``weights``: the canary host's share of requests sent to the new release at each step,
    percent, increasing (every instance of the host at that weight together).
    ``min_requests``: what the new slots and the old slots must each serve during a step for
    the step to count (else it is inconclusive: ``inconclusive`` says what follows).

    Each step classifies every metric High, Low or Pass as Kayenta does (core/canary/judge.py):
    a significant change (98 % interval) beyond the allowed increase is High.
    ``max_p50_ratio``: the latency the judge measures on both slots during the step (the
    Hodges-Lehmann shift of its requests: "latency") and the live traffic's median
    ("median") may grow to ratio x the old slots' + ``latency_slack_ms`` (None: neither is
    judged); ``max_p99_ratio``: the same for the live traffic's P99 ("p99");
    ``max_error_rate_delta``: the server-error rate ("errors") may grow by this fraction of
    requests (0.005 = 0.5 percentage point); the prediction comparison's outputs ("outputs")
    are judged by ``comparison``. The slack keeps sub-millisecond models from failing on
    scheduler jitter (a 0.5 ms P99 going to 0.7 ms is a ratio of 1.4 that nobody notices); a
    release slower by a real margin still fails.
    ``critical``: the metrics that fail a step alone; the others count in the score, the share
    of passing metrics: >= ``pass_score`` passes, >= ``marginal_score`` extends the step (more
    traffic to decide on, at most ``max_extensions`` times, then it fails), below it fails.
    """

    weights: tuple[int, ...] = (5, 25, 50)
    step_s: float = 60.0
    min_requests: int = 100
    max_p99_ratio: float = 1.2
    max_p50_ratio: float | None = 1.1
    max_error_rate_delta: float = 0.005
    latency_slack_ms: float = 1.0
    critical: tuple[str, ...] = ("latency", "errors", "outputs")
    pass_score: float = 95.0
    marginal_score: float = 75.0
    inconclusive: Inconclusive = "extend"
    max_extensions: int = 2
    pause: bool = False
    comparison: ComparisonPolicy = field(default_factory=ComparisonPolicy)

    def __post_init__(self) -> None:
        # an inventory may write weights=[5, 25]: keep the policy hashable and immutable
        for name in ("weights", "critical"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))


def validate_canary(policy: CanaryPolicy, *, field: str = "rollout.canary",
                    file: str | None = None) -> list[Problem]:
    """Every bad value of ``policy``, located under ``field`` (e.g.
    ``models.resnet50.rollout.canary``), each with its fix."""
    problems: list[Problem] = []

    def add(message: str, fix: str, name: str) -> None:
        problems.append(Problem(message, fix, file=file, field=f"{field}.{name}"))

    problems += _weight_problems(policy.weights, field=f"{field}.weights", file=file)
    if not _is_number(policy.step_s) or not 0 < policy.step_s <= MAX_STEP_S:
        add(f"step_s {shown(policy.step_s)} is not a positive number of seconds (at most a "
            "day)",
            "hold each weight step e.g. step_s=60", "step_s")
    if not _is_int(policy.min_requests) or not 1 <= policy.min_requests <= MAX_COUNT:
        add(f"min_requests {shown(policy.min_requests)} is not a positive integer "
            f"(at most {MAX_COUNT})",
            "set the requests each slot must serve per step, e.g. min_requests=100",
            "min_requests")
    for name, ratio in (("max_p99_ratio", policy.max_p99_ratio),
                        ("max_p50_ratio", policy.max_p50_ratio)):
        if ratio is None and name == "max_p50_ratio":
            continue
        if ratio is None or not _is_number(ratio) or not 1 <= ratio <= MAX_RATIO:
            add(f"{name} {shown(ratio)} is not a ratio >= 1 (below 1 fails a release exactly as "
                f"fast as the old one) and at most {MAX_RATIO:g}",
                f"allow the new slot e.g. {name}=1.2", name)
    if not _is_number(policy.max_error_rate_delta) or not 0 <= policy.max_error_rate_delta < 1:
        add(f"max_error_rate_delta {shown(policy.max_error_rate_delta)} is not a fraction "
            "in [0, 1)",
            "write it as a fraction of requests: 0.001 is 0.1 percentage point",
            "max_error_rate_delta")
    if not _is_number(policy.latency_slack_ms) or \
            not 0 <= policy.latency_slack_ms <= MAX_STEP_S * 1000:
        add(f"latency_slack_ms {shown(policy.latency_slack_ms)} is not a number of ms >= 0 "
            "(at most a day)",
            "set e.g. latency_slack_ms=1", "latency_slack_ms")
    problems += _judge_problems(policy, add)
    if policy.inconclusive not in INCONCLUSIVE_POLICIES:
        add(f"inconclusive {shown(policy.inconclusive)} is not one of "
            f"{', '.join(INCONCLUSIVE_POLICIES)}",
            "use 'extend' (default), 'fail' or 'pass'", "inconclusive")
    if not _is_int(policy.max_extensions) or not 0 <= policy.max_extensions <= MAX_COUNT:
        add(f"max_extensions {shown(policy.max_extensions)} is not an integer >= 0 "
            f"(at most {MAX_COUNT})",
            "set how many times a step with too little traffic is extended, e.g. 2",
            "max_extensions")
    if not isinstance(policy.pause, bool):
        add(f"pause {shown(policy.pause)} is not True or False",
            "write pause=True or pause=False", "pause")
    if not isinstance(policy.comparison, ComparisonPolicy):
        add(f"comparison {shown(policy.comparison)} is not a ComparisonPolicy",
            "write comparison=ComparisonPolicy(...)", "comparison")
    else:
        problems += validate_comparison(policy.comparison, field=f"{field}.comparison",
                                        file=file)
    return problems


def _judge_problems(policy: CanaryPolicy, add: Callable[[str, str, str], None]
                    ) -> list[Problem]:
    """The critical metrics, the score thresholds and the sampling interval (reported
    through ``add``; returns nothing of its own)."""
    critical = policy.critical
    if not isinstance(critical, tuple) or any(name not in METRIC_NAMES for name in critical):
        add(f"critical {shown(critical)} is not a list of metric names "
            f"({', '.join(METRIC_NAMES)})",
            "name the metrics that fail a step alone, e.g. critical=('latency', 'errors', "
            "'outputs')", "critical")
    scores = [(name, getattr(policy, name)) for name in ("pass_score", "marginal_score")]
    bad = [(name, value) for name, value in scores
           if not _is_number(value) or not 0 <= value <= 100]
    for name, value in bad:
        add(f"{name} {shown(value)} is not a score from 0 to 100",
            f"set e.g. {name}={95 if name == 'pass_score' else 75}", name)
    if not bad and policy.marginal_score > policy.pass_score:
        add(f"marginal_score {policy.marginal_score:g} is above pass_score "
            f"{policy.pass_score:g}", "keep marginal_score <= pass_score, e.g. 75 and 95",
            "marginal_score")
    return []


def _weight_problems(weights: object, *, field: str, file: str | None) -> list[Problem]:
    fix = "write increasing percentages from 1 to 99, e.g. weights=(5, 25, 50)"
    if not isinstance(weights, (tuple, list)) or not weights:
        return [Problem(f"weights {shown(weights)} is not a non-empty list of percentages", fix,
                        file=file, field=field)]
    bad = [w for w in weights if not _is_int(w) or not 1 <= w <= 99]
    if bad:
        return [Problem(f"weights {shown(tuple(weights))}: {', '.join(map(shown, bad))} not an "
                        "integer from 1 to 99 (100 is the full switch that follows the "
                        "last step)", fix, file=file, field=field)]
    if any(b <= a for a, b in itertools.pairwise(weights)):
        return [Problem(f"weights {shown(tuple(weights))} are not strictly increasing", fix,
                        file=file, field=field)]
    return []


def parse_weights(text: str, *, option: str = "--canary-weights") -> tuple[int, ...]:
    """``"5,25,50"`` -> ``(5, 25, 50)``; a ConfigError naming the option otherwise."""
    try:
        weights = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(Problem(f"{option} {shown(text)} is not a comma-separated list of "
                                  "integers", f"write e.g. {option} 5,25,50",
                                  field=option)) from None
    problems = _weight_problems(weights, field=option, file=None)
    if problems:
        raise ConfigError(problems)
    return weights


def weights_for(step_weight: int) -> tuple[int, int]:
    """HAProxy server weights (old, new) sending ``step_weight`` % of requests to the new
    slot: HAProxy shares requests in proportion to the weights (0..256), so percentages
    are exact weights (5 % -> old 95, new 5; 0 and 100 are the full switches)."""
    if not _is_int(step_weight) or not 0 <= step_weight <= 100:
        raise ValueError(f"canary weight {shown(step_weight)} is not a percentage from 0 to 100")
    return 100 - step_weight, step_weight
