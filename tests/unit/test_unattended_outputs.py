"""A run's exit code, JSON result and textfile describe what happened on the fleet, whatever
happens to stdout, stderr, the terminal or the hooks afterwards; text from hosts is shown
escaped. `fab deploy`, `status` and `lock` through cli.main, as tasks.py calls it, on fake
hosts, with a terminal that closes, a pipe whose reader went away, host text that rich would
take as markup, a textfile that cannot be read back and a NUL in a hook variable."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pytest

from tfsdeploy.cli import around as cli_around
from tfsdeploy.cli import main as cli_main
from tfsdeploy.cli.main import main
from tfsdeploy.cli.unattended import read_samples
from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.rollout.records import LockRecord
from tfsdeploy.run import deploy as cli_deploy
from tfsdeploy.run import engine, survey
from tfsdeploy.run import views as cli_fleet
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import OPERATIONS, Ops

from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import MODEL, inventory_file, paths

ROOT = Path(__file__).resolve().parents[2]
FAB = str(Path(sys.executable).with_name("fab"))
Ran = tuple[int, dict[str, Any], dict[str, float]]


@pytest.fixture()
def fab(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """`fab deploy|status|lock ...` as tasks.py runs it, on the fake fleet, with --json-file
    and --metrics-file: (exit code, the JSON result, the textfile's samples)."""
    fleet: FakeFleet = world["fleet"]
    monkeypatch.setattr(cli_deploy, "deploy", partial(
        cli_deploy.deploy, connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot))
    monkeypatch.setattr(cli_fleet, "status", partial(cli_fleet.status, connect=fleet.connect))
    monkeypatch.setattr(cli_fleet, "lock_state", partial(cli_fleet.lock_state,
                                                         connect=fleet.connect))

    def run(command: str, **options: Any) -> Ran:
        json_file, metrics = world["tmp"] / f"{command}.json", world["tmp"] / "tfsdeploy.prom"
        json_file.unlink(missing_ok=True)
        args: dict[str, Any] = {"c": None, "model": MODEL,
                                "inventory": inventory_file(world, count=2)}
        if command == "deploy":
            args |= {"hosts": None, "limit": None, "playbook": None, "lock_wait": "0",
                     "json": False, "log_file": None, "json_file": str(json_file),
                     "metrics_file": str(metrics), "version": None, "check": False,
                     "diff": False, "canary_weights": None, "step_s": None, "pause": False,
                     "hooks": None, "notify": None}
        elif command == "status":
            args |= {"hosts": None, "limit": None, "json": False}
        else:
            args |= {"break_": False}
        code = main(command, args | options)
        written = json.loads(json_file.read_text()) if json_file.exists() else {}
        return code, written, read_samples(str(metrics)) if metrics.exists() else {}

    return run


def exit_sample(samples: dict[str, float], command: str = "deploy") -> float:
    """The textfile's tfsdeploy_last_run_exit_code of ``command`` on the test model."""
    return samples[f'tfsdeploy_last_run_exit_code{{command="{command}",model="{MODEL}"}}']


class ClosedTerminal(io.TextIOBase):
    """A stdout or stderr that can no longer be written, as ``error`` says."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.attempts = 0

    def write(self, text: str) -> int:
        self.attempts += 1
        raise self.error

    def flush(self) -> None:
        raise self.error


LOST = {
    "EIO: the operator's SSH session closed": OSError(errno.EIO, "Input/output error"),
    "EPIPE: the reader of the pipe stopped early": BrokenPipeError(errno.EPIPE, "Broken pipe"),
    "the stream was closed": ValueError("I/O operation on closed file."),
}


@pytest.mark.parametrize("lost", list(LOST))
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_a_run_whose_terminal_is_gone_keeps_its_exit_code_json_and_textfile(
        fab: Any, monkeypatch: pytest.MonkeyPatch, lost: str, as_json: bool) -> None:
    assert fab("deploy", version="1")[0] == 0
    FakeSlot.behaviour = {"10.9.0.1": "broken"}  # v2 fails its gate on h1: rolled back
    out, err = ClosedTerminal(LOST[lost]), ClosedTerminal(LOST[lost])
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    code, written, samples = fab("deploy", version="2", json=as_json)
    assert code == ExitCode.ROLLED_BACK
    assert (written["exit_code"], written["result"]) == (2, "rolled_back")
    assert written["hosts"]["h1"]["status"] == "restored"
    assert exit_sample(samples) == 2
    assert out.attempts >= 1  # it was written to, and failed


def _switch_failing_with(message: str) -> Any:
    def switch(job: HostJob, to: Literal["new", "old"] = "new") -> Ops:
        yield from ()
        raise RuntimeError(message)
    return switch


HOSTILE = "cannot read [/srv/tfsdeploy/hp2] \x1b]0;owned\x07\x1b[2J\rlater"


def test_an_error_from_a_host_with_markup_and_escapes_is_shown_as_text(
        fab: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("deploy", version="1")[0] == 0
    capsys.readouterr()
    monkeypatch.setitem(OPERATIONS, "switch_traffic", _switch_failing_with(HOSTILE))
    code, written, samples = fab("deploy", version="2")
    assert code == ExitCode.INCONSISTENT
    assert written["exit_code"] == 3 and exit_sample(samples) == 3
    assert HOSTILE in written["hosts"]["h1"]["error"]  # the record keeps the exact text
    out, err = capsys.readouterr()
    assert "[/srv/tfsdeploy/hp2]" in out  # rich took it for a closing tag (MarkupError)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x0dlater" in out
    assert not {"\x1b", "\x07", "\r"} & set(out + err)


def _lock_of(fleet: FakeFleet, host: str, *, who: str, machine: str) -> None:
    record = LockRecord(token="0123abcd", who=who, machine=machine, pid=4242,
                        started="2026-12-01T03:00:00Z", command="deploy hp2")
    where = Path(paths(fleet[host]).lock_dir)
    where.mkdir(parents=True, exist_ok=True)
    (where / "info.json").write_text(record.model_dump_json())


def test_a_lock_holder_named_with_markup_and_escapes_is_shown_as_text(
        fab: Any, world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("deploy", version="1")[0] == 0
    _lock_of(world["fleet"], "h1", who="[bold]x", machine="m[/srv]\x1b[31m\x00")
    capsys.readouterr()
    assert fab("status")[0] == 0  # rich took "[/srv]" for a closing tag (MarkupError)
    out = capsys.readouterr().out
    assert "[bold]x@m[/srv]" in out and "\\x1b[31m" in out, out  # a cell may wrap after
    assert "\x1b" not in out and "\x00" not in out
    assert fab("lock")[0] == 0
    out = capsys.readouterr().out
    assert "h1: deploy hp2 by [bold]x@m[/srv]\\x1b[31m\\x00 (pid 4242)" in out
    assert "\x1b" not in out and "\x00" not in out


def test_a_textfile_that_cannot_be_read_back_is_rewritten_with_this_run(
        fab: Any, world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    metrics = world["tmp"] / "tfsdeploy.prom"
    metrics.write_bytes(
        b'\xff\xfe not UTF-8\n'
        b'tfsdeploy_last_run_exit_code{command="rollback",model="hp2"} 1x\n'
        b'tfsdeploy_last_run_exit_code{command="guard",model="other"} 2\n')
    code, written, samples = fab("deploy", version="1")
    assert code == 0 and written["exit_code"] == 0
    assert exit_sample(samples) == 0
    assert samples['tfsdeploy_last_run_exit_code{command="guard",model="other"}'] == 2
    assert not any('command="rollback"' in key for key in samples)  # "1x" is no sample


def _hook(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text("#!/bin/sh\n" + body)
    (directory / name).chmod(0o755)


def test_a_nul_in_a_hook_variable_neither_skips_the_hook_nor_changes_the_exit_code(
        fab: Any, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert fab("deploy", version="1")[0] == 0
    hooks, seen = world["tmp"] / "hooks", world["tmp"] / "message.txt"
    _hook(hooks, "on-failure", f'printf %s "$TFSDEPLOY_MESSAGE" > {seen}\n')
    FakeSlot.behaviour = {"10.9.0.1": "broken"}

    def rescue_quoting_a_host(*args: Any, **kwargs: Any) -> str:
        raise AttributeError("a host said a\x00b")  # the run's message quotes it

    monkeypatch.setattr(engine, "rescue_host", rescue_quoting_a_host)
    code, written, samples = fab("deploy", version="2", hooks=str(hooks))
    assert code == ExitCode.INCONSISTENT
    assert written["exit_code"] == 3 and exit_sample(samples) == 3
    assert "a host said a\\x00b" in seen.read_text()  # execve takes no NUL: shown escaped
    (ran,) = [h for h in written["hooks"] if h["hook"] == "on-failure"]
    assert ran["ok"], ran


def test_a_hangup_while_the_post_hooks_run_ends_nothing(
        fab: Any, world: dict[str, Any]) -> None:
    # the operator's session closes while post-deploy runs: SIGHUP's default action would
    # kill the process before the hooks, the JSON result's hook report and the summary
    hooks, done = world["tmp"] / "hooks", world["tmp"] / "post-deploy.done"
    _hook(hooks, "post-deploy", f"kill -HUP $PPID\nsleep 0.3\necho finished > {done}\n")
    code, written, samples = fab("deploy", version="1", hooks=str(hooks))
    assert code == 0 and written["exit_code"] == 0 and exit_sample(samples) == 0
    assert done.read_text() == "finished\n"
    (ran,) = [h for h in written["hooks"] if h["hook"] == "post-deploy"]
    assert ran["ok"], ran


def _deploy_with_orphan_notes(fab: Any, monkeypatch: pytest.MonkeyPatch,
                              first: Callable[[], None]) -> Ran:
    """`fab deploy --version 1` whose orphan notes' read does ``first``, then hangs (until
    the deploy has returned)."""
    release = threading.Event()

    def hanging(*args: Any) -> list[str]:
        first()
        release.wait(120)
        return ["a late note"]

    monkeypatch.setattr(survey, "orphan_notes", hanging)
    try:
        return fab("deploy", version="1")
    finally:
        release.set()


def test_a_note_read_that_hangs_is_left_at_its_deadline_and_the_result_recorded(
        fab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a host that hangs while the deploy's notes read the fleet (its orphans) must not hold
    # back the recorded result: the read is left at the notes' deadline, and says so
    monkeypatch.setattr(engine, "NOTES_DEADLINE_S", 0.3)
    code, written, samples = _deploy_with_orphan_notes(fab, monkeypatch, lambda: None)
    assert code == 0 and written["exit_code"] == 0 and exit_sample(samples) == 0
    assert written["message"].endswith(
        "; not read (the 0.3 s deadline passed first; recorded without it)"), written["message"]


def test_a_sigterm_while_the_notes_are_read_leaves_them_and_records_the_roll_s_result(
        fab: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # cron's timeout, a systemd stop
    code, written, samples = _deploy_with_orphan_notes(
        fab, monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert code == 0 and written["exit_code"] == 0 and exit_sample(samples) == 0
    assert written["message"].endswith(
        "; not read (SIGTERM came first; recorded without it)"), written["message"]
    assert "SIGTERM after the roll: its result stands as recorded" in capsys.readouterr().out


def test_anything_failing_after_the_run_leaves_its_exit_code_and_outputs(
        fab: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def after_with_a_defect(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("defect in the post-hooks")

    monkeypatch.setattr(cli_around, "after", after_with_a_defect)
    assert fab("deploy", version="1")[0] == 0
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    code, written, samples = fab("deploy", version="2", hooks=None)
    assert code == ExitCode.ROLLED_BACK
    assert written["exit_code"] == 2 and exit_sample(samples) == 2
    err = capsys.readouterr().err
    assert "after the run (exit code 2, already recorded): RuntimeError: defect in the " \
           "post-hooks" in err


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess[str]:
    """`fab ARGS | head -0`: stdout is a pipe whose reader is gone before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        env = dict(os.environ, TFSDEPLOY_TESTBED_DIR="/nonexistent/no-testbed")
        return subprocess.run([FAB, *args], cwd=ROOT, env=env, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("hosts",), ("deploy", "--help"), ("--list",)],
                         ids=["hosts", "task help", "list"])
def test_a_pipe_closed_early_ends_quietly_with_the_commands_code(args: tuple[str, ...]
                                                                  ) -> None:
    done = _closed_pipe_run(*args)
    assert (done.returncode, done.stderr) == (0, "")


def test_a_refused_run_into_a_closed_pipe_exits_1_with_its_json(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    done = _closed_pipe_run("deploy", "--model", "nonexistent-model", "--json-file",
                            str(result))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert json.loads(result.read_text())["exit_code"] == 1


def test_the_guard_s_textfile_and_exit_code_survive_a_closed_terminal(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from tfsdeploy.run import guard as cli_guard

    def rolled_back(*args: Any, **kwargs: Any) -> tuple[ExitCode, str]:
        return ExitCode.ROLLED_BACK, "rolled back: h1 answered [/srv/x] \x1b[2J"

    monkeypatch.setattr(cli_guard, "guard", rolled_back)
    monkeypatch.setattr(sys, "stdout", ClosedTerminal(LOST["EIO: the operator's SSH session "
                                                           "closed"]))
    metrics = world["tmp"] / "guard.prom"
    code = main("guard", {
        "c": None, "model": MODEL, "inventory": inventory_file(world, count=2), "hosts": None,
        "limit": None, "max_error_rate": "0.01", "slo_p99_ms": None, "for_s": "30",
        "interval_s": "5", "duration_s": None, "min_requests": "20",
        "count_client_errors": False, "lock_wait": "60", "hooks": None, "notify": None,
        "log_file": None, "metrics_file": str(metrics)})
    assert code == ExitCode.ROLLED_BACK
    assert exit_sample(read_samples(str(metrics)), "guard") == 2


def test_the_guard_records_its_json_result_and_textfile_before_its_after_passes(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`fab guard --json-file F --metrics-file P --json`: F and P hold the guard's own end
    (exit 2, its message) before its after-passes run; an after-pass that fails changes
    neither; stdout is the same JSON result."""
    from tfsdeploy.run import guard as cli_guard

    def rolled_back(*args: Any, **kwargs: Any) -> tuple[ExitCode, str]:
        return ExitCode.ROLLED_BACK, "rolled back: the P99 broke the SLO on h1"

    json_file, metrics = world["tmp"] / "guard.json", world["tmp"] / "guard.prom"
    seen: dict[str, Any] = {}

    def after_pass_that_fails(*args: Any, **kwargs: Any) -> None:
        seen["json"] = json.loads(json_file.read_text())
        seen["exit"] = exit_sample(read_samples(str(metrics)), "guard")
        raise RuntimeError("the runbook's host is gone")

    monkeypatch.setattr(cli_guard, "guard", rolled_back)
    monkeypatch.setattr(cli_main, "_guard_after", after_pass_that_fails)
    code = main("guard", {
        "c": None, "model": MODEL, "inventory": inventory_file(world, count=2), "hosts": None,
        "limit": None, "max_error_rate": "0.01", "slo_p99_ms": None, "for_s": "30",
        "interval_s": "5", "duration_s": None, "min_requests": "20",
        "count_client_errors": False, "lock_wait": "60", "hooks": None, "notify": None,
        "json": True, "log_file": None, "json_file": str(json_file),
        "metrics_file": str(metrics)})
    assert code == ExitCode.ROLLED_BACK
    recorded = seen["json"]
    assert (recorded["command"], recorded["model"], recorded["exit_code"], recorded["result"],
            recorded["message"]) == ("guard", MODEL, 2, "rolled_back",
                                     "rolled back: the P99 broke the SLO on h1"), recorded
    assert seen["exit"] == 2
    assert json.loads(json_file.read_text()) == recorded
    assert exit_sample(read_samples(str(metrics)), "guard") == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == recorded
    assert "after the run (its end already recorded): RuntimeError: the runbook's host is " \
           "gone (in the guard's runbook)" in err


def test_container_output_in_logs_and_exec_is_shown_escaped_behind_its_prefix(
        fab: Any, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from .fakes import FakeDocker

    assert fab("deploy", version="1")[0] == 0
    fleet: FakeFleet = world["fleet"]
    forged = "\rh2        all good\x1b[2K\x1b]0;owned\x07"

    def log_lines(docker: FakeDocker, name: str, **options: Any) -> Any:
        yield f"2026-12-01T03:00:00.000000000Z {forged}"

    def run_in(docker: FakeDocker, name: str, argv: list[str]) -> tuple[int, str]:
        return 0, forged + "\n"

    monkeypatch.setattr(FakeDocker, "log_lines", log_lines, raising=False)
    monkeypatch.setattr(FakeDocker, "exec", run_in, raising=False)
    monkeypatch.setattr(cli_fleet, "logs", partial(cli_fleet.logs, connect=fleet.connect))
    monkeypatch.setattr(cli_fleet, "exec_in", partial(cli_fleet.exec_in, connect=fleet.connect))
    capsys.readouterr()
    base = {"c": None, "model": MODEL, "inventory": inventory_file(world, count=2),
            "hosts": "h1", "limit": None}
    assert main("logs", {**base, "lines": "5", "follow": False, "since": None}) == 0
    monkeypatch.setattr(sys, "argv", ["fab", "exec", "--", "cat", "x"])
    assert main("exec", {**base, "force": False, "argv": ["cat", "x"]}) == 0
    out = capsys.readouterr().out
    escaped = "\\x0dh2        all good\\x1b[2K\\x1b]0;owned\\x07"
    assert f"2026-12-01T03:00:00.000000000Z h1        {escaped}" in out.splitlines()
    assert f"h1        {escaped}" in out.splitlines()
    assert not {"\x1b", "\x07", "\r"} & set(out)
