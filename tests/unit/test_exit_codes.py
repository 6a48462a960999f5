"""The exit-code contract of `fab deploy` and `fab rollback` (through cli.main, as tasks.py
calls it), interrupts, and how the proxy's admin API is reached."""

from __future__ import annotations

import json
import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pytest

from tfsdeploy.cli.main import main
from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.layout import PROXY_ADMIN_MOUNT
from tfsdeploy.hosts.commands.containers import proxy_spec
from tfsdeploy.hosts.ssh import SshConnection
from tfsdeploy.run import deploy as cli_deploy
from tfsdeploy.run import engine, plans
from tfsdeploy.run import rollback as cli_rollback
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import OPERATIONS, Ops

from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import MODEL, Recorder, inventory_file, paths, run_deploy


@pytest.fixture()
def fab(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """`fab deploy|rollback ...` as tasks.py runs it, on the fake fleet."""
    fleet: FakeFleet = world["fleet"]
    fakes = {"connect": fleet.connect, "clock": FrozenClock(), "client_factory": FakeSlot}
    monkeypatch.setattr(cli_deploy, "deploy", partial(cli_deploy.deploy, **fakes))
    monkeypatch.setattr(cli_rollback, "rollback", partial(cli_rollback.rollback, **fakes))

    def run(command: str, **options: Any) -> tuple[int, dict[str, Any]]:
        json_file = world["tmp"] / f"{command}.json"
        json_file.unlink(missing_ok=True)
        args = {"c": None, "model": MODEL, "inventory": inventory_file(world), "hosts": None,
                "limit": None, "playbook": None, "lock_wait": 0.0, "json": False,
                "log_file": None, "json_file": str(json_file), "metrics_file": None}
        if command == "deploy":
            args |= {"version": None, "check": False, "diff": False}
        else:
            args |= {"to": None}
        code = main(command, args | options)
        return code, json.loads(json_file.read_text())

    return run


def _no_traceback(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return out + err


def _switch_with_a_defect(job: HostJob, to: Literal["new", "old"] = "new") -> Ops:
    """switch_traffic with a defect of ours: raises whichever way it switches."""
    yield from ()
    raise RuntimeError(f"defect while switching to {to}")


def _disk_check_with_a_defect(job: HostJob, reserve_mib: int = 512) -> Ops:
    yield from ()
    raise KeyError("defect in check_disk")


def test_a_defect_in_an_operation_mid_roll_exits_3_with_the_json_file(
        fab: Any, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("deploy", version="1")[0] == 0
    monkeypatch.setitem(OPERATIONS, "switch_traffic", _switch_with_a_defect)
    code, written = fab("deploy", version="2")
    assert code == ExitCode.INCONSISTENT
    assert written["exit_code"] == 3 and written["result"] == "inconsistent"
    assert written["hosts"]["h1"]["status"] == "unknown"
    assert "RuntimeError: defect while switching to new" in written["hosts"]["h1"]["error"]
    assert {written["hosts"][h]["status"] for h in ("h2", "h3", "h4")} == {"skipped"}
    _no_traceback(capsys)


def test_a_defect_in_preflight_exits_1_with_the_json_file(
        fab: Any, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("deploy", version="1")[0] == 0
    fleet: FakeFleet = world["fleet"]
    runs = {n: len(h.docker.called("run")) for n, h in fleet.hosts.items()}
    monkeypatch.setitem(OPERATIONS, "check_disk", _disk_check_with_a_defect)
    code, written = fab("deploy", version="2")
    assert code == ExitCode.INVALID
    assert written["exit_code"] == 1
    assert "KeyError" in written["hosts"]["h1"]["error"]
    assert {n: len(h.docker.called("run")) for n, h in fleet.hosts.items()} == runs
    _no_traceback(capsys)


def test_a_defect_in_the_engine_after_hosts_changed_exits_3(
        fab: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert fab("deploy", version="1")[0] == 0
    FakeSlot.behaviour = {"10.9.0.1": "broken"}

    def rescue_with_a_defect(*args: Any, **kwargs: Any) -> str:
        raise AttributeError("defect in the rescue")

    monkeypatch.setattr(engine, "rescue_host", rescue_with_a_defect)
    code, written = fab("deploy", version="2")
    assert code == ExitCode.INCONSISTENT and written["exit_code"] == 3
    assert "unexpected AttributeError: defect in the rescue" in written["message"]
    _no_traceback(capsys)


def test_a_defect_before_any_host_exits_1_with_the_json_file(
        fab: Any, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def plan_with_a_defect(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("defect in planning")

    monkeypatch.setattr(plans, "deploy_plan", plan_with_a_defect)
    code, written = fab("deploy", version="1")
    assert code == ExitCode.INVALID and written["exit_code"] == 1
    assert "ZeroDivisionError" in _no_traceback(capsys)
    assert not world["fleet"].hosts


def test_rollback_to_a_release_on_an_unreachable_selected_host_exits_3(
        fab: Any, world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    first = fab("deploy", version="1")[1]["release"]
    fab("deploy", version="2")
    fleet: FakeFleet = world["fleet"]
    fleet["h1"].unreachable = True
    code, written = fab("rollback", to=first, hosts="h1")
    assert code == ExitCode.INCONSISTENT and written["exit_code"] == 3
    assert "every selected host is unreachable: nothing was rolled back" in written["message"]
    assert "every selected host is unreachable" in _no_traceback(capsys)
    for name in ("h2", "h3", "h4"):  # the lock was given back
        assert not Path(paths(fleet[name]).lock_dir).exists()


def test_rollback_to_a_release_with_every_host_unreachable_exits_3(
        fab: Any, world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    first = fab("deploy", version="1")[1]["release"]
    fab("deploy", version="2")
    for host in world["fleet"].hosts.values():
        host.unreachable = True
    code, written = fab("rollback", to=first)
    _no_traceback(capsys)
    assert code == ExitCode.INCONSISTENT and written["exit_code"] == 3


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT],
                         ids=["SIGHUP", "SIGTERM", "SIGINT"])
def test_hangup_terminate_and_ctrl_c_ask_the_run_to_stop(signum: signal.Signals) -> None:
    cancel, recorder = engine.Stop(), Recorder()
    before = signal.getsignal(signum)
    with engine.interrupts_cancel(cancel, recorder.note):
        os.kill(os.getpid(), signum)
        for _ in range(200):
            if cancel.is_set():
                break
            time.sleep(0.01)
        assert cancel.is_set()
        os.kill(os.getpid(), signum)  # a second one never cuts the restore short
        time.sleep(0.05)
    assert signal.getsignal(signum) is before
    assert recorder.notes[0].startswith(f"{signum.name}: finishing the current steps")
    assert recorder.notes[1] == "already stopping: restoring, then releasing the lock"


def test_a_hangup_mid_roll_restores_and_releases_the_lock(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)

    class HangsUp(Recorder):
        def step(self, host: str, phase: str, task: str, status: str, seconds: float,
                 detail: str) -> None:
            super().step(host, phase, task, status, seconds, detail)
            if (host, task) == ("h1", "start_slot"):
                os.kill(os.getpid(), signal.SIGHUP)  # the operator's SSH session dropped
                time.sleep(0.3)  # the handler runs in the main thread

    recorder = HangsUp()
    result = run_deploy(world, 2, recorder)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.message
    assert result.message.startswith("interrupted")
    assert result.hosts["h1"].status == "restored"
    assert any(n.startswith("SIGHUP") for n in recorder.notes)
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        assert host.running(MODEL) == [first.release_id]
        assert not Path(paths(host).lock_dir).exists()


def test_a_run_past_its_deadline_stops_restores_and_releases_the_lock(
        world: dict[str, Any]) -> None:
    """rollout.deadline_s: the deadline passes while h1's new slot starts (a step that outlasts
    it, as a hung host would); the run stops there as at SIGTERM: h1 restored, the hosts not
    reached skipped, the lock released, and the message says the deadline stopped it."""
    first = run_deploy(world, 1)

    class Outlasts(Recorder):
        def step(self, host: str, phase: str, task: str, status: str, seconds: float,
                 detail: str) -> None:
            super().step(host, phase, task, status, seconds, detail)
            if (host, task) == ("h1", "start_slot"):  # held until the deadline has passed
                end = time.monotonic() + 30
                while not any("deadline" in n for n in self.notes) and time.monotonic() < end:
                    time.sleep(0.01)

    recorder = Outlasts()
    # the fake run reaches h1's start_slot 0.27-0.29 s after it starts (idle machine): 3 s
    # leaves a margin of 10 for a busy one, and the step above waits for the deadline
    result = run_deploy(world, 2, recorder, deadline=3.0)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.message
    assert result.message.startswith(
        "stopped at its 3 s deadline (rollout.deadline_s); every host serves its previous "
        "release"), result.message
    assert [n for n in recorder.notes if "deadline" in n] == [
        "the run's 3 s deadline passed: finishing the current steps, then restoring; the "
        "lock is released at the end"]
    assert {n: o.status for n, o in result.hosts.items()} == {
        "h1": "restored", "h2": "skipped", "h3": "skipped", "h4": "skipped"}
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        assert host.running(MODEL) == [first.release_id]
        assert not Path(paths(host).lock_dir).exists()


def test_a_run_within_its_deadline_is_not_stopped(world: dict[str, Any]) -> None:
    result = run_deploy(world, 1, deadline=60.0)
    assert result.exit_code == ExitCode.OK, result.message


def test_the_proxy_admin_is_reached_through_socat_on_its_unix_socket_only(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    run_deploy(world, 2)
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        where = paths(host)
        admin = [a for a in host.log if a[:1] == ["socat"]]
        assert admin and all(a == ["socat", "-t", "5", "-", f"UNIX-CONNECT:{where.admin_socket}"]
                             for a in admin)
        assert any(c.startswith("set server") for c in host.proxy.admin)
        # the facts command's `show stat` goes the same way (one argv, the socket's path)
        facts = [a for a in host.log if a[:2] == ["sh", "-c"] and "@@proxy" in a[2]]
        assert facts and all(where.admin_socket in a for a in facts)
        assert 'socat -t 2 - "UNIX-CONNECT:$sock"' in facts[0][2]
        config = Path(where.proxy_dir, "haproxy.cfg").read_text()
        assert "stats socket /run/tfsdeploy-admin/admin.sock mode 600 level admin" in config
        assert "ipv4@" not in config and ":8599" not in config  # no TCP admin port
        assert oct(Path(where.admin_dir).stat().st_mode & 0o777) == "0o700"
        assert Path(where.admin_socket).is_socket()
    spec = proxy_spec(model=MODEL, image="reg/proxy:2.6", paths=paths(fleet["h1"]))
    assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [
        (paths(fleet["h1"]).proxy_dir, "/usr/local/etc/haproxy", True),
        (paths(fleet["h1"]).admin_dir, PROXY_ADMIN_MOUNT, False)]
    assert not hasattr(SshConnection, "tunnel")  # no port forwarding to reach it


# A Ctrl-C that comes while the progress printer holds its lock (the main thread inside a
# line's write): before, the engine's handler printed from Python's signal handler, in that
# same thread, and waited for the lock forever (a deploy hung after "already stopping").
_SIGNAL_IN_A_WRITE = """
import io, os, signal, sys, threading
from tfsdeploy.cli.output import LineReporter
from tfsdeploy.run import engine

class Stream(io.StringIO):
    sent = 0
    def write(self, text):
        if self.sent < 2:  # the first press, then a second one, each inside a write
            self.sent += 1
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(text)

stream = Stream()
reporter = LineReporter(stream)
cancel = engine.Stop()
with engine.interrupts_cancel(cancel, reporter.note):
    reporter.note("a progress line")
    cancel.wait(10)
    reporter.note("another progress line")
sys.__stdout__.write(stream.getvalue())
"""


def test_a_signal_that_comes_while_a_line_is_printed_is_said_without_a_hang() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SIGNAL_IN_A_WRITE], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    said = [line.split("== ", 1)[1] for line in done.stdout.splitlines()]
    assert said[0] == "a progress line"
    assert "SIGINT: finishing the current steps, then restoring; the lock is released at " \
           "the end" in said
    assert "already stopping: restoring, then releasing the lock" in said
    assert "another progress line" in said
