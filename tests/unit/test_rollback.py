"""Rollback and convergence against fake hosts: within the window, beyond it, to an older
release, with an unreachable host, and after a deploy killed between switch and record."""

from __future__ import annotations

import json
from typing import Any

from tfsdeploy.cli.rollback import RollbackRequest, rollback
from tfsdeploy.errors import ExitCode
from tfsdeploy.rollout import DeployResult

from .fakes import FakeHost, FakeRunner, FakeSlot, FrozenClock
from .test_rollout import Recorder, _deploy, _inventory, _serving


def _rollback(world: dict[str, Any], to: str | None = None, **inventory: Any) -> DeployResult:
    fleet: dict[str, FakeHost] = world["fleet"]
    return rollback(RollbackRequest(model="hp2", inventory=_inventory(world, **inventory),
                                    to=to),
                    reporter=Recorder(), runner_factory=lambda host: FakeRunner(host, fleet),
                    clock=FrozenClock(), client_factory=FakeSlot)


def test_rollback_beyond_the_window_restarts_the_retained_release(world: dict[str, Any]
                                                                  ) -> None:
    first = _deploy(world, 1)
    _deploy(world, 2)
    fleet: dict[str, FakeHost] = world["fleet"]
    result = _rollback(world)
    assert result.exit_code == ExitCode.OK, result.message
    assert result.release_id == first.release_id
    for host in fleet.values():
        assert len(host.ran("docker", "start")) == 1  # stopped, same slot: started again
        assert host.files["/srv/tfsdeploy/hp2/current"] == \
            f"->releases/{first.release_id}".encode()
        assert _serving(host) == [first.release_id]


def test_rollback_within_the_window_is_a_switch_back(world: dict[str, Any]) -> None:
    first = _deploy(world, 1, window=600)
    _deploy(world, 2, window=600)
    fleet: dict[str, FakeHost] = world["fleet"]
    assert all(len(_serving(h)) == 2 for h in fleet.values())  # the old one kept warm
    before = {n: (len(h.ran("docker", "run")), len(h.ran("docker", "start")))
              for n, h in fleet.items()}
    recorder_result = _rollback(world, window=600)
    assert recorder_result.exit_code == ExitCode.OK
    after = {n: (len(h.ran("docker", "run")), len(h.ran("docker", "start")))
             for n, h in fleet.items()}
    assert after == before  # no container started: no image pull, no model load
    warmup = [s for h in recorder_result.hosts.values() for s in h.steps
              if s["step"] == "gate_warmup"]
    assert warmup and all("skipped" in s["detail"] for s in warmup)
    assert fleet["h1"].servers[("grpc", "blue")] == "UP"
    assert fleet["h1"].servers[("grpc", "green")] == "MAINT"
    assert first.release_id in _serving(fleet["h1"])


def test_rollback_to_an_older_release_recreates_it(world: dict[str, Any]) -> None:
    first = _deploy(world, 1)
    _deploy(world, 2)
    _deploy(world, 3)  # v1's container sits stopped in blue, where v3 now serves
    result = _rollback(world, to=first.release_id)
    assert result.exit_code == ExitCode.OK, result.message
    h1 = world["fleet"]["h1"]
    assert _serving(h1) == [first.release_id]
    runs = h1.ran("docker", "run")
    assert first.release_id in " ".join(runs[-1]) and "tfsdeploy.slot=green" in runs[-1]


def test_default_target_skips_a_release_rolled_back_from(world: dict[str, Any]) -> None:
    first = _deploy(world, 1)
    _deploy(world, 2)
    _rollback(world)
    third = _deploy(world, 3)
    result = _rollback(world)
    assert result.release_id == first.release_id  # v2 was rolled back from: not "good"
    assert third.release_id != result.release_id


def test_rollback_with_an_unreachable_host_does_the_rest_and_exits_3(world: dict[str, Any]
                                                                     ) -> None:
    first = _deploy(world, 1)
    _deploy(world, 2)
    world["fleet"]["h3"].unreachable = True
    result = _rollback(world)
    assert result.exit_code == ExitCode.INCONSISTENT
    assert result.hosts["h3"].status == "unreachable"
    for name in ("h1", "h2", "h4"):
        assert _serving(world["fleet"][name]) == [first.release_id]


def test_deploy_killed_between_switch_and_record_converges(world: dict[str, Any]) -> None:
    first = _deploy(world, 1)
    second = _deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # what a kill -9 after the switch leaves: traffic on green (v2), `current` still v1
    h1.files["/srv/tfsdeploy/hp2/current"] = f"->releases/{first.release_id}".encode()
    h1.containers[f"tfs-hp2-{first.release_id}"].running = True
    h1.servers.update({("grpc", "green"): "UP", ("grpc", "blue"): "MAINT"})
    third = _deploy(world, 3)
    assert third.exit_code == ExitCode.OK, third.message
    record = json.loads(h1.files[f"/srv/tfsdeploy/hp2/releases/{third.release_id}/manifest.json"])
    assert record["previous"] == second.release_id  # the container really serving
    assert record["slot"] == "blue"
    assert _serving(h1) == [third.release_id]


def test_rollback_killed_after_a_switch_then_run_again_keeps_the_serving_container(
        world: dict[str, Any]) -> None:
    first = _deploy(world, 1)
    second = _deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # a rollback killed right after h1's switch: v1 serves from blue, `current` still says v2
    h1.containers[f"tfs-hp2-{first.release_id}"].running = True
    h1.servers.update({("grpc", "blue"): "UP", ("grpc", "green"): "MAINT"})
    runs_before = len(h1.ran("docker", "run"))
    log_before = len(h1.log)
    result = _rollback(world)
    assert result.exit_code == ExitCode.OK, result.message
    assert result.release_id == first.release_id
    assert result.hosts["h1"].status == "unchanged"
    assert len(h1.ran("docker", "run")) == runs_before  # nothing re-created
    assert not [a for a in h1.log[log_before:]
                if a[:2] == ["docker", "rm"] and first.release_id in a[-1]]
    assert _serving(h1) == [first.release_id]
    assert h1.files["/srv/tfsdeploy/hp2/current"] == f"->releases/{first.release_id}".encode()
    record = json.loads(h1.files[f"/srv/tfsdeploy/hp2/releases/{second.release_id}/manifest.json"])
    assert record["status"] == "rolled_back"
