"""The after-passes of a run (targets, post-hooks, notifications), run after its result is
recorded: each in a thread of its own, under one deadline; a Ctrl-C or SIGTERM after the roll
leaves the pass under way and skips the rest, SIGHUP does not; a pass that fails is a line.
Whatever happens, they return and say it, never raise (``run/after.py``)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.run.after import AfterPass, LateSignals, run_after_passes


class Lines:
    """A reporter that keeps its warnings."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def note(self, text: str) -> None:
        raise AssertionError(f"a warning expected, got a note: {text}")

    def warn(self, text: str) -> None:
        self.warnings.append(text)


RESULT = SimpleNamespace(exit_code=ExitCode.ROLLED_BACK)
RECORDED = "after the run (exit code 2, already recorded): "


def passes(ran: list[str], release: threading.Event | None = None) -> list[AfterPass]:
    """targets (which waits for ``release`` when given), post-hooks, notifications."""
    def targets(result: Any, session: Any) -> None:
        if release is not None:
            release.wait(60)
        ran.append("targets")

    return [AfterPass("targets", targets),
            AfterPass("post-hooks", lambda result, session: ran.append("post-hooks")),
            AfterPass("notifications", lambda result, session: ran.append("notifications"))]


def test_every_pass_runs_in_order_when_nothing_stops_them() -> None:
    ran: list[str] = []
    lines = Lines()
    cut = run_after_passes(passes(ran), RESULT, None, deadline_s=10, late=LateSignals(),
                           reporter=lines)
    assert (ran, cut, lines.warnings) == (["targets", "post-hooks", "notifications"], [], [])


def test_a_pass_still_going_at_the_deadline_is_left_and_the_rest_skipped() -> None:
    ran: list[str] = []
    release = threading.Event()
    lines = Lines()
    try:
        cut = run_after_passes(passes(ran, release), RESULT, None, deadline_s=0.2,
                               late=LateSignals(), reporter=lines)
    finally:
        release.set()
    assert cut == ["targets cut short (the 0.2 s deadline)",
                   "post-hooks skipped (the 0.2 s deadline)",
                   "notifications skipped (the 0.2 s deadline)"]
    assert lines.warnings == [RECORDED + line for line in cut]
    assert "post-hooks" not in ran


def test_a_sigterm_after_the_roll_skips_the_passes_a_hangup_does_not() -> None:
    ran: list[str] = []
    lines = Lines()
    cut = run_after_passes(passes(ran), RESULT, None, deadline_s=10,
                           late=LateSignals(names=["SIGHUP", "SIGTERM"]), reporter=lines)
    assert ran == [] and cut == ["targets skipped (SIGTERM)", "post-hooks skipped (SIGTERM)",
                                 "notifications skipped (SIGTERM)"]
    ran.clear()
    cut = run_after_passes(passes(ran), RESULT, None, deadline_s=10,
                           late=LateSignals(names=["SIGHUP"]), reporter=Lines())
    assert (ran, cut) == (["targets", "post-hooks", "notifications"], [])


def test_a_pass_that_fails_is_one_line_and_the_next_ones_run() -> None:
    ran: list[str] = []

    def broken(result: Any, session: Any) -> None:
        raise RuntimeError("the Prometheus host refused the file")

    lines = Lines()
    cut = run_after_passes([AfterPass("targets", broken), *passes(ran)[1:]], RESULT, None,
                           deadline_s=10, late=LateSignals(), reporter=lines)
    assert (ran, cut) == (["post-hooks", "notifications"], [])
    assert lines.warnings == [RECORDED + "RuntimeError: the Prometheus host refused the file "
                              "(in targets)"]
