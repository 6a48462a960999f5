"""Each default a command's `--help` states is the default the command gets.

An option declares its default once, in ``cli.verbs``; its help text says it in words. Where
the option is left None and the command takes its default further down (the acceptance
plan's constants, the pull semaphore, the canary policy), the help's figure must be that
constant. Where a run's policy object holds the default too (``GuardPolicy``, ``TuneOptions``,
``AcceptOptions``), ``cli.verbs`` takes it from that object: the two are checked equal here all
the same, the seconds a policy holds against the duration text an option shows."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from typing import Any

import pytest

from tfsdeploy.accept import plan as accept_plan
from tfsdeploy.accept.options import AcceptOptions
from tfsdeploy.accept.plan import parse_seconds
from tfsdeploy.cli.verbs import VERBS, AcceptArgs, GuardArgs, TuneArgs, declared, meta
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.observe.guard import GuardPolicy
from tfsdeploy.core.timetext import duration_seconds, duration_text
from tfsdeploy.core.tuning.options import TuneOptions
from tfsdeploy.run.jobs import DEFAULT_MAX_PULLS

# a figure the help states: "(default 0.01", "(default 30 s)", "(default 5m)", "(default 25%)"
STATED = re.compile(r"\(default:? (?:the policy's, )?(\d[\d.]*)\s*(%|s|m|ms|h)?\b")

# options left None whose help states the figure a constant further down gives
FURTHER_DOWN: dict[tuple[str, str], float] = {
    ("accept", "target_qps"): accept_plan.DEFAULT_TARGET_QPS,
    ("accept", "release_at"): accept_plan.DEFAULT_RELEASE_AT * 100,  # stated in %
    ("accept", "max_error_rate"): accept_plan.DEFAULT_MAX_ERROR_RATE_PCT,
    ("accept", "timeout"): accept_plan.DEFAULT_TIMEOUT_S,
    ("accept", "start_margin"): accept_plan.DEFAULT_START_MARGIN_S,
    ("deploy", "max_pulls"): DEFAULT_MAX_PULLS,
    ("stage", "max_pulls"): DEFAULT_MAX_PULLS,
    ("deploy", "step_s"): next(f.default for f in fields(CanaryPolicy) if f.name == "step_s"),
}


def _seconds(value: Any) -> float:
    return parse_seconds(value, "default") if isinstance(value, str) else float(value)


def _stated() -> list[tuple[str, str, float, Any]]:
    found = []
    for args in VERBS:
        for one in declared(args):
            match = STATED.search(meta(one).help)
            if match is None:
                continue
            figure, unit = float(match.group(1)), match.group(2)
            if unit in ("m", "h", "ms"):  # a duration: compare in seconds
                figure = parse_seconds(f"{match.group(1)}{unit}", "stated")
            found.append((args.command, one.name, figure, one.default))
    return found


STATED_DEFAULTS = _stated()


def test_the_scan_finds_the_stated_defaults() -> None:
    names = {(command, name) for command, name, _, _ in STATED_DEFAULTS}
    assert {("deploy", "lock_wait"), ("guard", "for_s"), ("accept", "duration"),
            ("tune", "budget"), *FURTHER_DOWN} <= names, sorted(names)


@pytest.mark.parametrize(("command", "name", "figure", "default"), STATED_DEFAULTS,
                         ids=[f"{c}-{n}" for c, n, _, _ in STATED_DEFAULTS])
def test_a_stated_default_is_the_default(command: str, name: str, figure: float,
                                         default: Any) -> None:
    if default is None or default is MISSING:
        assert (command, name) in FURTHER_DOWN, \
            f"fab {command} --{name}: its help states {figure:g}, its default is set elsewhere"
        assert figure == pytest.approx(FURTHER_DOWN[command, name])
    else:
        assert figure == pytest.approx(_seconds(default)), (command, name)


def _defaults(cls: Any) -> dict[str, Any]:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def test_the_guards_policy_repeats_fab_guards_defaults() -> None:
    declared_ = _defaults(GuardArgs)
    policy = _defaults(GuardPolicy)
    shared = set(declared_) & set(policy)
    assert {"max_error_rate", "for_s", "interval_s", "min_requests", "lock_wait",
            "count_client_errors"} <= shared
    assert {k: policy[k] for k in shared} == {k: declared_[k] for k in shared}


def test_tunes_options_repeat_fab_tunes_defaults() -> None:
    declared_, options = _defaults(TuneArgs), _defaults(TuneOptions)
    assert _seconds(declared_["budget"]) == options["budget_s"]
    assert _seconds(declared_["step"]) == options["step_s"]


def test_accepts_options_repeat_fab_accepts_defaults() -> None:
    declared_, options = _defaults(AcceptArgs), _defaults(AcceptOptions)
    shared = (set(declared_) & set(options)) - {"model"}
    assert {"duration", "interval"} <= shared
    assert {k: options[k] for k in shared} == {k: declared_[k] for k in shared}


@pytest.mark.parametrize(("seconds", "text"), [(600.0, "10m"), (5.0, "5s"), (5400.0, "90m"),
                                               (7200.0, "2h"), (1.5, "1.5s"), (90.0, "90s")])
def test_a_policy_s_seconds_are_said_as_the_duration_they_are(seconds: float,
                                                               text: str) -> None:
    assert duration_text(seconds) == text
    assert duration_seconds(text) == seconds

