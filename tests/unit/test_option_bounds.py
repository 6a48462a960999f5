"""Every numeric and duration option has bounds, declared beside it (cli/verbs.py):
a value at its bound is taken, one beyond it is refused at the option check, exit 1, naming
the option, the bound and the fix, before any host is contacted."""

from __future__ import annotations

import pytest

from tfsdeploy.cli.options import DURATION_MAX_S, bounded, option_value
from tfsdeploy.cli.verbs import Bound, exact
from tfsdeploy.core.errors import ConfigError

from .test_cli_options import CONNECTIONS, fab, no_host  # noqa: F401 (the fixture)


def _beyond(bound: Bound) -> list[str]:
    """Values just beyond each end of ``bound``, and far beyond."""
    step = 1 if bound.whole else bound.high * 1e-6
    low = [str(bound.low)] if bound.above else [str(bound.low - (1 if bound.whole else 1e-9))]
    high = str(int(bound.high) + 1) if bound.whole else repr(bound.high + step)
    far = ["1e300", "-1e300"] if not bound.whole else ["1" + "0" * 30, "-1"]
    return [*low, high, *far]


def _within(bound: Bound) -> list[str]:
    low = bound.low + (1 if bound.whole else 1e-9) if bound.above else bound.low
    return [str(int(low)) if bound.whole else repr(low), str(int(bound.high)) if bound.whole
            else repr(bound.high)]


CASES = bounded()


@pytest.mark.parametrize(("command", "name", "bound"), CASES,
                         ids=[f"{c}-{n}" for c, n, _ in CASES])
def test_each_numeric_option_takes_its_bounds_and_refuses_beyond_them(
        command: str, name: str, bound: Bound) -> None:
    for value in _within(bound):
        assert option_value(command, name, value) == float(value)
    flag = f"--{name.replace('_', '-')}"
    for value in _beyond(bound):
        with pytest.raises(ConfigError) as refused:
            option_value(command, name, value)
        (problem,) = refused.value.problems
        assert problem.field == flag and problem.message.startswith(f"{flag} {value!r}: ")
        said = problem.message + problem.fix
        assert str(exact(bound.low)) in said or str(exact(bound.high)) in said, problem


@pytest.mark.parametrize(("words", "says"), [
    (("logs", "--model=half_plus_two", "--since=100000d"), "reaches back before 1970"),
    (("logs", "--model=half_plus_two", "--since=" + "9" * 400 + "d"),
     "reaches back before 1970"),
    (("guard", "--model=half_plus_two", "--interval-s=1e-300"), "must be at least 0.1"),
    (("deploy", "--model=half_plus_two", "--lock-wait=1e300"), "must be at most 86400"),
    (("guard", "--model=half_plus_two", "--max-error-rate=5"), "must be at most 1"),
    (("bench", "--model=half_plus_two", "--duration=100000h"), "is longer than 86400 s"),
    (("bench", "--model=half_plus_two", "--duration=0s"), "is not a positive duration"),
], ids=["since 100000d", "since 400 digits", "interval 1e-300", "lock-wait 1e300",
        "guard error rate as a percent", "bench duration", "bench duration 0"])
def test_an_option_beyond_its_bound_exits_1_before_any_host(
        words: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab(*words) == 1
    err = capsys.readouterr().err
    flag = words[-1].split("=")[0]
    assert f"[field {flag}] {flag} " in err and says in err, err
    assert "fix: " in err and "Traceback" not in err
    assert CONNECTIONS == []


def test_the_longest_duration_is_a_day() -> None:
    assert DURATION_MAX_S == 86_400
    assert option_value("bench", "duration", "24h") == "24h"
    with pytest.raises(ConfigError):
        option_value("bench", "duration", "25h")


@pytest.mark.parametrize("option", ["--start-margin", "--timeout", "--interval"])
def test_accept_s_durations_are_at_most_a_day(option: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("accept", "--model=half_plus_two", f"{option}={'9' * 400}s") == 1
    err = capsys.readouterr().err
    assert f"[field {option}]" in err and "Traceback" not in err, err
    assert CONNECTIONS == []
