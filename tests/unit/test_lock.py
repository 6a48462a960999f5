"""The fleet lock on real files: the lock scripts of commands/lock.py run on a local data root
(through LocalConnection), concurrently where two runs race."""

from __future__ import annotations

import json
import subprocess
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.fleet import HostVars, ResolvedHost
from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.core.rollout.records import LockRecord
from tfsdeploy.hosts import lock
from tfsdeploy.hosts.commands import lock as lock_commands
from tfsdeploy.run.views import lock_state

from . import runs
from .fakes import FakeFleet, FrozenClock, LocalConnection
from .runs import MODEL, manifest

# two hosts are enough for what these tests show
run_deploy = partial(runs.run_deploy, count=2)
target = partial(runs.target, count=2)


def _site(tmp_path: Path, fleet: FakeFleet | None = None) -> lock.LockSite:
    host = ResolvedHost("h1", "10.9.0.1", (), (), HostVars(data_root=str(tmp_path / "h1" / "r")))
    return lock.LockSite("h1", LocalConnection(host, fleet or FakeFleet()),
                         HostPaths(root=str(tmp_path / "h1" / "r"), model=MODEL))


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _stale(**changes: Any) -> LockRecord:
    """The record of a run on this machine whose process is gone (killed with -9)."""
    mine = lock.new_lock_record("deploy hp2 v1")
    return mine.model_copy(update={"token": "5ca1ab1e" * 4, "pid": _dead_pid(),
                                   "pid_start": 12345, **changes})


def _holder(site: lock.LockSite) -> str:
    return json.loads(Path(site.paths.lock_dir, "info.json").read_text())["token"]


def _plant(site: lock.LockSite, record: LockRecord) -> None:
    assert site.conn.run(lock_commands.acquire(site.paths, record.model_dump_json())).ok


def test_is_stale_only_for_a_gone_process_of_this_boot_and_pid_namespace() -> None:
    assert lock.is_stale(_stale())
    # another boot of another machine says nothing (this machine's: it rebooted, see
    # test_lock_liveness)
    assert not lock.is_stale(_stale(boot_id="0f0e0d0c-other-boot", machine_id="0" * 32))
    assert not lock.is_stale(_stale(pid_namespace="pid:[4026531999]"))
    assert not lock.is_stale(_stale(boot_id="", pid_namespace=""))  # an older record
    mine = lock.new_lock_record("deploy hp2 v1")
    assert not lock.is_stale(mine)  # this process runs
    # the pid now runs another process (started later than the lock's): the holder is gone
    assert lock.is_stale(mine.model_copy(update={"pid_start": mine.pid_start - 1}))


def test_a_late_breaker_never_deletes_the_fresh_lock(tmp_path: Path) -> None:
    site = _site(tmp_path)
    stale = _stale()
    _plant(site, stale)
    first, late = lock.new_lock_record("deploy hp2 v2"), lock.new_lock_record("rollback hp2")
    for record in (first, late):  # both read the stale record
        seen = site.conn.run(lock_commands.acquire(site.paths, record.model_dump_json()))
        assert seen.code == 3 and json.loads(seen.stdout)["token"] == stale.token
    assert lock.remove(site, stale.token) == (True, None)  # the first breaks it ...
    _plant(site, first)  # ... and takes the lock
    removed, now = lock.remove(site, stale.token)  # the late one breaks what it read
    assert not removed and now is not None and now.token == first.token
    assert _holder(site) == first.token
    with pytest.raises(lock.LockHeld, match="deploy hp2 v2 by"):
        lock.acquire_majority([site], late, wait_s=0, clock=FrozenClock(), model=MODEL)
    assert _holder(site) == first.token


def _race(sites: list[lock.LockSite], records: list[LockRecord]) -> tuple[list[str], list[str]]:
    """Each site's run takes the lock at the same moment: (tokens that won, LockHeld texts)."""
    start = threading.Barrier(len(sites))
    won: list[str] = []
    held: list[str] = []

    def attempt(site: lock.LockSite, record: LockRecord) -> None:
        start.wait()
        try:
            lock.acquire_majority([site], record, wait_s=0, clock=FrozenClock(), model=MODEL)
            won.append(record.token)
        except lock.LockHeld as error:
            held.append(str(error))

    threads = [threading.Thread(target=attempt, args=pair)
               for pair in zip(sites, records, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won, held


def test_two_breakers_of_one_stale_lock_at_once(tmp_path: Path) -> None:
    fleet = FakeFleet()
    for _ in range(8):
        sites = [_site(tmp_path, fleet), _site(tmp_path, fleet)]
        _plant(sites[0], _stale())
        won, held = _race(sites, [lock.new_lock_record(f"deploy hp2 by {n}") for n in "ab"])
        assert len(won) == 1 and len(held) == 1, (won, held)
        assert _holder(sites[0]) == won[0]  # the winner's lock is the one on the host
        assert lock.remove(sites[0], won[0]) == (True, None)
        assert not Path(sites[0].paths.lock_dir).exists()


UNREADABLE = {"empty": "", "cut": "{", "foreign": '{"token": "t", "who": "x"}',
              "binary": "\x00\x01\x02"}


@pytest.mark.parametrize("text", list(UNREADABLE.values()), ids=list(UNREADABLE))
def test_an_unreadable_lock_record_holds_and_lock_break_removes_it(
        world: dict[str, Any], text: str) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        (host.dir / "r" / MODEL / "lock").mkdir()
        (host.dir / "r" / MODEL / "lock" / "info.json").write_text(text)
    with pytest.raises(lock.LockHeld) as error:
        run_deploy(world, 2)
    assert error.value.exit_code == ExitCode.LOCKED
    assert "a lock whose record is unreadable" in str(error.value)
    lines, _ = lock_state(target(world), breaking=True, connect=fleet.connect)
    assert all("broken, was a lock with an unreadable record" in line for line in lines), lines
    assert not any((h.dir / "r" / MODEL / "lock").exists() for h in fleet.hosts.values())
    assert run_deploy(world, 2).exit_code == ExitCode.OK


def test_lock_break_removes_a_record_cut_after_its_token(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        (host.dir / "r" / MODEL / "lock").mkdir()
        (host.dir / "r" / MODEL / "lock" / "info.json").write_text(
            '{"token": "0123abcd", "who": "al')
    lock_state(target(world), breaking=True, connect=fleet.connect)
    assert not any((h.dir / "r" / MODEL / "lock").exists() for h in fleet.hosts.values())


def test_a_lock_directory_without_a_record_is_a_killed_acquisition_taken_over(
        world: dict[str, Any]) -> None:
    """Each host writes the record under flock in the command that made the directory: a
    directory without one, seen under that flock, is an acquisition killed in between."""
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        (host.dir / "r" / MODEL / "lock").mkdir()
        (host.dir / "r" / MODEL / "lock" / "info.json.tmp").write_text("")
    assert run_deploy(world, 2).exit_code == ExitCode.OK
    assert not any((h.dir / "r" / MODEL / "lock").exists() for h in fleet.hosts.values())


def test_a_paused_canary_s_lock_points_to_promote_or_abort_never_to_break(
        tmp_path: Path) -> None:
    site = _site(tmp_path)
    paused = lock.new_lock_record("deploy hp2 v2").model_copy(
        update={"paused": "r20260102-000000000-v2"})
    _plant(site, paused)
    with pytest.raises(lock.LockHeld) as error:
        lock.acquire_majority([site], lock.new_lock_record("deploy hp2 v3"), wait_s=0,
                              clock=FrozenClock(), model=MODEL)
    text = str(error.value)
    assert error.value.exit_code == ExitCode.LOCKED
    assert "a canary of hp2 is paused: release r20260102-000000000-v2 holds the lock" in text
    assert "`fab promote --model hp2`" in text and "`fab abort --model hp2`" in text
    assert "--break" not in text and "--lock-wait" not in text
    assert _holder(site) == paused.token


def test_lock_break_leaves_a_paused_canary_s_lock_and_names_promote_and_abort(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    paused = lock.new_lock_record("deploy hp2 v2").model_copy(
        update={"paused": "r20260102-000000000-v2"})
    for host in fleet.hosts.values():
        (host.dir / "r" / MODEL / "lock").mkdir()
        (host.dir / "r" / MODEL / "lock" / "info.json").write_text(paused.model_dump_json())
    # the canary host records the paused release: the canary is open
    plant_release(fleet["h1"], paused.paused, canary_state="paused")
    lines, verdict = lock_state(target(world), breaking=True, connect=fleet.connect)
    assert all("NOT broken" in line and "`fab abort --model hp2`" in line for line in lines)
    assert verdict.startswith("hp2: not broken")
    assert all((h.dir / "r" / MODEL / "lock" / "info.json").exists()
               for h in fleet.hosts.values())


def plant_release(host: Any, release_id: str, *, canary_state: str | None) -> None:
    """A release record on a fake host (a copy of the live one under another id), with a
    canary in ``canary_state`` (None: no canary)."""
    live = json.loads(Path(runs.paths(host).current, "manifest.json").read_text())
    record = {**live, "id": release_id, "status": "paused" if canary_state == "paused"
              else "serving", "canary": {"state": canary_state, "weights": [25], "weight": 25}
              if canary_state else None}
    path = manifest(host, release_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
