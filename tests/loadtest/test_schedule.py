"""Rate and concurrency schedules (ghz const/step/line)."""

from __future__ import annotations

import itertools

import pytest

from tfsdeploy.loadtest.schedule import Schedule, ScheduleError, split_count, tick_times


def _ticks(schedule: Schedule, until: float) -> list[float]:
    return list(itertools.takewhile(lambda t: t < until, tick_times(schedule)))


def test_const_rate_ticks_are_evenly_spaced() -> None:
    assert _ticks(Schedule("const", 4), 1.0) == [0.0, 0.25, 0.5, 0.75]


def test_step_rate_integral_is_exact() -> None:
    # 50/s for 0.5 s, 100/s for 0.5 s, then 150/s: 25 + 50 + 75 requests in 1.5 s
    schedule = Schedule("step", 50, step=50, end=150, step_duration=0.5)
    assert len(_ticks(schedule, 1.5)) == 150
    assert schedule.value_at(10) == 150


def test_line_is_step_with_one_second_steps() -> None:
    line = Schedule("line", 10, step=10, end=30)
    assert [line.value_at(t) for t in (0, 0.99, 1.0, 2.5, 9)] == [10, 10, 20, 30, 30]
    assert len(_ticks(line, 3.0)) == 10 + 20 + 30


def test_decreasing_rate_stops_at_zero() -> None:
    assert len(list(tick_times(Schedule("line", 10, step=-5)))) == 15


def test_max_duration_freezes_the_value() -> None:
    schedule = Schedule("step", 1, step=1, step_duration=1, max_duration=2.5)
    assert [schedule.value_at(t) for t in (0, 1, 2, 2.4, 3, 100)] == [1, 2, 3, 3, 3, 3]


@pytest.mark.parametrize("kwargs", [{"kind": "ramp", "start": 1},
                                    {"kind": "step", "start": 1, "step": 0},
                                    {"kind": "const", "start": -1}])
def test_bad_schedules_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ScheduleError):
        Schedule(**kwargs)  # type: ignore[arg-type]


def test_split_count_shares_add_up() -> None:
    assert [split_count(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert sum(split_count(1001, 7, i) for i in range(7)) == 1001
