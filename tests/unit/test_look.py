"""A look at the fleet (status, history, lock, exec) runs on the engine's own session: the
connections it asks for are opened once and closed at its end, and it ends at a stop signal
or at its deadline, saying which (exit 3), never hanging on a host that does not answer."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from tests.bounds import within
from tfsdeploy.core.errors import ExitCode
from tfsdeploy.run import engine
from tfsdeploy.run.jobs import Session

from .runs import target


class Counted:
    """A connection that counts its closes."""

    def __init__(self, name: str, closed: list[str]) -> None:
        self.name, self._closed = name, closed

    def close(self) -> None:
        self._closed.append(self.name)


def test_a_look_opens_each_host_once_and_closes_them_all(world: dict[str, Any]) -> None:
    aim = target(world, count=2)
    opened: list[str] = []
    closed: list[str] = []

    def connect(host: Any) -> Any:
        opened.append(host.name)
        return Counted(host.name, closed)

    def body(session: Session) -> list[str]:
        return [session.connection(h).name for h in (*aim.hosts, *aim.hosts)]

    assert engine.look(aim, body, connect=connect) == ["h1", "h2", "h1", "h2"]
    assert opened == ["h1", "h2"] and sorted(closed) == ["h1", "h2"]


def test_a_look_ends_at_its_deadline(world: dict[str, Any]) -> None:
    started = time.monotonic()
    with pytest.raises(engine.LookStopped) as stopped:
        engine.look(target(world, count=1), lambda session: time.sleep(30), deadline_s=0.3)
    # the 0.3 s deadline (its lower limit) ends it, not the 30 s body
    # measured in a full run (2 cores, 4 workers beside it): 0.305 s, margin 16.4x;
    # scripts/test prints it every run
    within("look past its deadline ended, s", time.monotonic() - started, below=5)
    assert stopped.value.exit_code == ExitCode.INCONSISTENT
    assert "ended at its 0.3 s deadline" in str(stopped.value)


def test_a_look_ends_at_sigterm_and_says_so(world: dict[str, Any]) -> None:
    def body(session: Session) -> None:
        # sent from the look's own body, so surely under its handler (a timer started before
        # the look could fire first on a slow machine and end the test process)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

    with pytest.raises(engine.LookStopped) as stopped:
        engine.look(target(world, count=1), body, deadline_s=None)
    assert "ended at SIGTERM" in str(stopped.value)


def test_a_failing_look_raises_its_own_error(world: dict[str, Any]) -> None:
    def body(session: Session) -> None:
        raise ValueError("no such thing")

    with pytest.raises(ValueError, match="no such thing"):
        engine.look(target(world, count=1), body)


class Hanging:
    """A connection whose every call hangs until it is closed (a host that stopped answering
    mid-read), then fails as a closed transport does; the first call of all sends SIGTERM to
    this process (the check is then surely reading, under the look's handler)."""

    def __init__(self, name: str, closed: list[str], calls: list[str]) -> None:
        self.name, self._closed, self._calls = name, closed, calls
        self._freed = threading.Event()

    def close(self) -> None:
        self._closed.append(self.name)
        self._freed.set()

    def __getattr__(self, attribute: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(self.name)
            if len(self._calls) == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            self._freed.wait()
            raise OSError("the connection was closed")
        return call


def test_a_check_is_a_look_it_ends_at_sigterm_and_closes_its_connections(
        world: dict[str, Any]) -> None:
    from tfsdeploy.run import plans

    plan = plans.deploy_plan(target(world, count=2), version=1)
    closed: list[str] = []
    calls: list[str] = []
    with pytest.raises(engine.LookStopped) as stopped:
        engine.check(plan, connect=lambda host: Hanging(host.name, closed, calls))
    assert "ended at SIGTERM before every host answered; nothing was changed" in \
        str(stopped.value)
    assert stopped.value.signal_name == "SIGTERM"
    assert sorted(closed) == ["h1", "h2"]  # each host's one connection, closed once
