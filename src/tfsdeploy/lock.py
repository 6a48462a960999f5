"""One deploy per model fleet at a time: a lock directory on a majority of the model's hosts.

`mkdir` is atomic on each host, and a deploy holds the lock only when it created the lock
directory on a strict majority of the model's hosts: two deploys from different machines (or a
person and a cron job), even with different views of which hosts answer, can never both hold
it, and one unreachable host does not block a rollback. The lock records who, from where,
when, and what; a lock whose process is gone is reported as stale (and broken when that
process ran on this machine); `fab lock --model M --break` removes any.
"""

from __future__ import annotations

import getpass
import json
import os
import random
import socket
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tfsdeploy import commands
from tfsdeploy.errors import ExitCode, TfsDeployError
from tfsdeploy.gates import Clock
from tfsdeploy.remote import HostUnreachable, Runner


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


@dataclass(frozen=True)
class LockSite:
    """Where one host keeps its part of the fleet lock."""

    host: str
    runner: Runner
    lock_dir: str


class LockQuorumLost(TfsDeployError):
    """Too few of the model's hosts answer to hold a majority lock."""

    exit_code = ExitCode.INVALID


def _attempt(site: LockSite, record: str, on_stale: Callable[[str], None] | None
             ) -> tuple[bool, LockInfo | None, bool]:
    """(taken, holder seen, reachable) for one site."""
    try:
        for _ in range(3):
            if site.runner.run(_acquire_argv(site.lock_dir, record)).ok:
                return True, None, True
            holder = read_lock(site.runner, site.lock_dir)
            if holder is None:
                continue  # released between our attempts: try again at once
            if not is_stale(holder):
                return False, holder, True
            break_lock(site.runner, site.lock_dir)
            if on_stale:
                on_stale(f"broke a stale lock on {site.host}: {holder.describe()} "
                         "(that process is gone)")
        return False, None, True
    except HostUnreachable:
        return False, None, False


def acquire_majority(sites: list[LockSite], info: LockInfo, *, wait_s: float, clock: Clock,
                     model: str, on_stale: Callable[[str], None] | None = None
                     ) -> list[LockSite]:
    """Take the lock on a strict majority of ``sites`` (all that answer), waiting up to
    ``wait_s`` for another holder; returns the sites taken. Raises LockHeld naming a holder,
    or LockQuorumLost when too few hosts answer."""
    record = json.dumps(info.__dict__)
    end = clock.now() + wait_s
    while True:
        with ThreadPoolExecutor(max_workers=min(16, len(sites))) as pool:
            outcomes = list(pool.map(lambda s: _attempt(s, record, on_stale), sites))
        taken = [s for s, (ok, _, _) in zip(sites, outcomes, strict=True) if ok]
        holders = [(s.host, h) for s, (_, h, _) in zip(sites, outcomes, strict=True) if h]
        answering = sum(1 for _, _, reachable in outcomes if reachable)
        if not holders and len(taken) * 2 > len(sites):
            return taken
        release_sites(taken, info)
        if not holders and answering * 2 <= len(sites):
            raise LockQuorumLost(
                f"only {answering} of the {len(sites)} hosts of {model} answer: the deploy "
                "lock needs a majority\n    fix: bring hosts back, or narrow the model's "
                "hosts in the inventory")
        if clock.now() >= end:
            host, holder = holders[0] if holders else (sites[0].host, None)
            described = holder.describe() if holder else "a concurrent deploy"
            raise LockHeld(
                f"another deploy of {model} holds the lock on {host}: {described}.\n"
                f"    fix: wait (--lock-wait SECONDS), or if no deploy is running, "
                f"`fab lock --model {model} --break`")
        clock.sleep(min(2.0, max(0.1, end - clock.now())) * random.uniform(0.5, 1.0))


def release_sites(sites: list[LockSite], info: LockInfo) -> list[str]:
    """Give the lock back where it is ours; returns the hosts where that failed."""
    failed = []
    for site in sites:
        try:
            release(site.runner, site.lock_dir, info)
        except HostUnreachable:
            failed.append(site.host)
    return failed
