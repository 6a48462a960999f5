"""One deploy per model fleet at a time: a lock directory on the fleet's first host.

`mkdir` is atomic, so two deploys from different machines (or a person and a cron job) cannot
both take it. The lock records who, from where, when, and what; a lock whose process is gone is
reported as stale and can be broken with `fab lock --model M --break`.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tfsdeploy import commands
from tfsdeploy.errors import ExitCode, TfsDeployError
from tfsdeploy.gates import Clock
from tfsdeploy.remote import Runner


class LockHeld(TfsDeployError):
    """Another deploy holds the lock."""

    exit_code = ExitCode.LOCKED


@dataclass(frozen=True)
class LockInfo:
    """What the lock records."""

    token: str
    who: str
    machine: str
    pid: int
    started: str
    command: str

    def describe(self) -> str:
        """One line for people."""
        return (f"{self.command} by {self.who}@{self.machine} (pid {self.pid}) since "
                f"{self.started}")


def current_user() -> str:
    """``user@machine`` of this process."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def new_lock_info(command: str) -> LockInfo:
    """The record of a lock this process is about to take."""
    return LockInfo(token=uuid.uuid4().hex, who=getpass.getuser(), machine=socket.gethostname(),
                    pid=os.getpid(), started=datetime.now(UTC).isoformat(timespec="seconds"),
                    command=command)


def is_stale(info: LockInfo) -> bool:
    """A lock taken on this machine by a process that no longer exists."""
    if info.machine != socket.gethostname():
        return False
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _acquire_argv(lock_dir: str, record: str) -> list[str]:
    return ["sh", "-c", 'mkdir -p "$(dirname "$1")" && mkdir "$1" 2>/dev/null && '
            'printf "%s" "$2" > "$1/info.json"', "sh", lock_dir, record]


def read_lock(runner: Runner, lock_dir: str) -> LockInfo | None:
    """The current holder, or None when the lock is free."""
    result = runner.run(commands.read_file(f"{lock_dir}/info.json"))
    if not result.ok:
        exists = runner.run(["test", "-d", lock_dir]).ok
        return LockInfo("?", "unknown", "unknown", 0, "unknown", "unknown") if exists else None
    data: dict[str, Any] = json.loads(result.stdout)
    return LockInfo(**data)


def acquire(runner: Runner, lock_dir: str, info: LockInfo, *, wait_s: float, clock: Clock,
            model: str, on_stale: Callable[[str], None] | None = None) -> None:
    """Take the lock, waiting up to ``wait_s``; raise LockHeld naming the holder.

    A lock left by a dead process of this machine (kill -9, a crashed cron job) is broken
    and reported; a lock from another machine is never broken here.
    """
    record = json.dumps(info.__dict__)
    end = clock.now() + wait_s
    while True:
        if runner.run(_acquire_argv(lock_dir, record)).ok:
            return
        holder = read_lock(runner, lock_dir)
        if holder is None:
            continue  # released between our attempts: try again at once
        if is_stale(holder):
            break_lock(runner, lock_dir)
            if on_stale:
                on_stale(f"broke a stale lock: {holder.describe()} (that process is gone)")
            continue
        if clock.now() >= end:
            stale = " It looks STALE: that process is gone." if is_stale(holder) else ""
            raise LockHeld(
                f"another deploy of {model} holds the lock on {runner.host.name}: "
                f"{holder.describe()}.{stale}\n    fix: wait (--lock-wait SECONDS), or if no "
                f"deploy is running, `fab lock --model {model} --break`")
        clock.sleep(min(2.0, max(0.1, end - clock.now())))


def release(runner: Runner, lock_dir: str, info: LockInfo) -> bool:
    """Give the lock back if it is still ours."""
    holder = read_lock(runner, lock_dir)
    if holder is None or holder.token != info.token:
        return False
    return runner.run(commands.remove_tree(lock_dir)).ok


def break_lock(runner: Runner, lock_dir: str) -> LockInfo | None:
    """Remove the lock whoever holds it; returns what it recorded."""
    holder = read_lock(runner, lock_dir)
    runner.run(commands.remove_tree(lock_dir))
    return holder
