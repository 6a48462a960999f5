"""The canary's pure core: step analysis arithmetic, weights, policy validation, the pause
state machine."""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfsdeploy.core.canary.stats import binomial_tail
from tfsdeploy.core.canary.steps import (
    TRANSITIONS,
    Action,
    CanaryRecord,
    CanaryState,
    PlanAction,
    Probes,
    SlotFigures,
    decide,
    fleet_state,
    judge,
    plan_abort,
    plan_promote,
    slot_figures,
    step_analysis,
    transition_problem,
)
from tfsdeploy.core.errors import ConfigError
from tfsdeploy.core.inventory.canary_policy import (
    CanaryPolicy,
    ComparisonPolicy,
    OutputRule,
    Verdict,
    parse_weights,
    validate_canary,
    weights_for,
)
from tfsdeploy.core.observe import guard

# TFServing's request_latency buckets: Buckets::Exponential(10, 1.8, 33), microseconds
# (tensorflow_serving/servables/tensorflow/util.cc)
LIMITS = [10 * 1.8**i for i in range(33)]


def metrics_text(latencies_us: Sequence[float], statuses: dict[str, int] | None = None,
                 model: str = "m") -> str:
    """What TFServing's exporter prints for ``latencies_us`` successful requests plus
    ``statuses`` other outcomes (prometheus_exporter.cc: cumulative buckets, +Inf last)."""
    counts = [0] * (len(LIMITS) + 1)
    for value in latencies_us:
        counts[bisect.bisect_right(LIMITS, value)] += 1  # first bucket whose limit is > v
    lines = ["# TYPE :tensorflow:serving:request_count counter",
             f':tensorflow:serving:request_count{{model_name="{model}",status="OK"}} '
             f"{len(latencies_us)}"]
    lines += [f':tensorflow:serving:request_count{{model_name="{model}",status="{s}"}} {n}'
              for s, n in (statuses or {}).items()]
    lines.append("# TYPE :tensorflow:serving:request_latency histogram")
    cumulative = 0
    for i, count in enumerate(counts):
        cumulative += count
        le = f"{LIMITS[i]:g}" if i < len(LIMITS) else "+Inf"
        lines.append(f':tensorflow:serving:request_latency_bucket{{model_name="{model}",'
                     f'API="Predict",entrypoint="GRPC",le="{le}"}} {cumulative}')
    return "\n".join(lines) + "\n"


def scrape(latencies_us: Sequence[float], statuses: dict[str, int] | None = None
           ) -> guard.Scrape:
    return guard.parse_metrics(metrics_text(latencies_us, statuses), "m")


EMPTY = scrape([])
POLICY = CanaryPolicy(min_requests=100, max_p99_ratio=1.2, max_error_rate_delta=0.005,
                      latency_slack_ms=0.0)


def spread(count: int, centre_us: float = 5000.0) -> list[float]:
    """``count`` latencies spread over +-40 % of ``centre_us`` (several buckets)."""
    return [centre_us * (0.6 + 0.8 * (i % 97) / 96) for i in range(count)]


def figures(ok: int, errors: int = 0, centre_us: float = 5000.0,
            restarted: bool = False) -> SlotFigures:
    """A slot's step: ``ok`` successful requests spread around ``centre_us``, ``errors``
    server errors."""
    after = scrape(spread(ok, centre_us), {"INTERNAL": errors} if errors else None)
    got = slot_figures(EMPTY, after)
    return SlotFigures(got.requests, got.errors, got.p50_ms, got.p99_ms, restarted,
                       got.latency)


def bucket_of(value_us: float) -> tuple[float, float]:
    """The bounds (ms) of the bucket TFServing puts ``value_us`` in."""
    index = bisect.bisect_right(LIMITS, value_us)
    lower = LIMITS[index - 1] if index else 0.0
    return lower / 1000, LIMITS[index] / 1000


# -- weights -------------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=100))
def test_weights_give_the_new_slot_exactly_its_share(weight: int) -> None:
    old, new = weights_for(weight)
    assert 0 <= old <= 256 and 0 <= new <= 256
    assert new / (old + new) == weight / 100


@pytest.mark.parametrize("bad", [-1, 101, 5.5, True, "5"])
def test_weights_outside_a_percentage_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="not a percentage from 0 to 100"):
        weights_for(bad)  # type: ignore[arg-type]


def test_weights_from_the_command_line() -> None:
    assert parse_weights("5,25,50") == (5, 25, 50)
    with pytest.raises(ConfigError, match="not a comma-separated list of integers") as err:
        parse_weights("5,x")
    assert err.value.problems[0].field == "--canary-weights"
    with pytest.raises(ConfigError, match="not strictly increasing"):
        parse_weights("25,5")
    with pytest.raises(ConfigError, match="100 not an integer from 1 to 99"):
        parse_weights("50,100")


# -- the figures of one slot ---------------------------------------------------------------


def test_histogram_deltas_measure_the_step_only() -> None:
    before = scrape([1000] * 500)  # 1 ms before the step
    after = scrape([1000] * 500 + [50_000] * 200, {"INTERNAL": 1})
    got = slot_figures(before, after)
    assert (got.requests, got.errors, got.restarted) == (201, 1, False)
    low, high = bucket_of(50_000)
    assert got.p50_ms is not None and got.p99_ms is not None
    assert low <= got.p50_ms <= high and low <= got.p99_ms <= high


def test_quantiles_interpolate_inside_the_bucket() -> None:
    # 100 samples in one bucket: the P50 is half-way, the P99 near its top, as Prometheus's
    # histogram_quantile reads a bucket; the guard's upper-bound reading stays the bound
    low, high = bucket_of(3000)
    got = slot_figures(EMPTY, scrape([3000] * 100))
    assert got.p50_ms == pytest.approx(low + (high - low) * 0.5)
    assert got.p99_ms == pytest.approx(low + (high - low) * 0.99)
    assert guard.window(EMPTY, scrape([3000] * 100)).p99_ms == pytest.approx(high)


def test_quantile_in_the_open_bucket_is_the_highest_finite_bound() -> None:
    cumulative = [(10.0, 0.0), (20.0, 1.0), (math.inf, 100.0)]
    assert guard.interpolated_quantile_ms(cumulative, 0.99) == 0.02
    assert guard.interpolated_quantile_ms([(10.0, 0.0), (math.inf, 0.0)], 0.5) is None


latency = st.floats(min_value=1, max_value=10_000_000, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(latency, max_size=50), st.lists(latency, min_size=1, max_size=200))
def test_delta_equals_a_fresh_histogram_of_the_step(earlier: list[float],
                                                    step: list[float]) -> None:
    delta = slot_figures(scrape(earlier), scrape(earlier + step))
    fresh = slot_figures(EMPTY, scrape(step))
    assert delta == fresh
    assert delta.requests == len(step)
    # the estimate lies in the bucket holding the true quantile (the ceil(q n)-th value)
    ordered = sorted(step)
    for q, estimate in ((0.5, delta.p50_ms), (0.99, delta.p99_ms)):
        low, high = bucket_of(ordered[math.ceil(q * len(ordered)) - 1])
        # TFServing prints bounds with 6 significant digits (absl::StrCat of a double)
        assert estimate is not None and low * (1 - 1e-5) <= estimate <= high * (1 + 1e-5)


def test_a_restart_counts_everything_since_it() -> None:
    # counted one by one, OK (600 >= 500) would look like 100 new requests: the restart is
    # seen from the INTERNAL counter and the buckets that went back
    before = scrape([1000] * 500, {"INTERNAL": 5})
    after = scrape([2000] * 600)
    got = slot_figures(before, after)
    assert got.restarted
    assert (got.requests, got.errors) == (600, 0)
    assert got == SlotFigures(600, 0, *_quantiles(after), restarted=True)


def _quantiles(after: guard.Scrape) -> tuple[float | None, float | None]:
    fresh = slot_figures(EMPTY, after)
    return fresh.p50_ms, fresh.p99_ms


counts = st.dictionaries(st.sampled_from(["OK", "INTERNAL", "UNAVAILABLE", "NOT_FOUND"]),
                         st.integers(min_value=0, max_value=10_000), min_size=1)


@settings(max_examples=80, deadline=None)
@given(counts, counts)
def test_counters_growing_are_a_delta_and_going_back_a_restart(
        first: dict[str, int], second: dict[str, int]) -> None:
    before = guard.Scrape({k: float(v) for k, v in first.items()}, {})
    grown = guard.Scrape({k: float(first.get(k, 0) + v) for k, v in second.items()}
                         | {k: float(v) for k, v in first.items() if k not in second}, {})
    delta = slot_figures(before, grown)
    assert not delta.restarted
    assert delta.requests == sum(v for k, v in second.items() if k != "NOT_FOUND")
    restart = guard.Scrape({k: float(v) for k, v in second.items()}, {})
    went_back = any(second.get(k, -1) < v for k, v in first.items())
    assert slot_figures(before, restart).restarted == went_back
    if went_back:
        assert slot_figures(before, restart) == slot_figures(EMPTY, restart)


def test_processes_of_a_slot_add_up() -> None:
    one_before, one_after = scrape([1000] * 10), scrape([1000] * 60)
    two_before, two_after = scrape([], {"INTERNAL": 2}), scrape([1000] * 50, {"INTERNAL": 3})
    got = slot_figures([one_before, two_before], [one_after, two_after])
    assert (got.requests, got.errors) == (101, 1)
    with pytest.raises(ValueError, match="one per serving process"):
        slot_figures([one_before, two_before], [one_after])


def test_client_errors_are_not_the_release_s() -> None:
    got = slot_figures(EMPTY, scrape([1000] * 100, {"INVALID_ARGUMENT": 900, "INTERNAL": 1}))
    assert (got.requests, got.errors) == (101, 1)


# -- a step's verdict ------------------------------------------------------------------------


def test_a_healthy_step_passes() -> None:
    result = step_analysis(EMPTY, scrape([5000] * 1900), EMPTY, scrape([5000] * 105), POLICY,
                           weight=5)
    assert result.verdict is Verdict.PASS and result.reasons == ()
    assert result.describe().startswith("canary 5%: pass, score 100; old 1900 req")
    assert "\n  p99 +0.0% [" in result.describe()  # a line per metric


def test_a_slower_new_slot_fails_naming_median_and_p99() -> None:
    result = judge(figures(2000), figures(120, centre_us=9000), POLICY)
    assert result.verdict is Verdict.FAIL, result.describe()
    assert result.reasons[0] == "score 33.33 < 75 (median, p99 high)"
    assert result.reasons[1].startswith("median +") and result.reasons[1].count(": high") == 1


def test_latency_slack_is_added_to_the_allowed_increase() -> None:
    # a 0.5 ms model at 0.7 ms: +40 %, nothing anybody notices; within 1 ms of slack
    old, new = figures(2000, centre_us=500), figures(200, centre_us=700)
    assert judge(old, new, CanaryPolicy(latency_slack_ms=1.0)).verdict is Verdict.PASS
    assert judge(old, new, POLICY).verdict is Verdict.FAIL


def test_one_slow_request_of_a_few_dozen_is_chance_not_a_slower_release() -> None:
    # a busy machine's step: 1 of the new slot's 55 requests waited for the scheduler, which
    # alone is its P99 (tb1, 5 % of a canary step: P99 new 28.3 ms > 1.5 x old 10.1 ms + 5 ms)
    policy = CanaryPolicy(min_requests=40, max_p99_ratio=1.5, latency_slack_ms=5.0)
    old, new = [4000] * 1040 + [9000] * 20, [4000] * 54 + [30000]
    result = step_analysis(EMPTY, scrape(old), EMPTY, scrape(new), policy)
    assert result.new.p99_ms is not None and result.old.p99_ms is not None
    assert result.new.p99_ms > 1.5 * result.old.p99_ms + 5.0  # beyond the limit ...
    assert result.verdict is Verdict.PASS, result.describe()  # ... by chance


def test_a_few_slow_requests_beyond_chance_fail() -> None:
    policy = CanaryPolicy(min_requests=40, max_p99_ratio=1.5, latency_slack_ms=5.0)
    old = [4000] * 1040 + [9000] * 20
    result = step_analysis(EMPTY, scrape(old), EMPTY, scrape([4000] * 51 + [30000] * 4),
                           policy)
    assert result.verdict is Verdict.FAIL, result.describe()
    assert result.reasons[0] == "score 66.67 < 75 (p99 high)", result.reasons
    assert result.reasons[1].startswith("p99 +"), result.reasons


def test_a_slower_release_fails_however_few_its_requests() -> None:
    policy = CanaryPolicy(min_requests=40, max_p99_ratio=1.5, latency_slack_ms=5.0)
    old = [4000] * 1040 + [9000] * 20
    result = step_analysis(EMPTY, scrape(old), EMPTY, scrape([45000] * 40), policy)
    assert result.verdict is Verdict.FAIL, result.describe()


def test_a_p99_beyond_the_limit_on_many_requests_needs_more_than_its_one_percent() -> None:
    policy = CanaryPolicy(min_requests=100, max_p99_ratio=1.2, latency_slack_ms=0.0)
    old = [4000] * 10_000
    chance = step_analysis(EMPTY, scrape(old), EMPTY, scrape([4000] * 9_880 + [30000] * 120),
                           policy)  # 1.2 %: within chance of a P99 at the limit over 10,000
    assert chance.verdict is Verdict.PASS, chance.describe()
    slower = step_analysis(EMPTY, scrape(old), EMPTY,
                           scrape([4000] * 9_700 + [30000] * 300), policy)  # 3 %
    assert slower.verdict is Verdict.FAIL, slower.describe()


@pytest.mark.parametrize(("n", "p", "k", "expected"), [
    (55, 0.01, 1, 1 - 0.99**55), (55, 0.01, 0, 1.0), (55, 0.01, 56, 0.0),
    (10, 0.5, 10, 0.5**10), (20, 0.3, 9, sum(math.comb(20, i) * 0.3**i * 0.7**(20 - i)
                                            for i in range(9, 21)))])
def test_the_binomial_tail(n: int, p: float, k: int, expected: float) -> None:
    assert binomial_tail(n, p, k) == pytest.approx(expected, rel=1e-9)


def test_the_binomial_tail_of_millions_of_requests() -> None:
    assert binomial_tail(2_000_000, 0.01, 20_001) == pytest.approx(0.5, abs=0.01)
    assert binomial_tail(2_000_000, 0.01, 21_000) < 1e-10


def test_the_median_and_latency_are_judged_unless_disabled() -> None:
    old, new = figures(2000), figures(300, centre_us=9000)
    assert {m.name for m in judge(old, new, POLICY, probes=Probes((1.0,), (1.0,))).metrics} \
        == {"latency", "median", "p99", "errors"}
    off = CanaryPolicy(max_p50_ratio=None, latency_slack_ms=0.0)
    assert {m.name for m in judge(old, new, off, probes=Probes((1.0,), (1.0,))).metrics} \
        == {"p99", "errors"}


def test_an_error_rate_beyond_the_allowed_increase_fails_alone() -> None:
    result = judge(figures(1998, errors=2), figures(190, errors=10), POLICY)
    assert result.verdict is Verdict.FAIL and result.score == 0.0
    (reason,) = result.reasons
    assert reason.startswith("errors +4.90pp [+2.33pp, +9.82pp] p=4.3e-09 (allowed +0.50pp): "
                             "high (critical)"), reason
    assert "old 2 of 2000 (0.10%), new 10 of 200 (5.00%)" in reason, reason
    # within chance, or within the allowed 0.5 point: pass
    assert judge(figures(1998, errors=2), figures(198, errors=2), POLICY).verdict \
        is Verdict.PASS
    assert judge(figures(19_980, errors=20), figures(19_900, errors=100), POLICY).verdict \
        is Verdict.PASS  # 0.5 % against 0.1 %: significant, but only +0.4 point


def test_too_few_requests_is_inconclusive_with_the_counts() -> None:
    result = judge(figures(2000), figures(12), POLICY)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reasons == ("too few requests: new slot 12 < min_requests 100",)
    both = judge(figures(40), figures(3), POLICY)
    assert both.reasons == ("too few requests: old slot 40, new slot 3 < min_requests 100",)


def test_few_requests_that_mostly_failed_fail_at_once() -> None:
    # 10 errors: even if the next 90 requests succeeded the rate would be 10 %
    result = judge(figures(2000), figures(0, errors=10), POLICY)
    assert result.verdict is Verdict.FAIL
    assert "new 10 of 100 (10.00%); the new slots' 10 requests counted as min_requests " \
           "100" in result.reasons[0], result.reasons
    # judged as if the step had reached min_requests: 1 error in 100 is no more than 2 %
    assert judge(figures(1960, errors=40), figures(9, errors=1), POLICY).verdict \
        is Verdict.INCONCLUSIVE


def test_no_latency_to_compare_is_inconclusive() -> None:
    result = judge(figures(0, errors=2000), figures(0, errors=200), POLICY)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reasons == ("no successful request on the old and new slot: latency "
                              "cannot be compared",)


def test_a_new_slot_that_restarted_fails() -> None:
    result = judge(figures(2000), figures(200, restarted=True), POLICY)
    assert result.verdict is Verdict.FAIL
    assert "new slot restarted" in result.reasons[0]
    assert judge(figures(2000, restarted=True), figures(200), POLICY).verdict is Verdict.PASS


def test_results_are_json() -> None:
    result = judge(figures(2000), figures(12), POLICY, probes=Probes((1.0, 2.0), (1.5,)))
    data = json.loads(json.dumps(result.as_dict(), allow_nan=False))
    assert data["verdict"] == "inconclusive" and data["new"]["requests"] == 12
    assert data["old"]["requests"] == 2000 and data["old"]["restarted"] is False
    metrics = {m["metric"]: m for m in data["metrics"]}
    assert set(metrics) == {"latency", "median", "p99", "errors"}
    assert set(metrics["median"]) == {"metric", "classification", "critical", "unit", "effect",
                                      "low", "high", "p_value", "allowed", "old", "new", "note"}


# -- what follows a verdict ------------------------------------------------------------------


def test_decisions_follow_the_inconclusive_policy() -> None:
    passed = judge(figures(2000), figures(200), POLICY)
    failed = judge(figures(2000), figures(200, centre_us=50_000), POLICY)
    short = judge(figures(2000), figures(12), POLICY)
    extend = CanaryPolicy(inconclusive="extend", max_extensions=2)
    assert decide(passed, extend, extensions=0).action is Action.NEXT
    stop = decide(failed, extend, extensions=0)
    assert stop.action is Action.STOP and "canary step 0% failed: score 33.33 < 75 (median, " \
        "p99 high)" in stop.reason, stop.reason
    assert decide(short, extend, extensions=0).action is Action.EXTEND
    assert decide(short, extend, extensions=1).action is Action.EXTEND
    last = decide(short, extend, extensions=2)
    assert last.action is Action.STOP and "inconclusive after 2 extensions" in last.reason
    assert decide(short, CanaryPolicy(inconclusive="fail"), extensions=0).action is Action.STOP
    assert decide(short, CanaryPolicy(inconclusive="pass"), extensions=0).action is Action.NEXT


def test_a_marginal_step_is_extended_then_fails() -> None:
    # the P99 alone is High, among four metrics: score 75, marginal
    old = figures(1000)
    tail = slot_figures(EMPTY, scrape(spread(460) + [60_000] * 40))
    result = judge(old, tail, POLICY, probes=Probes((5.0, 5.1, 4.9) * 30, (5.0, 5.1, 4.9) * 30))
    assert result.verdict is Verdict.MARGINAL and result.score == 75.0, result.describe()
    assert decide(result, POLICY, extensions=0).action is Action.EXTEND
    last = decide(result, POLICY, extensions=2)
    assert last.action is Action.STOP and "marginal after 2 extensions: score 75 < 95" \
        in last.reason, last.reason


# -- policy validation -----------------------------------------------------------------------


def test_the_default_policy_is_valid() -> None:
    assert validate_canary(CanaryPolicy()) == []
    assert CanaryPolicy(weights=[5, 50]).weights == (5, 50)  # type: ignore[arg-type]


@pytest.mark.parametrize("changes, field, words", [
    ({"weights": ()}, "weights", "non-empty"),
    ({"weights": (0, 50)}, "weights", "0 not an integer from 1 to 99"),
    ({"weights": (50, 25)}, "weights", "not strictly increasing"),
    ({"step_s": 0}, "step_s", "positive number of seconds"),
    ({"step_s": math.nan}, "step_s", "positive number of seconds"),
    ({"min_requests": 0}, "min_requests", "positive integer"),
    ({"max_p99_ratio": 0.9}, "max_p99_ratio", "ratio >= 1"),
    ({"max_p50_ratio": -1.0}, "max_p50_ratio", "ratio >= 1"),
    ({"max_error_rate_delta": 1.0}, "max_error_rate_delta", "fraction in [0, 1)"),
    ({"critical": ("latency", "cpu")}, "critical", "not a list of metric names"),
    ({"pass_score": 101}, "pass_score", "score from 0 to 100"),
    ({"marginal_score": 96}, "marginal_score", "above pass_score"),
    ({"latency_slack_ms": -1.0}, "latency_slack_ms", "ms >= 0"),
    ({"inconclusive": "retry"}, "inconclusive", "not one of extend, fail, pass"),
    ({"max_extensions": -1}, "max_extensions", "integer >= 0"),
    ({"pause": "yes"}, "pause", "True or False"),
    ({"comparison": ComparisonPolicy(samples=0)}, "comparison.samples", "positive integer"),
    ({"comparison": ComparisonPolicy(outputs={"y": OutputRule(kind="regressor", atol=-1)})},
     "comparison.outputs.y.atol", "number >= 0"),
])
def test_bad_values_are_located_with_their_fix(changes: dict[str, object], field: str,
                                               words: str) -> None:
    policy = CanaryPolicy(**changes)  # type: ignore[arg-type]
    problems = validate_canary(policy, field="models.m.rollout.canary", file="inv.py")
    assert len(problems) == 1, problems
    assert problems[0].field == f"models.m.rollout.canary.{field}"
    assert problems[0].file == "inv.py"
    assert words in problems[0].message and problems[0].fix


# -- the pause state machine -----------------------------------------------------------------


S = CanaryState


def test_transitions() -> None:
    assert transition_problem(S.RUNNING, S.PAUSED) is None
    assert transition_problem(S.PAUSED, S.PROMOTING) is None
    assert transition_problem(S.PROMOTING, S.DONE) is None
    assert transition_problem(S.PAUSED, S.ABORTING) is None
    assert transition_problem(S.ABORTING, S.ABORTED) is None
    assert transition_problem(S.PAUSED, S.DONE) == (
        "a canary paused cannot become done (from paused: aborting, promoting)")
    assert "from done: nothing (it is finished)" in str(transition_problem(S.DONE, S.PAUSED))


def test_promote_from_each_state() -> None:
    assert plan_promote(S.PAUSED, model="m").action is PlanAction.RUN
    resumed = plan_promote(S.PROMOTING, model="m")
    assert resumed.action is PlanAction.RUN and "interrupted" in resumed.message
    assert resumed.target is S.PROMOTING
    assert plan_promote(S.DONE, model="m").action is PlanAction.NOTHING
    for state in (None, S.RUNNING, S.ABORTING, S.ABORTED):
        plan = plan_promote(state, model="m")
        assert plan.action is PlanAction.REFUSE and plan.fix
    nothing = plan_promote(None, model="m").problem()
    assert nothing.message == "nothing is paused for model m"
    assert "fab deploy --model m --pause" in nothing.fix


def test_abort_from_each_state() -> None:
    for state in (S.RUNNING, S.PAUSED, S.ABORTING):
        plan = plan_abort(state, model="m")
        assert plan.action is PlanAction.RUN and plan.target is S.ABORTING
    assert plan_abort(S.ABORTED, model="m").action is PlanAction.NOTHING
    for recorded in (None, S.PROMOTING, S.DONE):
        plan = plan_abort(recorded, model="m")
        assert plan.action is PlanAction.REFUSE and plan.fix
    assert "fab promote --model m" in plan_abort(S.PROMOTING, model="m").fix


def _after(state: CanaryState, command: str) -> CanaryState:
    """A command run to its end: promote -> done, abort -> aborted."""
    plan = (plan_promote if command == "promote" else plan_abort)(state, model="m")
    if plan.action is not PlanAction.RUN:
        return state
    assert plan.target is not None and transition_problem(state, plan.target) is None
    final = S.DONE if command == "promote" else S.ABORTED
    assert transition_problem(plan.target, final) is None
    return final


@given(st.lists(st.sampled_from(["promote", "abort"]), max_size=6))
def test_commands_repeated_in_any_order_end_in_one_final_state(commands: list[str]) -> None:
    state = S.PAUSED
    for command in commands:
        state = _after(state, command)
    expected = S.PAUSED if not commands else S.DONE if commands[0] == "promote" else S.ABORTED
    assert state is expected  # the first command wins; the rest change nothing


def test_every_state_is_reachable_and_final_states_are_final() -> None:
    reached, frontier = {S.RUNNING}, [S.RUNNING]
    while frontier:
        for target in TRANSITIONS[frontier.pop()]:
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(S)
    assert TRANSITIONS[S.DONE] == TRANSITIONS[S.ABORTED] == frozenset()


def test_the_record_moves_only_where_the_machine_allows() -> None:
    record = CanaryRecord(state=S.RUNNING, weights=(5, 25), weight=5)
    paused = record.moved_to(S.PAUSED, at="2024-01-01T00:00:00+00:00", weight=25)
    assert (paused.state, paused.weight) == (S.PAUSED, 25)
    with pytest.raises(ValueError, match="a canary paused cannot become done"):
        paused.moved_to(S.DONE, at="now")
    # what a host returns is read back through the model
    again = CanaryRecord.model_validate(json.loads(json.dumps(paused.as_dict())))
    assert again == paused
    with pytest.raises(ValueError):
        CanaryRecord.model_validate({"state": "sleeping", "weights": [5], "weight": 5})


def test_hosts_that_disagree_resume_the_interrupted_command() -> None:
    assert fleet_state([None, None]) is None
    assert fleet_state([S.PAUSED, None, S.PAUSED]) is S.PAUSED
    assert fleet_state([S.PAUSED, S.PROMOTING]) is S.PROMOTING
    assert fleet_state([S.DONE, S.PAUSED]) is S.PROMOTING
    assert fleet_state([S.ABORTED, S.PAUSED]) is S.ABORTING
    assert fleet_state([S.ABORTED, S.PROMOTING]) is S.ABORTING
    assert fleet_state([S.RUNNING, S.PAUSED]) is S.RUNNING


# -- the report ---------------------------------------------------------------------------------


def test_the_table_and_json_show_each_metric_s_effect_interval_p_value_and_verdict() -> None:
    from tfsdeploy.cli.output import canary_rows
    from tfsdeploy.run.engine import HostOutcome, RunResult

    step = judge(figures(2000), figures(300, centre_us=9000), POLICY, weight=25,
                 probes=Probes(tuple(5.0 + i / 100 for i in range(100)),
                               tuple(9.0 + i / 100 for i in range(100)))).as_dict()
    result = RunResult("m", 2, "r2", hosts={"h1": HostOutcome(
        "h1", "reverted", canary={"steps": [json.loads(json.dumps(step))],
                                  "comparison": None})})
    rows = canary_rows(result)
    assert [r[2] for r in rows] == ["latency (critical)", "median", "p99", "errors (critical)"]
    assert rows[0][:2] == ("h1", "25% fail 0") and rows[1][:2] == ("", "")
    latency = rows[0]
    # the shift 4 ms over the old median 5.495 ms; its interval; p; +10 % allowed
    assert latency[3] == "+72.8%" and latency[4].count("%") == 2
    assert float(latency[5]) < 1e-6 and latency[6] == "+10.0%" and latency[7] == "high"
    data = json.loads(json.dumps(result.as_dict()))
    assert data["hosts"]["h1"]["canary"]["steps"][0]["metrics"][0]["metric"] == "latency"
