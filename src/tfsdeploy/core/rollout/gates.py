"""Gates: checks with a deadline, polled with a fresh observation each time.

A gate is a function returning ``Verdict``; ``poll`` runs it until it passes, fails for good,
or the deadline passes. The clock is injected so that tests run without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tfsdeploy.core.rollout.gate_diagnosis import Diagnosis


class Clock(Protocol):
    """Time source for pollers."""

    def now(self) -> float:
        """Seconds, monotonic."""

    def sleep(self, seconds: float) -> None:
        """Wait."""


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """time.sleep()."""
        time.sleep(seconds)


@dataclass(frozen=True)
class Verdict:
    """One observation: passed, failed for good, or not yet (with what was seen)."""

    passed: bool = False
    final: bool = False
    seen: str = ""

    @staticmethod
    def ok(seen: str = "") -> Verdict:
        """The gate passed."""
        return Verdict(passed=True, final=True, seen=seen)

    @staticmethod
    def fail(seen: str) -> Verdict:
        """The gate failed for good; polling longer cannot help."""
        return Verdict(passed=False, final=True, seen=seen)

    @staticmethod
    def wait(seen: str) -> Verdict:
        """Not yet."""
        return Verdict(seen=seen)


class GateFailed(Exception):
    """A gate did not pass: what was expected, what was seen, what it means when the failure
    is a known one (its cause and fix), and the server's log tail."""

    def __init__(self, step: str, expected: str, seen: str, log_tail: str = "", *,
                 diagnosis: Diagnosis | None = None) -> None:
        self.step, self.expected, self.seen, self.log_tail = step, expected, seen, log_tail
        self.diagnosis = diagnosis
        message = f"{step}: expected {expected}; saw {seen}"
        if diagnosis is not None:
            message += "".join(f"\n    {line}" for line in diagnosis.lines())
        if log_tail:
            message += "\n    server log (tail):\n" + "\n".join(
                f"      {line}" for line in log_tail.splitlines())
        super().__init__(message)


def poll(check: Callable[[], Verdict], *, step: str, expected: str, deadline_s: float,
         clock: Clock, interval_s: float = 0.5, max_interval_s: float = 2.0) -> Verdict:
    """Call ``check`` until it passes; raise GateFailed when it fails or time runs out.

    The interval grows by half each poll up to ``max_interval_s`` (capped backoff).
    """
    end = clock.now() + deadline_s
    interval = interval_s
    while True:
        verdict = check()
        if verdict.passed:
            return verdict
        if verdict.final:
            raise GateFailed(step, expected, verdict.seen)
        if clock.now() >= end:
            raise GateFailed(step, expected, f"{verdict.seen} after {deadline_s:g} s (deadline)")
        clock.sleep(min(interval, max(0.0, end - clock.now())))
        interval = min(interval * 1.5, max_interval_s)


def percentile(samples: list[float], pct: float) -> float:
    """Nearest-rank percentile of ``samples`` (pct in 0..100)."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), int(-(-pct * len(ordered) // 100))))
    return ordered[rank - 1]
