"""The rolling deploy against fake hosts and a frozen clock: batches, gates, restore, revert,
policy, lock and exit codes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tfsdeploy.cli.deploy import DeployRequest, deploy
from tfsdeploy.errors import ExitCode
from tfsdeploy.lock import LockHeld
from tfsdeploy.rollout import DeployResult

from .fakes import FakeHost, FakeRunner, FakeSlot, FrozenClock

INVENTORY = '''
from tfsdeploy.catalog import Batching, Model, Rollout, Signature, TensorSpec
from tfsdeploy.inventory import Gpu, Host

hosts = [Host(f"h{{i}}", f"10.9.0.{{i}}", gpus=[Gpu(0, 16384)]) for i in (1, 2, 3, 4)]
defaults = {{"image": "reg/tfs:2.21.0", "proxy_image": "reg/proxy:2.6"}}
models = [Model(name="hp2", source="{source}", golden="{golden}",
                signature=Signature(inputs={{"x": TensorSpec("DT_FLOAT", (-1, 1))}},
                                    outputs={{"y": TensorSpec("DT_FLOAT", (-1, 1))}}),
                memory_mib=512, latency_slo_ms=60,
                batching=Batching(max_batch_size=8, allowed_batch_sizes=(8,)),
                rollout=Rollout(serial={serial}, on_failure="{on_failure}",
                                max_fail_percentage={max_fail}, min_healthy_s=1,
                                load_timeout_s=30, window_s={window}, keep_releases={keep}))]
'''


class Recorder:
    def __init__(self) -> None:
        self.steps: list[tuple[str, str, str, str]] = []
        self.notes: list[str] = []

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        self.steps.append((host, phase, task, status))

    def note(self, text: str) -> None:
        self.notes.append(text)


def _inventory(world: dict[str, Any], *, serial: str = '(1, "100%")',
               on_failure: str = "revert", max_fail: float = 0, window: float = 0,
               keep: int = 3) -> str:
    path = world["tmp"] / f"inv-{serial}-{on_failure}-{max_fail}-{window}-{keep}.py"
    path.write_text(INVENTORY.format(source=world["source"], golden=world["golden"],
                                     serial=serial, on_failure=on_failure, max_fail=max_fail,
                                     window=window, keep=keep))
    return str(path)


def _deploy(world: dict[str, Any], version: int, recorder: Recorder | None = None,
            **inventory: Any) -> DeployResult:
    fleet: dict[str, FakeHost] = world["fleet"]
    return deploy(DeployRequest(model="hp2", inventory=_inventory(world, **inventory),
                                version=version),
                  reporter=recorder or Recorder(),
                  runner_factory=lambda host: FakeRunner(host, fleet),
                  clock=FrozenClock(), client_factory=FakeSlot)


def _serving(host: FakeHost) -> list[str]:
    return sorted(c.labels["tfsdeploy.release"] for c in host.containers.values() if c.running
                  and "tfsdeploy.release" in c.labels)


def test_first_deploy_then_roll_to_v2(world: dict[str, Any]) -> None:
    recorder = Recorder()
    first = _deploy(world, 1, recorder)
    assert first.exit_code == ExitCode.OK, first.message
    assert {o.status for o in first.hosts.values()} == {"rolled"}
    assert recorder.notes[1:3] == ["batch 1/2: h1", "batch 2/2: h2, h3, h4"]
    fleet: dict[str, FakeHost] = world["fleet"]
    for host in fleet.values():
        assert len(host.ran("docker", "run")) == 2  # the slot, then the proxy
        assert _serving(host) == [first.release_id]
        assert host.files["/srv/tfsdeploy/hp2/current"] == f"->releases/{first.release_id}".encode()
    second = _deploy(world, 2)
    assert second.exit_code == ExitCode.OK, second.message
    h1 = fleet["h1"]
    assert h1.admin[-3:] == ["show stat", "set server grpc/blue state maint",
                             "set server rest/blue state maint"]
    assert "set server grpc/green state ready" in h1.admin
    assert "set server grpc/blue state drain" in h1.admin
    # the old slot was stopped (kept for rollback), the new one serves
    assert _serving(h1) == [second.release_id]
    assert len(h1.containers) == 3  # proxy + two releases
    record = json.loads(h1.files[f"/srv/tfsdeploy/hp2/releases/{second.release_id}/manifest.json"])
    assert record["status"] == "serving" and record["slot"] == "green"
    assert record["previous"] == first.release_id and record["version"] == 2
    assert [g["gate"] for g in record["gates"]] == ["available", "signature", "warmup", "health",
                                                    "stable"]
    assert b'"event": "switch_traffic"' in h1.files["/srv/tfsdeploy/hp2/audit.log"]


def test_same_release_again_changes_nothing(world: dict[str, Any]) -> None:
    _deploy(world, 1)
    before = {n: len(h.ran("docker", "run")) for n, h in world["fleet"].items()}
    again = _deploy(world, 1)
    assert again.exit_code == ExitCode.OK
    assert {o.status for o in again.hosts.values()} == {"unchanged"}
    assert {n: len(h.ran("docker", "run")) for n, h in world["fleet"].items()} == before


def test_broken_version_stops_at_first_host_and_restores_it(world: dict[str, Any]) -> None:
    first = _deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    result = _deploy(world, 3)
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert result.hosts["h1"].status == "restored"
    assert "Could not load the SavedModel" in result.hosts["h1"].error
    assert {result.hosts[h].status for h in ("h2", "h3", "h4")} == {"skipped"}
    fleet: dict[str, FakeHost] = world["fleet"]
    assert _serving(fleet["h1"]) == [first.release_id]
    assert not any(a[:2] == ["set", "server"] for a in fleet["h1"].admin)  # traffic never moved
    for name in ("h2", "h3", "h4"):
        assert len(fleet[name].ran("docker", "run")) == 2  # only the v1 deploy's


def test_slow_version_hits_its_deadline(world: dict[str, Any]) -> None:
    _deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "slow"}
    result = _deploy(world, 2)
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert "after 30 s (deadline)" in result.hosts["h1"].error


def test_host_lost_during_a_gate_stops_the_roll_and_exits_3(world: dict[str, Any]) -> None:
    _deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "vanish"}
    result = _deploy(world, 2)
    # the restore cannot reach it either: its state is unknown, a person must look
    assert result.hosts["h1"].status == "unknown", result.hosts["h1"]
    assert "connection refused" in result.hosts["h1"].error
    assert result.exit_code == ExitCode.INCONSISTENT
    assert {result.hosts[h].status for h in ("h2", "h3", "h4")} == {"skipped"}


def test_failure_in_second_batch_reverts_rolled_hosts(world: dict[str, Any]) -> None:
    first = _deploy(world, 1, serial="(1, 1)")
    FakeSlot.behaviour = {"10.9.0.2": "broken"}
    result = _deploy(world, 2, serial="(1, 1)")
    assert result.exit_code == ExitCode.ROLLED_BACK, result.message
    assert result.hosts["h1"].status == "reverted"
    assert result.hosts["h2"].status == "restored"
    fleet: dict[str, FakeHost] = world["fleet"]
    assert _serving(fleet["h1"]) == [first.release_id]
    assert fleet["h1"].admin[-2:] == ["set server grpc/green state maint",
                                      "set server rest/green state maint"]
    assert fleet["h1"].files["/srv/tfsdeploy/hp2/current"] == \
        f"->releases/{first.release_id}".encode()


def test_stay_policy_keeps_rolled_hosts_and_exits_3(world: dict[str, Any]) -> None:
    _deploy(world, 1, serial="(1, 1)", on_failure="stay")
    FakeSlot.behaviour = {"10.9.0.2": "broken"}
    result = _deploy(world, 2, serial="(1, 1)", on_failure="stay")
    assert result.exit_code == ExitCode.INCONSISTENT
    assert result.hosts["h1"].status == "rolled"
    h1 = world["fleet"]["h1"]
    assert h1.files["/srv/tfsdeploy/hp2/current"] == f"->releases/{result.release_id}".encode()
    assert h1.admin[-1] == "set server rest/blue state maint"
    # the old release is drained but kept running: a person decides, rollback stays instant
    assert result.release_id in _serving(h1) and len(_serving(h1)) == 2


def test_threshold_is_inclusive(world: dict[str, Any]) -> None:
    _deploy(world, 1, serial="(1,)", max_fail=25)
    FakeSlot.behaviour = {"10.9.0.2": "broken"}
    result = _deploy(world, 2, serial="(1,)", max_fail=25)  # 1 of 4 = 25%: tolerated
    assert [result.hosts[h].status for h in ("h1", "h2", "h3", "h4")] == [
        "rolled", "restored", "rolled", "rolled"]
    assert result.exit_code == ExitCode.INCONSISTENT
    FakeSlot.behaviour = {"10.9.0.2": "broken", "10.9.0.3": "broken"}
    result = _deploy(world, 3, serial="(1,)", max_fail=25)  # the second failure stops it
    assert result.hosts["h4"].status == "skipped"
    assert result.exit_code == ExitCode.ROLLED_BACK


def test_unreachable_host_in_preflight_changes_nothing(world: dict[str, Any]) -> None:
    _deploy(world, 1)
    world["fleet"]["h3"].unreachable = True
    result = _deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID
    assert result.hosts["h3"].status == "unreachable"
    assert all(len(world["fleet"][h].ran("docker", "run")) == 2 for h in ("h1", "h2", "h4"))


def test_gpu_without_room_is_refused_in_preflight(world: dict[str, Any]) -> None:
    _deploy(world, 1)
    world["fleet"]["h2"].gpu_used_mib = 16000
    result = _deploy(world, 2)
    assert result.exit_code == ExitCode.INVALID
    assert "623 MiB free on GPU 0" in result.hosts["h2"].error
    assert "384 MiB free (16000 of 16384 MiB used)" in result.hosts["h2"].error


def test_held_lock_exits_4_and_names_holder(world: dict[str, Any]) -> None:
    _deploy(world, 1)
    holder = {"token": "t", "who": "alice", "machine": "elsewhere", "pid": 7,
              "started": "2026-11-30T10:00:00+00:00", "command": "deploy hp2 v9"}
    world["fleet"]["h1"].files["/srv/tfsdeploy/hp2/lock/info.json"] = json.dumps(holder).encode()
    with pytest.raises(LockHeld) as error:
        _deploy(world, 2)
    assert error.value.exit_code == ExitCode.LOCKED
    assert "deploy hp2 v9 by alice@elsewhere (pid 7)" in str(error.value)
    assert "fab lock --model hp2 --break" in str(error.value)


def test_stable_port_answering_with_the_old_release_fails_and_restores(
        world: dict[str, Any]) -> None:
    first = _deploy(world, 1)
    # the proxy ignores the switch (another model's proxy holds the port, say)
    original = FakeSlot._behind_proxy
    FakeSlot._behind_proxy = lambda self: 1  # type: ignore[method-assign]
    try:
        result = _deploy(world, 2)
    finally:
        FakeSlot._behind_proxy = original  # type: ignore[method-assign]
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert "gate_stable" in result.hosts["h1"].error
    assert _serving(world["fleet"]["h1"]) == [first.release_id]


def test_finalize_checks_the_stable_port_once_the_old_slot_is_stopped(world: dict[str, Any]
                                                                      ) -> None:
    _deploy(world, 1)

    class BreaksAfterRetire(Recorder):
        def step(self, host: str, phase: str, task: str, status: str, seconds: float,
                 detail: str) -> None:
            super().step(host, phase, task, status, seconds, detail)
            if (host, task) == ("h2", "retire_old"):
                FakeSlot.behaviour = {"10.9.0.2": "refuse"}

    recorder = BreaksAfterRetire()
    result = _deploy(world, 2, recorder)
    assert ("h1", "finalize", "gate_stable", "ok") in recorder.steps
    assert ("h2", "finalize", "gate_stable", "failed") in recorder.steps
    assert result.exit_code == ExitCode.INCONSISTENT
    assert "finalize failed on h2" in result.message
    assert "connection refused" in result.hosts["h2"].error


def test_failed_attempts_never_prune_the_rollback_target(world: dict[str, Any]) -> None:
    first = _deploy(world, 1, keep=2)
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    assert _deploy(world, 3, keep=2).exit_code == ExitCode.ROLLED_BACK
    FakeSlot.behaviour = {}
    assert _deploy(world, 2, keep=2).exit_code == ExitCode.OK
    files = world["fleet"]["h1"].files
    assert f"/srv/tfsdeploy/hp2/releases/{first.release_id}/manifest.json" in files


def test_rerun_after_a_kill_retires_the_old_release_of_a_rolled_host(world: dict[str, Any]
                                                                    ) -> None:
    first = _deploy(world, 1)
    second = _deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # killed after h1 was rolled, before finalize: v1 still running, drained, in blue
    h1.containers[f"tfs-hp2-{first.release_id}"].running = True
    again = _deploy(world, 2)
    assert again.hosts["h1"].status == "unchanged"
    assert _serving(h1) == [second.release_id]


def test_lock_needs_a_majority_of_hosts(world: dict[str, Any]) -> None:
    from tfsdeploy.lock import LockQuorumLost

    _deploy(world, 1)
    holder = {"token": "t", "who": "alice", "machine": "elsewhere", "pid": 7,
              "started": "2026-11-30T10:00:00+00:00", "command": "deploy hp2 v9"}
    fleet: dict[str, FakeHost] = world["fleet"]
    for name in ("h2", "h3", "h4"):  # alice holds it; we cannot even reach h1
        fleet[name].files["/srv/tfsdeploy/hp2/lock/info.json"] = json.dumps(holder).encode()
    fleet["h1"].unreachable = True
    with pytest.raises(LockHeld, match="alice@elsewhere"):
        _deploy(world, 2)
    for name in ("h2", "h3", "h4"):
        fleet[name].files.pop("/srv/tfsdeploy/hp2/lock/info.json")
    fleet["h2"].unreachable = fleet["h3"].unreachable = True
    with pytest.raises(LockQuorumLost, match="only 1 of the 4 hosts"):
        _deploy(world, 2)
    assert not any(k.startswith("/srv/tfsdeploy/hp2/lock/") for k in fleet["h4"].files)


def test_rerun_after_a_kill_between_switch_and_record_points_current_at_what_serves(
        world: dict[str, Any]) -> None:
    first = _deploy(world, 1)
    second = _deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # killed after h1's switch to v2, before record: `current` still names v1
    h1.files["/srv/tfsdeploy/hp2/current"] = f"->releases/{first.release_id}".encode()
    again = _deploy(world, 2)
    assert again.exit_code == ExitCode.OK
    assert again.hosts["h1"].status == "unchanged"
    assert h1.files["/srv/tfsdeploy/hp2/current"] == f"->releases/{second.release_id}".encode()
