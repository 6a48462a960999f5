"""Weighted canary steps on one host, judged new slots against old slots (pure).

During a canary the host's proxy sends ``w`` % of the stable ports' requests to the new slots
and the rest to the old ones (every instance of the host at the same weight), so both serve
the same traffic at the same moment. Each step is judged (``step_metrics``, each metric
classified as Kayenta does: core/canary/judge.py) from the slots' own TFServing metrics
scraped at the start and the end of the step (``guard.Scrape``, summed over the host's
instances): the server-side error rate (client errors left out, as the guard does) and the
median and P99 of the ``request_latency`` histogram deltas; and from the judge's own requests
sent to both sides during the step (``Probes``: the latency). The scraping, the requests, the
proxy's runtime commands (``proxy.weight_commands``) and the records' writing are the
caller's.

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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from tfsdeploy.core.canary import judge as judge_metrics
from tfsdeploy.core.canary.judge import Classification, MetricResult
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
class Probes:
    """The judge's own requests during a step, sent to each old and each new slot of the host
    in turn: each successful one's latency (ms) per side, and how many failed."""

    old: tuple[float, ...] = ()
    new: tuple[float, ...] = ()
    old_failed: int = 0
    new_failed: int = 0


@dataclass(frozen=True)
class StepResult:
    """Both slots' figures over one step, each metric's classification, the score and the
    verdict; what the progress line, ``--json`` and the release record show."""

    weight: int
    old: SlotFigures
    new: SlotFigures
    verdict: Verdict
    reasons: tuple[str, ...] = ()  # each failing metric (fail, marginal) or what is missing
    metrics: tuple[MetricResult, ...] = ()
    score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready result."""
        return {"weight": self.weight, "verdict": str(self.verdict), "score": self.score,
                "reasons": list(self.reasons), "old": self.old.as_dict(),
                "new": self.new.as_dict(), "metrics": [m.as_dict() for m in self.metrics]}

    def describe(self) -> str:
        """The verdict, its score and reasons, both slots' figures; then one line per
        metric (effect, interval, p-value, classification)."""
        head = f"canary {self.weight}%: {self.verdict}"
        if self.score is not None:
            head += f", score {self.score:g}"
        if self.reasons:
            head += f" ({'; '.join(self.reasons)})"
        lines = [f"{head}; old {self.old.describe()} | new {self.new.describe()}"]
        return "\n".join(lines + [f"  {m.describe()}" for m in self.metrics])


def step_analysis(old_before: ScrapeSet, old_after: ScrapeSet, new_before: ScrapeSet,
                  new_after: ScrapeSet, policy: CanaryPolicy, *, weight: int = 0,
                  probes: Probes | None = None, outputs: Sequence[Mapping[str, Any]] = ()
                  ) -> StepResult:
    """Judge one step from the two slots' scrapes taken at its start and its end (each a
    ``guard.Scrape``, or one per serving process), the judge's own requests and the
    prediction comparison's outputs (``OutputFigure.as_dict()`` each)."""
    return judge(slot_figures(old_before, old_after), slot_figures(new_before, new_after),
                 policy, weight=weight, probes=probes, outputs=outputs)


def step_metrics(old: SlotFigures, new: SlotFigures, policy: CanaryPolicy, *,
                 probes: Probes | None = None, outputs: Sequence[Mapping[str, Any]] = ()
                 ) -> list[MetricResult]:
    """Every metric of a step, classified (core/canary/judge.py). A new slot that served
    fewer than ``min_requests`` has its errors judged as if the step had reached
    ``min_requests`` with every further request successful: a release failing most requests
    at a low weight is stopped at once instead of waiting for traffic."""
    critical = set(policy.critical)
    slack, ratio50 = policy.latency_slack_ms, policy.max_p50_ratio
    found: list[MetricResult] = []
    if ratio50 is not None and probes is not None:
        found.append(judge_metrics.classify_shift(
            "latency", probes.old, probes.new, allowed=ratio50 - 1, slack=slack,
            critical="latency" in critical))
    if ratio50 is not None:
        found.append(judge_metrics.classify_quantile(
            "median", 0.50, old.latency, new.latency, allowed=ratio50 - 1, slack_ms=slack,
            critical="median" in critical))
    found.append(judge_metrics.classify_quantile(
        "p99", 0.99, old.latency, new.latency, allowed=policy.max_p99_ratio - 1,
        slack_ms=slack, critical="p99" in critical))
    counted = max(new.requests, policy.min_requests)
    errors = judge_metrics.classify_errors(old.errors, old.requests, new.errors, counted,
                                           allowed=policy.max_error_rate_delta,
                                           critical="errors" in critical)
    if counted > new.requests:
        errors = replace(errors, note=f"{errors.note}; the new slots' {new.requests} requests "
                                      f"counted as min_requests {policy.min_requests}")
    found.append(errors)
    rules = policy.comparison.outputs
    found += [judge_metrics.output_metric(figure, rule=rules.get(str(figure["name"])),
                                          critical="outputs" in critical)
              for figure in outputs]
    return found


def judge(old: SlotFigures, new: SlotFigures, policy: CanaryPolicy, *, weight: int = 0,
          probes: Probes | None = None, outputs: Sequence[Mapping[str, Any]] = ()) -> StepResult:
    """The verdict on two slots' figures over the same interval.

    Fail: the new slot restarted, a critical metric is High, or the score is below
    ``marginal_score``. Marginal: the score is below ``pass_score``. Inconclusive: a slot
    served fewer than ``min_requests`` (unless the new slots' errors, or an output, already
    fail it whatever the rest of its requests do), or a critical metric has no data (no
    successful request to time). Pass otherwise.
    """
    metrics = tuple(step_metrics(old, new, policy, probes=probes, outputs=outputs))
    restart = ("new slot restarted during the step (its counters went back to 0)",) \
        if new.restarted else ()
    enough = old.requests >= policy.min_requests and new.requests >= policy.min_requests
    # with too few requests only the new slots' errors (counted up to min_requests, against
    # an old slot that served enough) and the answers can fail the step
    decisive = [m for m in metrics if m.critical and m.classification is Classification.HIGH
                and (enough or m.name.startswith("output ")
                     or (m.name == "errors" and old.requests >= policy.min_requests))]
    if restart or decisive:
        return StepResult(weight, old, new, Verdict.FAIL,
                          restart + tuple(m.describe() for m in decisive), metrics,
                          0.0 if decisive else None)
    missing = _missing(old, new, policy.min_requests) or next(
        (f"{m.name}: {m.note}" for m in metrics
         if m.critical and m.classification is Classification.NODATA), None)
    if missing:
        return StepResult(weight, old, new, Verdict.INCONCLUSIVE, (missing,), metrics)
    scored = judge_metrics.score(metrics, pass_score=policy.pass_score,
                                 marginal_score=policy.marginal_score)
    if scored.label == "pass":
        return StepResult(weight, old, new, Verdict.PASS, (), metrics, scored.score)
    high = tuple(m.describe() for m in metrics if m.classification is Classification.HIGH)
    verdict = Verdict.MARGINAL if scored.label == "marginal" else Verdict.FAIL
    return StepResult(weight, old, new, verdict, (scored.reason, *high), metrics, scored.score)


def _missing(old: SlotFigures, new: SlotFigures, min_requests: int) -> str | None:
    """Why the step cannot be judged yet: too few requests on a side, or no successful one
    (no latency: failing everything on both sides is no evidence of health)."""
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
    already extended. A marginal step is extended like an inconclusive one (more traffic to
    decide on) and fails when no extension is left."""
    if result.verdict is Verdict.PASS:
        return Decision(Action.NEXT)
    reasons = "; ".join(result.reasons)
    if result.verdict is Verdict.FAIL:
        return Decision(Action.STOP, f"canary step {result.weight}% failed: {reasons}")
    tail = f" after {extensions} extension{'s' if extensions != 1 else ''}"
    if result.verdict is Verdict.MARGINAL:
        if extensions < policy.max_extensions:
            return Decision(Action.EXTEND)
        return Decision(Action.STOP, f"canary step {result.weight}% marginal{tail}: {reasons}")
    if policy.inconclusive == "pass":
        return Decision(Action.NEXT)
    if policy.inconclusive == "extend" and extensions < policy.max_extensions:
        return Decision(Action.EXTEND)
    tail = tail if policy.inconclusive == "extend" else ""
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
