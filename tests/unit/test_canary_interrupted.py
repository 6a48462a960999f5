"""An interrupted canary on fake hosts: a canary deploy killed at a split weight (the proxy
shares h1's traffic between two releases, no host records a pause, the dead run's lock is
stale) is found by `fab status`, promote, abort and the guard; abort undoes it, promote
finishes it."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.observe.guard import GuardPolicy
from tfsdeploy.hosts import lock
from tfsdeploy.hosts.facts import gather
from tfsdeploy.run import plans
from tfsdeploy.run.canary import finish_canary
from tfsdeploy.run.deploy import deploy
from tfsdeploy.run.engine import RunResult
from tfsdeploy.run.guard import Look, PausedCanary, canary_of, guard
from tfsdeploy.run.jobs import Verb
from tfsdeploy.run.operations import canary as canary_ops
from tfsdeploy.run.views import status

from . import runs
from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import Recorder, manifest, paths, serving

run_deploy = partial(runs.run_deploy, count=3)
target = partial(runs.target, count=3)


def _killed_at_a_split(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
                       ) -> tuple[str, str]:
    """v1 everywhere, then a canary of v2 on h1 at 25 % whose run died there: the record it
    had written before the pause (status starting, no canary), the lock of a gone process.
    Returns (v1's release, v2's)."""
    monkeypatch.setattr(canary_ops, "judge_step", lambda job, policy, weight: "as good")
    monkeypatch.setattr(canary_ops, "compare_predictions", lambda job, policy: "same")
    first = run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    paused = deploy(target(world), version=2, reporter=Recorder(), connect=fleet.connect,
                         clock=FrozenClock(), client_factory=FakeSlot,
                         canary=CanaryPolicy(weights=(25,), step_s=1, pause=True))
    assert paused.exit_code == ExitCode.PAUSED, paused.message
    record_path = manifest(fleet["h1"], paused.release_id)
    record = json.loads(record_path.read_text())
    record.update(status="starting", canary=None)
    record_path.write_text(json.dumps(record))
    child = subprocess.Popen(["true"])
    child.wait()
    dead = lock.new_lock_record("deploy hp2").model_copy(
        update={"pid": child.pid, "pid_start": 1})
    for host in fleet.hosts.values():
        Path(paths(host).lock_dir, "info.json").write_text(dead.model_dump_json())
    return first.release_id, paused.release_id


def _facts(world: dict[str, Any]) -> dict[str, Any]:
    fleet: FakeFleet = world["fleet"]
    return {h.name: gather(fleet.connect(h), "hp2", paths(fleet[h.name]))
            for h in target(world).hosts}


def test_status_promote_abort_and_the_guard_find_it(world: dict[str, Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _, new = _killed_at_a_split(world, monkeypatch)
    facts = _facts(world)
    record, _, interrupted = plans.canary_under_way(facts)
    assert record is not None and record.id == new and interrupted
    assert plans.paused_canary(facts) == (None, None), "no host records a pause"
    found = canary_of(facts)
    assert found is not None and found.interrupted and found.release == new
    assert set(found.new_slots) == {"h1"}
    fleet: FakeFleet = world["fleet"]
    rows = {r["host"]: r for r in status(target(world), connect=fleet.connect)}
    assert rows["h1"]["canary"] == {"release": new, "state": "interrupted"}
    assert rows["h2"]["canary"] is None


def test_abort_returns_an_interrupted_canary_to_the_old_release(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = _killed_at_a_split(world, monkeypatch)
    fleet: FakeFleet = world["fleet"]
    recorder = Recorder()
    result = finish_canary(Verb.ABORT, target(world), reporter=recorder, connect=fleet.connect,
                           clock=FrozenClock(), client_factory=FakeSlot, judged=new)
    assert result.exit_code == ExitCode.OK, result.message
    assert any("broke a stale lock" in n for n in recorder.notes)
    assert all(serving(h) == [old] for h in fleet.hosts.values())
    after = _facts(world)["h1"]
    assert [c.release for c in after.taking_requests(0)] == [old]
    assert len(after.proxy.weights(0)) == 1
    assert after.record(new) is not None and after.record(new).status == "reverted"


def test_promote_finishes_an_interrupted_canary(world: dict[str, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _, new = _killed_at_a_split(world, monkeypatch)
    fleet: FakeFleet = world["fleet"]
    result = finish_canary(Verb.PROMOTE, target(world), reporter=Recorder(),
                           connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot)
    assert result.exit_code == ExitCode.OK, result.message
    assert all(serving(h) == [new] for h in fleet.hosts.values())


def test_the_guard_aborts_an_interrupted_canary_instead_of_rolling_back() -> None:
    from .test_guard_unattended import Readers, _target

    readers = Readers()
    acted: list[str] = []
    found = Look(PausedCanary("r20261201-020000000-v2", {"h1": "green"}, interrupted=True))

    def abort(release: str) -> RunResult:
        acted.append(f"abort {release}")
        return RunResult("m", 2, release)

    def rollback(judged: Any) -> RunResult:
        acted.append("rollback")
        return RunResult("m", 1, "r20261201-010000000-v1")

    code, message = guard(_target(), GuardPolicy(for_s=10, interval_s=5, duration_s=120,
                                                 min_requests=1),
                          reporter=Recorder(), read=readers.read, sleep=readers.sleep,
                          look=lambda _: found, act=rollback, abort=abort,
                          clock=lambda: readers.now)
    assert acted == ["abort r20261201-020000000-v2"] and int(code) == 2
    assert "aborted the interrupted canary r20261201-020000000-v2" in message
