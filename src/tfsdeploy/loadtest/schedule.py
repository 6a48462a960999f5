"""Load and concurrency schedules (ghz's const / step / line), as pure functions of time.

A schedule is a piecewise-constant function of the time since the run started:

* ``const``: ``start`` for ever.
* ``step``: ``start``, then ``start + step`` after ``step_duration``, and so on, clamped at
  ``end`` when ``end`` is set (``step`` may be negative: then ``end`` is a floor).
* ``line``: ``step`` with a fixed step duration of one second (ghz defines it so).

``max_duration`` (if > 0) freezes the value reached at that time. For request rates the
intended send time of the k-th request is the exact inverse of the integral of the rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

KINDS = ("const", "step", "line")


class ScheduleError(ValueError):
    """Inconsistent schedule options."""


@dataclass(frozen=True)
class Schedule:
    """A piecewise-constant value over time: requests per second, or active workers."""

    kind: str
    start: float
    step: float = 0.0
    end: float = 0.0
    step_duration: float = 1.0
    max_duration: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"schedule kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.start < 0 or self.end < 0:
            raise ScheduleError("schedule start and end must not be negative")
        if self.kind == "step" and self.step_duration <= 0:
            raise ScheduleError("a step schedule needs a positive step duration")
        if self.kind != "const" and self.step == 0:
            raise ScheduleError(f"a {self.kind} schedule needs a non-zero step")

    @property
    def period(self) -> float:
        """Seconds between changes of value (infinite for const)."""
        if self.kind == "const":
            return math.inf
        return 1.0 if self.kind == "line" else self.step_duration

    def _clamp(self, value: float) -> float:
        if self.end > 0:
            value = min(value, self.end) if self.step > 0 else max(value, self.end)
        return max(value, 0.0)

    def value_at(self, t: float) -> float:
        """The value in force at ``t`` seconds after the start."""
        if self.kind == "const":
            return self.start
        if self.max_duration > 0:
            t = min(t, self.max_duration)
        return self._clamp(self.start + self.step * math.floor(max(t, 0.0) / self.period))

    def is_final(self, t: float) -> bool:
        """True when the value can no longer change after ``t``."""
        if self.kind == "const":
            return True
        if self.max_duration > 0 and t >= self.max_duration:
            return True
        value = self.value_at(t)
        if self.step < 0 and value <= 0:
            return True
        return self.end > 0 and value == self.end

    def segments(self) -> Iterator[tuple[float, float, float]]:
        """``(start, end, value)`` of each constant piece; the last one has end = inf."""
        t = 0.0
        while True:
            value = self.value_at(t)
            if self.is_final(t):
                yield (t, math.inf, value)
                return
            nxt = (math.floor(t / self.period) + 1) * self.period
            if self.max_duration > 0:
                nxt = min(nxt, self.max_duration)
            yield (t, nxt, value)
            t = nxt


def tick_times(rate: Schedule) -> Iterator[float]:
    """Intended send times (seconds from the start) of requests paced by ``rate``.

    Request k goes at the time when the integral of the rate reaches k; fractional progress is
    carried across segments so a step never drops or adds a request.
    """
    due = 0.0  # integral of the rate at which the next request is due
    done = 0.0  # integral of the rate at the start of the current segment
    for seg_start, seg_end, value in rate.segments():
        if value <= 0:
            if math.isinf(seg_end):
                return
            continue
        seg_total = done + (seg_end - seg_start) * value
        while due < seg_total:
            yield seg_start + (due - done) / value
            due += 1.0
        done = seg_total


def split_count(total: int, parts: int, index: int) -> int:
    """Share ``index`` of ``total`` split as evenly as possible into ``parts``."""
    return total // parts + (1 if index < total % parts else 0)
