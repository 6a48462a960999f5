"""Weighted canary steps on one host, judged new slot against old slot (pure).

During a canary the host's proxy sends ``w`` % of the stable ports' requests to the new slot
and the rest to the old one, so both serve the same traffic at the same moment. Each step is
judged from the two slots' own TFServing metrics scraped at the start and the end of the
step (``guard.Scrape``): server-side error rate (client errors left out, as the guard does),
and P50/P99 from the ``request_latency`` histogram deltas. The scraping, the proxy's runtime
commands (``proxy.weight_commands``) and the records' writing are the caller's.

Inconclusive steps (a slot served fewer than ``min_requests``): the default is to ``extend``
the step (keep the step's first scrapes and scrape again after another ``step_s``, so the
counts add up) at most ``max_extensions`` times, then to fail. Too little traffic is no
evidence that a release is healthy, so passing by default would let a release through
unjudged; failing at once would stop every deploy made in a quiet hour; a bounded extension
gives traffic time to accumulate and never lets a run hang.

A paused canary's state is recorded on its hosts (``CanaryRecord``, kept in the release
record): running -> paused -> promoting -> done, or (running | paused) -> aborting ->
aborted. ``plan_promote`` and ``plan_abort`` say what a command does from a recorded state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from tfsdeploy.core.errors import Problem
from tfsdeploy.core.inventory.canary_policy import (
    CanaryPolicy,
    Verdict,
    weights_for,
)
from tfsdeploy.core.observe import guard

# -- one slot's figures over one step ------------------------------------------------------


@dataclass(frozen=True)
class SlotFigures:
    """What one slot served between two scrapes (summed over its serving processes)."""

    requests: int  # server-side outcomes: client errors are left out
    errors: int
    p50_ms: float | None  # of successful requests (TFServing records no latency for errors)
    p99_ms: float | None
    restarted: bool = False  # a process restarted: its figures start at the restart
    # the successful requests' cumulative latency histogram, (bound in us, count): what the
    # significance of a quantile's excess is read from (empty: judged on the quantile alone)
    latency: tuple[tuple[float, float], ...] = field(default=(), compare=False, repr=False)

    @property
    def error_rate(self) -> float:
        """Errors over requests (0 with no requests)."""
        return self.errors / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures."""
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": self.error_rate, "p50_ms": _rounded(self.p50_ms),
                "p99_ms": _rounded(self.p99_ms), "restarted": self.restarted}

    def describe(self) -> str:
        """``1900 req, 0.05% errors, P50 1.2 ms, P99 4.1 ms``."""
        text = (f"{self.requests} req, {self.error_rate:.2%} errors, P50 {_ms(self.p50_ms)}, "
                f"P99 {_ms(self.p99_ms)}")
        return text + (", restarted" if self.restarted else "")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f} ms" if value >= 100 else f"{value:.3g} ms"


ScrapeSet: TypeAlias = guard.Scrape | Sequence[guard.Scrape]
_EMPTY = guard.Scrape(requests={}, buckets={})


def _as_list(scrapes: ScrapeSet) -> list[guard.Scrape]:
    return [scrapes] if isinstance(scrapes, guard.Scrape) else list(scrapes)


def slot_figures(before: ScrapeSet, after: ScrapeSet) -> SlotFigures:
    """One slot's figures between two scrapes of each of its processes (one scrape per
    serving instance, in the same order before and after).

    A process that restarted in between counted everything since the restart: its ``after``
    scrape is then the whole increase (the counts before the restart are lost with it).
    """
    befores, afters = _as_list(before), _as_list(after)
    if len(befores) != len(afters):
        raise ValueError(f"{len(befores)} scrapes before but {len(afters)} after: pass one "
                         "per serving process, in the same order")
    requests = errors = 0.0
    summed: dict[float, float] = {}
    restarted = False
    for first, last in zip(befores, afters, strict=True):
        if guard.restarted(first, last):
            restarted, first = True, _EMPTY
        part = guard.window(first, last)
        requests += part.total
        errors += part.errors
        for bound, count in guard.bucket_deltas(first, last):
            summed[bound] = summed.get(bound, 0.0) + count
    cumulative = sorted(summed.items())
    return SlotFigures(requests=round(requests), errors=round(errors),
                       p50_ms=guard.interpolated_quantile_ms(cumulative, 0.50),
                       p99_ms=guard.interpolated_quantile_ms(cumulative, 0.99),
                       restarted=restarted, latency=tuple(cumulative))


# -- a step's verdict ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """Both slots' figures over one step and the verdict; what the progress line, ``--json``
    and the release record show."""

    weight: int
    old: SlotFigures
    new: SlotFigures
    verdict: Verdict
    reasons: tuple[str, ...] = ()  # each failing figure (fail) or what is missing

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready result."""
        return {"weight": self.weight, "verdict": str(self.verdict),
                "reasons": list(self.reasons), "old": self.old.as_dict(),
                "new": self.new.as_dict()}

    def describe(self) -> str:
        """One line: verdict, reasons, both slots' figures."""
        head = f"canary {self.weight}%: {self.verdict}"
        if self.reasons:
            head += f" ({'; '.join(self.reasons)})"
        return f"{head}; old {self.old.describe()} | new {self.new.describe()}"


def step_analysis(old_before: ScrapeSet, old_after: ScrapeSet, new_before: ScrapeSet,
                  new_after: ScrapeSet, policy: CanaryPolicy, *, weight: int = 0
                  ) -> StepResult:
    """Judge one step from the two slots' scrapes taken at its start and its end (each a
    ``guard.Scrape``, or one per serving process)."""
    return judge(slot_figures(old_before, old_after), slot_figures(new_before, new_after),
                 policy, weight=weight)


def judge(old: SlotFigures, new: SlotFigures, policy: CanaryPolicy, *, weight: int = 0
          ) -> StepResult:
    """The verdict on two slots' figures over the same interval.

    Fail: the new slot restarted, or its error rate or a latency quantile is beyond the
    policy (each failing figure named with both values). Inconclusive: a slot served fewer
    than ``min_requests`` (unless the new slot's errors already fail it whatever the rest
    of its requests do), or no latency can be compared.
    """
    failures: list[str] = []
    if new.restarted:
        failures.append("new slot restarted during the step (its counters went back to 0)")
    if old.requests >= policy.min_requests:
        failures += _error_failure(old, new, policy)
    enough = old.requests >= policy.min_requests and new.requests >= policy.min_requests
    if enough:
        failures += _latency_failures(old, new, policy)
    if failures:
        return StepResult(weight, old, new, Verdict.FAIL, tuple(failures))
    missing = _missing(old, new, policy.min_requests)
    if missing:
        return StepResult(weight, old, new, Verdict.INCONCLUSIVE, (missing,))
    return StepResult(weight, old, new, Verdict.PASS)


def _error_failure(old: SlotFigures, new: SlotFigures, policy: CanaryPolicy) -> list[str]:
    """The error-rate failure, if any. With fewer than ``min_requests`` the new slot's errors
    are judged as if the step had reached ``min_requests`` with every further request
    successful: a release failing most requests at a low weight is stopped at once instead
    of waiting for traffic (or passing under ``inconclusive="pass"``)."""
    allowed = old.error_rate + policy.max_error_rate_delta
    short = new.requests < policy.min_requests
    rate = new.errors / policy.min_requests if short else new.error_rate
    if rate <= allowed:
        return []
    figure = (f"at least {rate:.2%} ({new.errors} errors in {new.requests} of min_requests "
              f"{policy.min_requests})" if short
              else f"{rate:.2%} ({new.errors} of {new.requests})")
    return [f"error rate new {figure} > old {old.error_rate:.2%} ({old.errors} of "
            f"{old.requests}) + {policy.max_error_rate_delta * 100:g} pp"]


# a latency quantile beyond its limit fails the step only when the new slot's requests above
# the limit are more than a quantile at the limit would give by chance more than 1 % of the time
SIGNIFICANCE = 0.01


def _latency_failures(old: SlotFigures, new: SlotFigures, policy: CanaryPolicy) -> list[str]:
    """Each quantile of the new slot beyond ``ratio`` x the old slot's + the slack, when the
    excess is significant.

    A quantile of a few dozen requests is its slowest request: the P99 of 55 requests is
    the 55th, so one request delayed by the scheduler puts it beyond any ratio, while the old
    slot's P99, over many more requests, leaves its slowest 1 % out. So a quantile ``q``
    beyond the limit fails only when the new slot served more requests above the limit than
    ``Binomial(requests, 1 - q)`` reaches with probability ``SIGNIFICANCE``: 1 slow request
    of 55 is chance (p = 0.42), and so are 3 (p = 0.018), 4 are not (p = 0.003); a release
    slower by a real margin has most of its requests above the limit.
    """
    failures = []
    for name, q, ratio, old_ms, new_ms in (
            ("P50", 0.50, policy.max_p50_ratio, old.p50_ms, new.p50_ms),
            ("P99", 0.99, policy.max_p99_ratio, old.p99_ms, new.p99_ms)):
        if ratio is None or old_ms is None or new_ms is None:
            continue
        limit_ms = ratio * old_ms + policy.latency_slack_ms
        if new_ms <= limit_ms:
            continue
        slack = f" + {policy.latency_slack_ms:g} ms" if policy.latency_slack_ms else ""
        figure = f"{name} new {_ms(new_ms)} > {ratio:g} x old {_ms(old_ms)}{slack}"
        if new.latency:
            served = round(new.latency[-1][1])
            above = round(guard.count_above(list(new.latency), limit_ms * 1000.0))
            chance = binomial_tail(served, 1.0 - q, above)
            if chance >= SIGNIFICANCE:
                continue
            figure += (f" ({above} of {served} requests above {_ms(limit_ms)}, where "
                       f"{(1 - q) * served:.3g} are expected)")
        failures.append(figure)
    return failures


def binomial_tail(n: int, p: float, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, p), 0 < p < 1 (log-space terms: n may be millions)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if k <= n * p:
        return 1.0  # k <= floor(np) <= the median: P(X >= k) >= 1/2, no term to sum
    log_p, log_q = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(base - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        + i * log_p + (n - i) * log_q)
        total += term
        if term < total * 1e-15:
            break  # beyond the mean the terms only fall
    return min(total, 1.0)


def _missing(old: SlotFigures, new: SlotFigures, min_requests: int) -> str | None:
    """Why the step cannot be judged, or None when it can."""
    short = [f"{name} slot {figures.requests}" for name, figures in (("old", old), ("new", new))
             if figures.requests < min_requests]
    if short:
        return f"too few requests: {', '.join(short)} < min_requests {min_requests}"
    unmeasured = [name for name, figures in (("old", old), ("new", new))
                  if figures.p99_ms is None]
    if unmeasured:
        return (f"no successful request on the {' and '.join(unmeasured)} slot: latency "
                "cannot be compared")
    return None


class Action(StrEnum):
    """What the roll does after a step's verdict."""

    NEXT = "next"  # go on: next weight, or the full switch after the last one
    EXTEND = "extend"  # hold the same step another step_s, judged from the same first scrapes
    STOP = "stop"  # weight back to 0 on the new slot, host restored, roll stopped


@dataclass(frozen=True)
class Decision:
    """The action after a step and, when it stops the roll, why (with both figures)."""

    action: Action
    reason: str = ""


def decide(result: StepResult, policy: CanaryPolicy, *, extensions: int) -> Decision:
    """Apply the policy to a step's verdict; ``extensions`` is how many times this step was
    already extended."""
    if result.verdict is Verdict.PASS:
        return Decision(Action.NEXT)
    reasons = "; ".join(result.reasons)
    if result.verdict is Verdict.FAIL:
        return Decision(Action.STOP, f"canary step {result.weight}% failed: {reasons}")
    if policy.inconclusive == "pass":
        return Decision(Action.NEXT)
    if policy.inconclusive == "extend" and extensions < policy.max_extensions:
        return Decision(Action.EXTEND)
    tail = (f" after {extensions} extension{'s' if extensions != 1 else ''}"
            if policy.inconclusive == "extend" else "")
    return Decision(Action.STOP, f"canary step {result.weight}% inconclusive{tail}: "
                                 f"{reasons} (inconclusive={policy.inconclusive!r})")


# -- the pause state machine -----------------------------------------------------------------


class CanaryState(StrEnum):
    """Where a canary stands, as its hosts record it."""

    RUNNING = "running"  # in its weight steps
    PAUSED = "paused"  # held at its last weight, waiting for promote or abort
    PROMOTING = "promoting"  # promote is finishing the roll
    DONE = "done"  # promoted: the roll completed
    ABORTING = "aborting"  # abort is returning the hosts to the old slot
    ABORTED = "aborted"  # the hosts serve the old slot at 100 %


# An interrupted promote or abort is finished by running it again: hence the self-loops.
# A promote whose roll fails is restored like any failed roll: promoting -> aborting.
TRANSITIONS: Mapping[CanaryState, frozenset[CanaryState]] = {
    CanaryState.RUNNING: frozenset({CanaryState.PAUSED, CanaryState.DONE,
                                    CanaryState.ABORTING}),
    CanaryState.PAUSED: frozenset({CanaryState.PROMOTING, CanaryState.ABORTING}),
    CanaryState.PROMOTING: frozenset({CanaryState.PROMOTING, CanaryState.DONE,
                                      CanaryState.ABORTING}),
    CanaryState.ABORTING: frozenset({CanaryState.ABORTING, CanaryState.ABORTED}),
    CanaryState.DONE: frozenset(),
    CanaryState.ABORTED: frozenset(),
}


def transition_problem(current: CanaryState, target: CanaryState) -> str | None:
    """Why a canary in ``current`` cannot go to ``target``, or None when it can."""
    if target in TRANSITIONS[current]:
        return None
    allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (it is finished)"
    return f"a canary {current} cannot become {target} (from {current}: {allowed})"


class CanaryRecord(BaseModel):
    """A canary's state as each of its hosts records it (``ReleaseRecord.canary``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    state: CanaryState
    weights: tuple[int, ...]
    weight: int = Field(ge=0, le=100)  # the new slot's current share, percent
    steps: tuple[dict[str, Any], ...] = ()  # StepResult.as_dict() of each step judged
    comparison: dict[str, Any] | None = None  # Comparison.as_dict()
    updated_at: str = ""

    def moved_to(self, target: CanaryState, *, at: str, weight: int | None = None
                 ) -> CanaryRecord:
        """The record in state ``target`` (stamped ``at``); ValueError on a transition the
        state machine refuses."""
        problem = transition_problem(self.state, target)
        if problem:
            raise ValueError(problem)
        update: dict[str, Any] = {"state": target, "updated_at": at}
        if weight is not None:
            update["weight"] = weights_for(weight)[1]
        return self.model_copy(update=update)

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready dict the release record holds."""
        return self.model_dump(mode="json")


def fleet_state(states: Iterable[CanaryState | None]) -> CanaryState | None:
    """One state for the hosts of a canary (hosts without a canary record ignored).

    Hosts disagree only when a command was interrupted between hosts; the state returned is
    the one whose command finishes the job: any host aborting or aborted and not all aborted
    -> aborting; any promoting or done and not all done -> promoting; a mix of running and
    paused (a run stopped while pausing) -> running.
    """
    found = {state for state in states if state is not None}
    if not found:
        return None
    if len(found) == 1:
        return next(iter(found))
    if found & {CanaryState.ABORTING, CanaryState.ABORTED}:
        return CanaryState.ABORTING
    if found & {CanaryState.PROMOTING, CanaryState.DONE}:
        return CanaryState.PROMOTING
    return CanaryState.RUNNING


class PlanAction(StrEnum):
    """What ``fab promote`` / ``fab abort`` do."""

    RUN = "run"
    NOTHING = "nothing"  # already done: exit 0 and change nothing (cron-safe)
    REFUSE = "refuse"  # nothing to act on, or another command owns it: exit 1


@dataclass(frozen=True)
class Plan:
    """A promote's or abort's plan from the recorded state."""

    action: PlanAction
    message: str
    fix: str = ""
    target: CanaryState | None = None  # the state to record before acting

    def problem(self) -> Problem:
        """The refusal as a located problem (for a ConfigError: nothing was changed)."""
        return Problem(self.message, self.fix or "nothing to fix", field="--model")


def plan_promote(state: CanaryState | None, *, model: str) -> Plan:
    """What ``fab promote --model M`` does with the canary in ``state``."""
    deploy = f"fab deploy --model {model} --pause"
    if state in (CanaryState.PAUSED, CanaryState.PROMOTING):
        resumed = " (finishing an interrupted promote)" if state is CanaryState.PROMOTING else ""
        return Plan(PlanAction.RUN, f"promoting the paused canary of {model}{resumed}",
                    target=CanaryState.PROMOTING)
    if state is CanaryState.DONE:
        return Plan(PlanAction.NOTHING, f"the canary of {model} is already promoted")
    if state is None:
        return Plan(PlanAction.REFUSE, f"nothing is paused for model {model}",
                    f"promote resumes a canary that `{deploy}` left paused; "
                    f"`fab status --model {model}` shows what each host serves")
    if state is CanaryState.RUNNING:
        return Plan(PlanAction.REFUSE, f"the canary of {model} is still in its weight steps, "
                    "not paused", "wait for the deploy to pause it (its exit code says so), "
                    f"or run `fab abort --model {model}` if that deploy was killed")
    return Plan(PlanAction.REFUSE, f"the canary of {model} was aborted ({state})",
                f"finish the abort with `fab abort --model {model}`, then deploy again"
                if state is CanaryState.ABORTING else f"deploy again: `{deploy}`")


def plan_abort(state: CanaryState | None, *, model: str) -> Plan:
    """What ``fab abort --model M`` does with the canary in ``state``."""
    if state in (CanaryState.RUNNING, CanaryState.PAUSED, CanaryState.ABORTING):
        resumed = " (finishing an interrupted abort)" if state is CanaryState.ABORTING else ""
        return Plan(PlanAction.RUN, f"aborting the canary of {model}{resumed}: its hosts go "
                    "back to the old slot at 100%", target=CanaryState.ABORTING)
    if state is CanaryState.ABORTED:
        return Plan(PlanAction.NOTHING, f"the canary of {model} is already aborted")
    if state is None:
        return Plan(PlanAction.REFUSE, f"nothing is paused for model {model}",
                    f"`fab status --model {model}` shows what each host serves; "
                    f"`fab rollback --model {model}` returns to a previous release")
    if state is CanaryState.PROMOTING:
        return Plan(PlanAction.REFUSE, f"a promote of {model} is under way or was interrupted",
                    f"finish it with `fab promote --model {model}`; then "
                    f"`fab rollback --model {model}` returns to the previous release")
    return Plan(PlanAction.REFUSE, f"the canary of {model} was promoted: there is nothing "
                "left to abort", f"`fab rollback --model {model}` returns to the previous "
                "release")
