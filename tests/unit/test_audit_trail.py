"""A host's audit appends made while the next step runs (run.jobs.AuditTrail): in order, one
at a time, and a lost append raised to the run at the next wait."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.run.jobs import AuditTrail


@dataclass
class SlowHost:
    """Records each append's lines; each takes ``delay`` seconds; fails from ``fail_at``."""

    delay: float = 0.05
    fail_at: int | None = None
    gate: threading.Event | None = None  # when given, each append waits for it (5 s at most)
    threads: set[str] = field(default_factory=set)
    appended: list[list[str]] = field(default_factory=list)
    at_once: int = 0
    most_at_once: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def host(self) -> Any:
        return type("H", (), {"name": "h1"})()

    def run(self, argv: list[str], **_: Any) -> None:
        with self.lock:
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
        self.threads.add(threading.current_thread().name)
        try:
            if self.gate is not None:
                self.gate.wait(5)
            time.sleep(self.delay)
            if self.fail_at is not None and len(self.appended) >= self.fail_at:
                raise HostUnreachable("h1: connection lost during `sh ...`")
            self.appended.append(argv[argv.index("/a.log") + 1:])  # the lines follow the path
        finally:
            with self.lock:
                self.at_once -= 1


def test_appends_are_made_in_order_one_at_a_time_and_off_the_callers_path() -> None:
    # the append waits until the test opens the gate: one made in the caller's thread would
    # have finished (after the gate's 5 s) before later() returned
    gate = threading.Event()
    host, trail = SlowHost(delay=0.05, gate=gate), AuditTrail()
    trail.later(host, "/a.log", ["1a", "1b"])  # type: ignore[arg-type]
    assert host.appended == []  # the first append did not hold its step
    gate.set()
    trail.later(host, "/a.log", ["2a", "2b"])  # type: ignore[arg-type]
    trail.later(host, "/a.log", ["3a", "3b"])  # type: ignore[arg-type]
    trail.wait()
    assert host.appended == [["1a", "1b"], ["2a", "2b"], ["3a", "3b"]]
    assert host.most_at_once == 1
    assert threading.current_thread().name not in host.threads


def test_a_lost_append_is_raised_at_the_next_wait_and_only_once() -> None:
    host, trail = SlowHost(delay=0.01, fail_at=1), AuditTrail()
    trail.later(host, "/a.log", ["1"])  # type: ignore[arg-type]
    trail.later(host, "/a.log", ["2"])  # type: ignore[arg-type]
    with pytest.raises(HostUnreachable, match="connection lost"):
        trail.wait()
    trail.wait()  # nothing pending any more
    assert host.appended == [["1"]]
