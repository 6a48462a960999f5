"""The rolling deploy against fake hosts and a frozen clock: batches, gates, restore, revert,
policy, lock and exit codes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.rollout.records import parse_audit
from tfsdeploy.hosts.lock import LockHeld, LockQuorumLost

from .fakes import FakeFleet, FakeHost, FakeSlot, read_json
from .runs import MODEL, Recorder, current, manifest, paths, run_deploy, serving

HOLDER = {"token": "0123abcd", "who": "alice", "machine": "elsewhere", "pid": 7,
          "started": "2026-11-30T10:00:00+00:00", "command": "deploy hp2 v9"}


def _hold_lock(host: FakeHost, record: dict[str, Any]) -> None:
    lock = paths(host).lock_dir
    (host.dir / "r" / MODEL / "lock").mkdir(parents=True)
    (host.dir / "r" / MODEL / "lock" / "info.json").write_text(json.dumps(record))
    assert lock == str(host.dir / "r" / MODEL / "lock")


def test_first_deploy_then_roll_to_v2(world: dict[str, Any]) -> None:
    recorder = Recorder()
    first = run_deploy(world, 1, recorder)
    assert first.exit_code == ExitCode.OK, first.message
    assert {o.status for o in first.hosts.values()} == {"rolled"}
    assert recorder.notes[1:3] == ["batch 1/2: h1", "batch 2/2: h2, h3, h4"]
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        runs = host.docker.called("run")
        assert [s.labels["tfsdeploy.role"] for s in runs] == ["server", "proxy"]
        assert serving(host) == [first.release_id]
        assert current(host) == f"releases/{first.release_id}"
    second = run_deploy(world, 2)
    assert second.exit_code == ExitCode.OK, second.message
    h1 = fleet["h1"]
    assert h1.proxy.admin[-3:] == ["show stat", "set server grpc/i0-blue state maint",
                                   "set server rest/i0-blue state maint"]
    assert "set server grpc/i0-green state ready" in h1.proxy.admin
    assert "set server grpc/i0-blue state drain" in h1.proxy.admin
    # the old slot was stopped (kept for rollback), the new one serves
    assert serving(h1) == [second.release_id]
    assert len(h1.docker.by_name) == 3  # proxy + two releases
    record = read_json(manifest(h1, second.release_id))
    assert record["status"] == "serving" and record["slot"] == "green"
    assert record["previous"] == first.release_id and record["version"] == 2
    assert [g["gate"] for g in record["gates"]] == ["available", "signature", "warmup", "health",
                                                    "rest", "stable"]
    audit = parse_audit((h1.dir / "r" / MODEL / "audit.log").read_text())
    assert any(e.event == "switch_traffic" and e.details["kind"] == "proxy" for e in audit)


def test_same_release_again_changes_nothing(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    before = {n: len(h.docker.called("run")) for n, h in fleet.hosts.items()}
    again = run_deploy(world, 1)
    assert again.exit_code == ExitCode.OK
    assert {o.status for o in again.hosts.values()} == {"unchanged"}
    assert {n: len(h.docker.called("run")) for n, h in fleet.hosts.items()} == before


def test_broken_version_stops_at_first_host_and_restores_it(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    result = run_deploy(world, 3)
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert result.hosts["h1"].status == "restored"
    assert "Could not load the SavedModel" in result.hosts["h1"].error
    assert {result.hosts[h].status for h in ("h2", "h3", "h4")} == {"skipped"}
    fleet: FakeFleet = world["fleet"]
    assert serving(fleet["h1"]) == [first.release_id]
    assert not any(c.startswith("set server") for c in fleet["h1"].proxy.admin)  # never moved
    for name in ("h2", "h3", "h4"):
        assert len(fleet[name].docker.called("run")) == 2  # only the v1 deploy's


def test_slow_version_hits_its_deadline(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "slow"}
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert "after 30 s (deadline)" in result.hosts["h1"].error


def test_a_warmup_that_never_gets_under_its_bound_says_what_ended_it(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "laggy"}  # every request 200 ms, the bound the SLO's 60
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.ROLLED_BACK
    error = result.hosts["h1"].error
    # the gate's 20 rounds ended it, long before its 120 s: said so, not "after 120 s"
    assert "P99 200.0 ms in the last of 20 round(s)" in error, error
    assert "at most 20 rounds" in error and "after 120 s" not in error, error


def test_host_lost_during_a_gate_stops_the_roll_and_exits_3(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "vanish"}
    result = run_deploy(world, 2)
    # the restore cannot reach it either: its state is unknown, a person must look
    assert result.hosts["h1"].status == "unknown", result.hosts["h1"]
    assert "connection refused" in result.hosts["h1"].error
    assert result.exit_code == ExitCode.INCONSISTENT
    assert {result.hosts[h].status for h in ("h2", "h3", "h4")} == {"skipped"}


def test_a_host_cut_off_during_a_gate_is_unreachable_not_a_failed_gate(
        world: dict[str, Any]) -> None:
    """The signature gate's gRPC call times out because the host's network is cut (SSH too):
    the host is reported unreachable, as when the cut lands in any other gate, never a gate
    the release failed (a full run saw `gate_signature failed _InactiveRpcError ...
    DEADLINE_EXCEEDED` for a host cut off, tests/integration/test_deploy_unreachable.py)."""
    run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "cut"}
    result = run_deploy(world, 2)
    assert result.hosts["h1"].status == "unknown", result.hosts["h1"]
    assert "NoValidConnectionsError" in result.hosts["h1"].error, result.hosts["h1"].error
    assert "Deadline" not in result.hosts["h1"].error
    assert result.exit_code == ExitCode.INCONSISTENT


def test_failure_in_second_batch_reverts_rolled_hosts(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, serial="(1, 1)")
    FakeSlot.behaviour = {"10.9.0.2": "broken"}
    result = run_deploy(world, 2, serial="(1, 1)")
    assert result.exit_code == ExitCode.ROLLED_BACK, result.message
    assert result.hosts["h1"].status == "reverted"
    assert result.hosts["h2"].status == "restored"
    h1 = world["fleet"]["h1"]
    assert serving(h1) == [first.release_id]
    assert h1.proxy.admin[-2:] == ["set server grpc/i0-green state maint",
                                   "set server rest/i0-green state maint"]
    assert current(h1) == f"releases/{first.release_id}"


def test_stay_policy_keeps_rolled_hosts_and_exits_3(world: dict[str, Any]) -> None:
    run_deploy(world, 1, serial="(1, 1)", on_failure="stay")
    FakeSlot.behaviour = {"10.9.0.2": "broken"}
    result = run_deploy(world, 2, serial="(1, 1)", on_failure="stay")
    assert result.exit_code == ExitCode.INCONSISTENT
    assert result.hosts["h1"].status == "rolled"
    h1 = world["fleet"]["h1"]
    assert current(h1) == f"releases/{result.release_id}"
    assert h1.proxy.admin[-1] == "set server rest/i0-blue state maint"
    # the old release is drained but kept running: a person decides, rollback stays instant
    assert result.release_id in serving(h1) and len(serving(h1)) == 2


def test_threshold_is_inclusive(world: dict[str, Any]) -> None:
    run_deploy(world, 1, serial="(1,)", max_fail=25)
    FakeSlot.behaviour = {"10.9.0.2": "broken"}
    result = run_deploy(world, 2, serial="(1,)", max_fail=25)  # 1 of 4 = 25%: tolerated
    assert [result.hosts[h].status for h in ("h1", "h2", "h3", "h4")] == [
        "rolled", "restored", "rolled", "rolled"]
    assert result.exit_code == ExitCode.INCONSISTENT
    FakeSlot.behaviour = {"10.9.0.2": "broken", "10.9.0.3": "broken"}
    result = run_deploy(world, 3, serial="(1,)", max_fail=25)  # the second failure stops it
    assert result.hosts["h4"].status == "skipped"
    assert result.exit_code == ExitCode.ROLLED_BACK


def test_unreachable_host_in_preflight_changes_nothing(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    fleet["h3"].unreachable = True
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID
    assert result.hosts["h3"].status == "unreachable"
    assert all(len(fleet[h].docker.called("run")) == 2 for h in ("h1", "h2", "h4"))


def test_gpu_without_room_is_refused_in_preflight(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    world["fleet"]["h2"].gpu_used_mib = 16000
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID
    # the fraction's pool (0.038 x 16384 = 622 MiB) and what the process holds beside it
    # (gpu_context_mib, 1024 by default)
    assert "1646 MiB free on GPU 0 for the new release" in result.hosts["h2"].error
    assert "384 MiB free (16000 of 16384 MiB that CUDA can allocate used)" in \
        result.hosts["h2"].error


def test_held_lock_exits_4_and_names_holder(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    # held on a majority (a part on one host of four holds nothing: test_lock_liveness)
    for name in ("h1", "h2", "h3"):
        _hold_lock(world["fleet"][name], HOLDER)
    with pytest.raises(LockHeld) as error:
        run_deploy(world, 2)
    assert error.value.exit_code == ExitCode.LOCKED
    assert "deploy hp2 v9 by alice@elsewhere (pid 7)" in str(error.value)
    assert "fab lock --model hp2 --break" in str(error.value)


def test_stable_port_answering_with_the_old_release_fails_and_restores(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    first = run_deploy(world, 1)
    # the proxy ignores the switch (another model's proxy holds the port, say)
    monkeypatch.setattr(FakeSlot, "_behind_proxy", lambda self: 1)
    result = run_deploy(world, 2)
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert "gate_stable" in result.hosts["h1"].error
    assert serving(world["fleet"]["h1"]) == [first.release_id]


def test_finalize_checks_the_stable_port_once_the_old_slot_is_stopped(world: dict[str, Any]
                                                                      ) -> None:
    run_deploy(world, 1)

    class BreaksAfterRetire(Recorder):
        def step(self, host: str, phase: str, task: str, status: str, seconds: float,
                 detail: str) -> None:
            super().step(host, phase, task, status, seconds, detail)
            if (host, task) == ("h2", "retire_old"):
                FakeSlot.behaviour = {"10.9.0.2": "refuse"}

    recorder = BreaksAfterRetire()
    result = run_deploy(world, 2, recorder)
    assert ("h1", "finalize", "gate_stable", "ok") in recorder.steps
    assert ("h2", "finalize", "gate_stable", "failed") in recorder.steps
    assert result.exit_code == ExitCode.INCONSISTENT
    assert "finalize failed on h2" in result.message
    assert "connection refused" in result.hosts["h2"].error


def test_failed_attempts_never_prune_the_rollback_target(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, keep=2)
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    assert run_deploy(world, 3, keep=2).exit_code == ExitCode.ROLLED_BACK
    FakeSlot.behaviour = {}
    assert run_deploy(world, 2, keep=2).exit_code == ExitCode.OK
    assert manifest(world["fleet"]["h1"], first.release_id).is_file()


def test_rerun_after_a_kill_retires_the_old_release_of_a_rolled_host(world: dict[str, Any]
                                                                    ) -> None:
    first = run_deploy(world, 1)
    second = run_deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # killed after h1 was rolled, before finalize: v1 still running, drained, in blue
    h1.docker.by_name[f"tfs-hp2-{first.release_id}-i0"].running = True
    again = run_deploy(world, 2)
    assert again.hosts["h1"].status == "unchanged"
    assert serving(h1) == [second.release_id]


def test_lock_needs_a_majority_of_hosts(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    for name in ("h2", "h3", "h4"):  # alice holds it; we cannot even reach h1
        _hold_lock(fleet[name], HOLDER)
    fleet["h1"].unreachable = True
    with pytest.raises(LockHeld, match="alice@elsewhere"):
        run_deploy(world, 2)
    for name in ("h2", "h3", "h4"):
        (fleet[name].dir / "r" / MODEL / "lock" / "info.json").unlink()
        (fleet[name].dir / "r" / MODEL / "lock").rmdir()
    fleet["h2"].unreachable = fleet["h3"].unreachable = True
    with pytest.raises(LockQuorumLost, match="only 1 of the 4 hosts") as lost:
        run_deploy(world, 2)
    assert not (fleet["h4"].dir / "r" / MODEL / "lock").exists()
    # each host's own reason is said (a refused host key tells what to do about it)
    for name in ("h1", "h2", "h3"):
        assert f"\n    {name} (10.9.0.{name[1]}): NoValidConnectionsError" in str(lost.value)


def test_rerun_after_a_kill_between_switch_and_record_points_current_at_what_serves(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    second = run_deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # killed after h1's switch to v2, before record: `current` still names v1
    link = paths(h1).current
    import os

    os.unlink(link)
    os.symlink(f"releases/{first.release_id}", link)
    again = run_deploy(world, 2)
    assert again.exit_code == ExitCode.OK
    assert again.hosts["h1"].status == "unchanged"
    assert current(h1) == f"releases/{second.release_id}"


def test_rerun_after_a_kill_between_switch_and_drain_drains_the_old_slot_before_stopping_it(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    second = run_deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # killed after h1's switch to v2 (green ready, blue draining), before drain_old: v1 still
    # running in blue, which the proxy still lists as draining
    h1.docker.by_name[f"tfs-hp2-{first.release_id}-i0"].running = True
    for backend in ("grpc", "rest"):
        h1.proxy.servers[(backend, "i0-blue")] = "DRAIN"
    sent = len(h1.proxy.admin)
    again = run_deploy(world, 2)
    assert again.hosts["h1"].status == "unchanged"
    assert serving(h1) == [second.release_id]
    commands = h1.proxy.admin[sent:]
    assert "show stat" in commands  # the drain check
    assert commands[-2:] == ["set server grpc/i0-blue state maint",
                             "set server rest/i0-blue state maint"]
    assert not h1.docker.by_name[f"tfs-hp2-{first.release_id}-i0"].running
