"""Command-line options on the values the hostile-input battery (tests/property) found
mishandled: each is refused before anything is read from a host, naming the option, or typed
into what the command needs. Arguments go through invoke's parser and the task, as `fab` runs
them."""

from __future__ import annotations

from pathlib import Path

import pytest
from invoke.exceptions import Exit
from invoke.parser import Parser

import tasks
from tfsdeploy.accept import run as accept_run
from tfsdeploy.cli.options import option_value
from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.hosts.ssh import SshConnection
from tfsdeploy.loadtest import cli as loadtest_cli

CONNECTIONS: list[str] = []


@pytest.fixture(autouse=True)
def no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every SSH connection, load run and load generator is refused and recorded (even when
    a check under test lets a command through)."""
    def transport(self: SshConnection) -> None:
        CONNECTIONS.append(self.host.name)
        raise HostUnreachable(f"{self.host.name}: no host in the unit tier")

    def load(*args: object, **kwargs: object) -> None:
        CONNECTIONS.append("load")
        raise loadtest_cli.ConnectError("no host in the unit tier")

    def generators(*args: object, **kwargs: object) -> None:
        CONNECTIONS.append("accept")
        raise HostUnreachable("no load generator in the unit tier")

    CONNECTIONS.clear()
    monkeypatch.setattr(SshConnection, "_transport", transport)
    monkeypatch.setattr(loadtest_cli, "execute", load)
    monkeypatch.setattr(accept_run, "prepare_all", generators)


def fab(*words: str) -> int:
    """`fab WORDS...` in this process (no host is reachable from the unit tier)."""
    parsed = Parser(contexts=tasks.ns.to_contexts()).parse_argv(list(words))
    try:
        tasks.ns[words[0]].body(None, **parsed[0].as_kwargs)
    except Exit as stop:
        return int(stop.code)
    return 0


@pytest.mark.parametrize("words", [
    ("logs", "--model=half_plus_two", "--lines=abc"),
    ("deploy", "--model=half_plus_two", "--lock-wait=soon"),
    ("guard", "--model=half_plus_two", "--min-requests=1.5"),
    ("plan-capacity", "--target-qps=100", "--per-instance-qps=10", "--load-factor=0x10"),
], ids=["int", "float", "int given a fraction", "hex"])
def test_a_number_option_given_text_exits_1_naming_it(
        words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert fab(*words) == 1
    err = capsys.readouterr().err
    flag = words[-1].split("=")[0]
    assert f"[field {flag}]" in err and "Traceback" not in err


def test_number_options_left_out_take_their_defaults(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert fab("plan-capacity", "--target-qps=100", "--per-instance-qps=10") == 0
    assert "= 100 / (10.0 x 0.65 x 0.9)" in capsys.readouterr().out


@pytest.mark.parametrize("words", [
    ("deploy", "--model=half_plus_two", "--check", "--inventory="),
    ("deploy", "--model=half_plus_two", "--check", "--hosts= "),
    ("status", "--model=half_plus_two", "--limit="),
    ("deploy", "--model=half_plus_two", "--check", "--playbook="),
    ("deploy", "--model=half_plus_two", "--check", "--canary-weights="),
    ("plan-capacity", "--target-qps=100", "--per-instance-qps=10", "--sweep-report="),
], ids=["inventory", "hosts", "limit", "playbook", "canary weights", "sweep report"])
def test_an_empty_value_is_refused_not_taken_for_the_default(
        words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert fab(*words) == 1
    flag = words[-1].split("=")[0]
    assert f"[field {flag}] {flag} is empty" in capsys.readouterr().err
    assert CONNECTIONS == []


def test_since_is_checked_and_passed_on_as_given() -> None:
    # logs() reads it against the clock when it starts (run.views.since_timestamp, whose
    # figures test_fleet checks): the Unix time docker-py's logs() takes, not the text
    for given in ("1h30m", "1d", "2025-01-31T10:00:00+02:00"):
        assert option_value("logs", "since", given) == given


@pytest.mark.parametrize("since", ["junk", "10x", "-10m", "1969-12-31T23:59:59Z", "1700000000"])
def test_since_that_is_no_time_exits_1_before_any_host(
        since: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("logs", "--model=half_plus_two", f"--since={since}") == 1
    assert f"[field --since] --since {since!r}" in capsys.readouterr().err
    assert CONNECTIONS == []


@pytest.mark.parametrize("to", ["../../etc", "r20250131-080000000-v3/../..", "latest",
                                "r20250131-080000000-v0", "r20250131-080000000-v3\n"])
def test_rollback_to_what_is_no_release_id_exits_1_before_any_host(
        to: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("rollback", "--model=half_plus_two", f"--to={to}") == 1
    assert f"[field --to] --to {to!r}: is not a release id" in capsys.readouterr().err
    assert CONNECTIONS == []


def test_rollback_to_a_release_id_goes_on_to_the_hosts() -> None:
    assert fab("rollback", "--model=half_plus_two", "--to=r20250131-080000000-v3") == 3
    assert CONNECTIONS  # unreachable here: exit 3, a person must look


@pytest.mark.parametrize("duration", ["junk", "1e400s", "9" * 400, "10 days", "\u0663s",
                                      "\uff11\uff10s"])
def test_bench_duration_that_is_no_duration_exits_1_naming_it(
        duration: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("bench", "--model=half_plus_two", f"--duration={duration}") == 1
    err = capsys.readouterr().err
    assert f"[field --duration] --duration {duration!r}" in err
    assert "a defect of tfsdeploy" not in err


def output_cases(tmp: Path) -> list[tuple[str, ...]]:
    (tmp / "file.txt").write_text("a file\n")
    deploy = ("deploy", "--model=half_plus_two")
    return [
        (*deploy, f"--json-file={tmp}"),
        (*deploy, f"--json-file={tmp}/file.txt/result.json"),
        (*deploy, f"--metrics-file={tmp}/a\x00b"),
        (*deploy, f"--log-file={tmp}"),
        (*deploy, f"--json-file={tmp}/{'x' * 300}"),
        ("render", "--model=half_plus_two", f"--out={tmp}/file.txt"),
        ("bench", "--model=half_plus_two", f"--report={tmp}/file.txt/r.json"),
        ("plan-capacity", "--target-qps=100", f"--sweep-report={tmp}/a\x00b"),
    ]


@pytest.mark.parametrize("case", range(8))
def test_a_path_a_command_cannot_use_exits_1_naming_it_before_any_host(
        tmp_path: Path, case: int, capsys: pytest.CaptureFixture[str]) -> None:
    words = output_cases(tmp_path)[case]
    assert fab(*words) == 1  # before: IsADirectoryError, ValueError... out of the task
    err = capsys.readouterr().err
    flag = words[-1].split("=")[0]
    assert f"[field {flag}] {flag} " in err and "a defect of tfsdeploy" not in err, err
    assert CONNECTIONS == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


@pytest.mark.parametrize("option", ["--load-factor", "--availability-factor"])
def test_a_capacity_factor_of_zero_exits_1_naming_it(
        option: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("plan-capacity", "--target-qps=100", "--per-instance-qps=10", f"{option}=0") == 1
    err = capsys.readouterr().err
    assert f"[field {option}] {option} '0': must be greater than 0" in err
    assert f"fix: set {option} greater than 0" in err


@pytest.mark.parametrize("weights", ["a,b", "50,25", "5,,25", "100"])
def test_deploy_check_refuses_canary_weights_the_deploy_would(
        weights: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("deploy", "--model=half_plus_two", "--check", f"--canary-weights={weights}") == 1
    assert "[field --canary-weights]" in capsys.readouterr().err
    assert CONNECTIONS == []


@pytest.mark.parametrize("url", ["junk", "https://[::1", "file:///etc/passwd"])
@pytest.mark.parametrize("check", [True, False], ids=["check", "deploy"])
def test_a_notify_url_that_is_none_exits_1_before_any_host(
        url: str, check: bool, capsys: pytest.CaptureFixture[str]) -> None:
    words = ("deploy", "--model=half_plus_two", f"--notify={url}", *(["--check"] * check))
    assert fab(*words) == 1
    err = capsys.readouterr().err
    assert "[field --notify]" in err and "a defect of tfsdeploy" not in err, err
    assert CONNECTIONS == []


@pytest.mark.parametrize("weights", ["\u0665", "1_0", "5,\uff12\uff15"])
def test_canary_weights_are_ascii_digits(weights: str, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    assert fab("deploy", "--model=half_plus_two", f"--canary-weights={weights}") == 1
    assert f"--canary-weights {weights!r} is not a comma-separated list" in \
        capsys.readouterr().err
    assert CONNECTIONS == []


def test_accept_duration_in_other_scripts_digits_exits_1_before_any_generator(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("accept", "--model=half_plus_two", "--duration=\u0663") == 1
    assert "[field --duration]" in capsys.readouterr().err
    assert CONNECTIONS == []
