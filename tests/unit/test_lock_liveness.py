"""Lock liveness on fake hosts (the lock scripts run for real on local data roots): no single
host's leftover part blocks a free majority, a paused canary's part left by a finished canary
is cleared (by the next run, promote, abort or `fab lock --break`), and a lock whose deploy
machine has rebooted since is stale."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.core.rollout.records import LockRecord
from tfsdeploy.hosts import lock
from tfsdeploy.run.canary import finish_canary
from tfsdeploy.run.jobs import Verb
from tfsdeploy.run.plans import NothingToDo
from tfsdeploy.run.views import lock_state

from . import runs
from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import MODEL, Recorder
from .test_lock import _plant, _stale, plant_release

run_deploy = partial(runs.run_deploy, count=3)
target = partial(runs.target, count=3)
CANARY = "r20260102-000000000-v2"


def _lock_dir(host: Any) -> Path:
    return host.dir / "r" / MODEL / "lock"


def _paused_part(host: Any, release: str = CANARY) -> LockRecord:
    paused = lock.new_lock_record("deploy hp2 v2").model_copy(update={"paused": release})
    _lock_dir(host).mkdir()
    (_lock_dir(host) / "info.json").write_text(paused.model_dump_json())
    return paused


# -- (b) a minority's leftovers never block a free majority ----------------------------------

def test_an_empty_lock_directory_on_one_host_does_not_block(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    _lock_dir(fleet["h2"]).mkdir()  # an acquisition killed between its mkdir and its rename
    assert run_deploy(world, 2).exit_code == ExitCode.OK
    assert not any(_lock_dir(h).exists() for h in fleet.hosts.values())


def test_an_unreadable_record_on_a_minority_does_not_block_a_majority(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    _lock_dir(fleet["h3"]).mkdir()
    (_lock_dir(fleet["h3"]) / "info.json").write_text("{")
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.OK, result.message
    lines, verdict = lock_state(target(world), connect=fleet.connect)
    assert lines[2].startswith("h3: a lock with an unreadable record"), lines
    assert verdict == "hp2: partly locked (1 of 3 hosts hold a lock record)"


def test_a_majority_still_held_by_another_run_blocks(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    holder = lock.new_lock_record("deploy hp2 v3")  # this process: it runs
    for name in ("h1", "h2"):
        site = lock.LockSite(name, fleet.connect(next(h for h in target(world).hosts
                                                      if h.name == name)),
                             HostPaths(root=str(fleet[name].dir / "r"), model=MODEL))
        _plant(site, holder)
    with pytest.raises(lock.LockHeld, match="deploy hp2 v3 by"):
        run_deploy(world, 2)
    assert not _lock_dir(fleet["h3"]).exists(), "the minority taken is given back"


# -- (a) a paused canary's part left on a host that was down ---------------------------------

def test_a_finished_canary_s_part_is_cleared_by_the_next_run(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    plant_release(fleet["h1"], CANARY, canary_state="done")  # promoted while h3 was down
    _paused_part(fleet["h3"])
    recorder = Recorder()
    assert run_deploy(world, 2, recorder).exit_code == ExitCode.OK
    assert f"cleared the lock part that the finished canary {CANARY} left on h3" in \
        recorder.notes
    assert not any(_lock_dir(h).exists() for h in fleet.hosts.values())


def test_an_open_canary_s_part_on_a_minority_still_refuses(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    plant_release(fleet["h3"], CANARY, canary_state="paused")  # h3 was down at the promote
    plant_release(fleet["h1"], CANARY, canary_state="done")
    paused = _paused_part(fleet["h3"])
    with pytest.raises(lock.LockHeld) as refused:
        run_deploy(world, 2)
    assert refused.value.exit_code == ExitCode.LOCKED
    assert f"release {CANARY} holds the lock on h3" in str(refused.value)
    assert "`fab promote --model hp2`" in str(refused.value)
    assert (_lock_dir(fleet["h3"]) / "info.json").read_text() == paused.model_dump_json()
    assert not _lock_dir(fleet["h1"]).exists() and not _lock_dir(fleet["h2"]).exists()


def test_the_next_promote_takes_the_left_part_with_the_free_hosts(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    plant_release(fleet["h1"], CANARY, canary_state="done")
    _paused_part(fleet["h3"])
    with pytest.raises(NothingToDo):  # the canary is promoted: nothing else to do
        finish_canary(Verb.PROMOTE, target(world), reporter=Recorder(), connect=fleet.connect,
                      clock=FrozenClock(), client_factory=FakeSlot)
    assert not any(_lock_dir(h).exists() for h in fleet.hosts.values()), \
        "the promote took h3's part with h1 and h2, and gave all three back"


def test_lock_break_clears_a_finished_canary_s_part_and_keeps_an_open_one(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    plant_release(fleet["h1"], CANARY, canary_state="aborted")
    _paused_part(fleet["h3"])
    lines, verdict = lock_state(target(world), breaking=True, connect=fleet.connect)
    assert lines[2].startswith("h3: broken, was the paused canary of release"), lines
    assert verdict.startswith("hp2: broken")
    assert not _lock_dir(fleet["h3"]).exists()
    # while a host is unreachable, nothing proves the canary finished
    _paused_part(fleet["h3"])
    fleet["h2"].unreachable = True
    lines, verdict = lock_state(target(world), breaking=True, connect=fleet.connect)
    assert "NOT broken" in lines[2] and "an unreachable host" in lines[2], lines
    assert _lock_dir(fleet["h3"]).exists()


# -- (c) a rebooted deploy machine ------------------------------------------------------------

OLD_BOOT = "0f0e0d0c-0000-4000-8000-000000000000"


def _journal_has(boot: str) -> None:
    """This machine's journal records ``boot`` as one of its own (as a run in that boot did)."""
    journal = lock.boot_journal()
    journal.parent.mkdir(parents=True, exist_ok=True)
    with journal.open("a") as handle:
        handle.write(f"{boot} {lock._identity()}\n")


def test_a_lock_of_a_deploy_machine_that_rebooted_since_is_stale() -> None:
    mine = lock.new_lock_record("deploy hp2 v1")
    assert lock.booted_here(mine.boot_id), "taking a lock journals this boot first"
    rebooted = mine.model_copy(update={"boot_id": OLD_BOOT})
    assert lock.stale_reason(rebooted) is None, "a boot this machine never recorded"
    _journal_has(OLD_BOOT)
    assert lock.stale_reason(rebooted) == "its deploy machine has rebooted since"
    assert lock.stale_reason(rebooted.model_copy(update={"paused": CANARY})) is None
    assert lock.stale_reason(_stale()) == "that process is gone"
    assert lock.stale_reason(mine) is None


def test_another_machine_with_the_same_machine_id_is_never_taken_for_a_reboot() -> None:
    """CI runner containers built from one image and cloned VMs share /etc/machine-id: a lock
    one of them holds, live on its own kernel, says another boot id with this machine's id."""
    twin = lock.new_lock_record("deploy hp2 v1").model_copy(update={"boot_id": OLD_BOOT})
    assert twin.machine_id == lock._machine_id()
    assert lock.stale_reason(twin) is None
    assert not lock.is_stale(twin)


def test_a_journal_line_another_machine_wrote_proves_nothing(tmp_path: Path) -> None:
    """A home directory shared by machines (a CI cache volume) shares the journal: a line
    written under another host name is not this machine's boot."""
    journal = lock.boot_journal()
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text(f"{OLD_BOOT} {lock._machine_id() or '-'} ci-runner-7\n")
    twin = lock.new_lock_record("deploy hp2 v1").model_copy(update={"boot_id": OLD_BOOT})
    assert lock.stale_reason(twin) is None


def test_a_run_breaks_the_lock_of_a_rebooted_deploy_machine(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    held = lock.new_lock_record("deploy hp2 v2").model_copy(
        update={"boot_id": OLD_BOOT, "pid": 1})
    for host in fleet.hosts.values():
        _lock_dir(host).mkdir()
        (_lock_dir(host) / "info.json").write_text(held.model_dump_json())
    with pytest.raises(lock.LockHeld):  # the boot is not this machine's as far as it knows
        run_deploy(world, 2)
    _journal_has(OLD_BOOT)
    recorder = Recorder()
    assert run_deploy(world, 2, recorder).exit_code == ExitCode.OK
    assert sum("(its deploy machine has rebooted since)" in n for n in recorder.notes) == 3


def test_a_promote_that_changed_nothing_hands_the_lock_back_to_the_paused_canary(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
    from tfsdeploy.run.deploy import deploy
    from tfsdeploy.run.operations import canary as canary_ops

    monkeypatch.setattr(canary_ops, "judge_step", lambda job, policy, weight: "as good")
    monkeypatch.setattr(canary_ops, "compare_predictions", lambda job, policy: "same")
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    paused = deploy(target(world), version=2, reporter=Recorder(), connect=fleet.connect,
                    clock=FrozenClock(), client_factory=FakeSlot,
                    canary=CanaryPolicy(weights=(25,), step_s=1, pause=True))
    assert paused.exit_code == ExitCode.PAUSED, paused.message
    fleet["h3"].unreachable = True  # the promote's preflight refuses: nothing changes
    refused = finish_canary(Verb.PROMOTE, target(world), reporter=Recorder(),
                            connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot)
    assert refused.exit_code == ExitCode.INVALID, refused.message
    for name in ("h1", "h2"):
        record = LockRecord.model_validate_json((_lock_dir(fleet[name]) / "info.json")
                                                .read_text())
        assert record.paused == paused.release_id, name
    fleet["h3"].unreachable = False
    done = finish_canary(Verb.PROMOTE, target(world), reporter=Recorder(),
                         connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot)
    assert done.exit_code == ExitCode.OK, done.message
    assert not any(_lock_dir(h).exists() for h in fleet.hosts.values())
