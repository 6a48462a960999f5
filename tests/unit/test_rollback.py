"""Rollback and convergence against fake hosts: within the window, beyond it, to an older
release, with an unreachable host, and after a deploy killed between switch and record."""

from __future__ import annotations

import os
from typing import Any

from tfsdeploy.core.errors import ExitCode

from .fakes import FakeFleet, FakeHost, read_json
from .runs import current, manifest, paths, run_deploy, run_rollback, serving


def _point_current(host: FakeHost, release_id: str) -> None:
    link = paths(host).current
    os.unlink(link)
    os.symlink(f"releases/{release_id}", link)


def test_rollback_beyond_the_window_restarts_the_retained_release(world: dict[str, Any]
                                                                  ) -> None:
    first = run_deploy(world, 1)
    run_deploy(world, 2)
    fleet: FakeFleet = world["fleet"]
    result = run_rollback(world)
    assert result.exit_code == ExitCode.OK, result.message
    assert result.release_id == first.release_id
    for host in fleet.hosts.values():
        # stopped, same slot: started again
        assert host.docker.called("start") == [f"tfs-hp2-{first.release_id}-i0"]
        assert current(host) == f"releases/{first.release_id}"
        assert serving(host) == [first.release_id]


def test_rollback_within_the_window_is_a_switch_back(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, window=600)
    run_deploy(world, 2, window=600)
    fleet: FakeFleet = world["fleet"]
    assert all(len(serving(h)) == 2 for h in fleet.hosts.values())  # the old one kept warm
    before = {n: (len(h.docker.called("run")), len(h.docker.called("start")))
              for n, h in fleet.hosts.items()}
    result = run_rollback(world, window=600)
    assert result.exit_code == ExitCode.OK
    after = {n: (len(h.docker.called("run")), len(h.docker.called("start")))
             for n, h in fleet.hosts.items()}
    assert after == before  # no container started: no image pull, no model load
    warmup = [s for h in result.hosts.values() for s in h.steps
              if s["step"] == "gate_warmup"]
    assert warmup and all("skipped" in s["detail"] for s in warmup)
    assert fleet["h1"].proxy.servers[("grpc", "i0-blue")] == "no check"  # ready
    assert fleet["h1"].proxy.servers[("grpc", "i0-green")] == "MAINT"
    assert first.release_id in serving(fleet["h1"])


def test_rollback_to_an_older_release_recreates_it(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    run_deploy(world, 2)
    run_deploy(world, 3)  # v1's container sits stopped in blue, where v3 now serves
    result = run_rollback(world, to=first.release_id)
    assert result.exit_code == ExitCode.OK, result.message
    h1 = world["fleet"]["h1"]
    assert serving(h1) == [first.release_id]
    last = h1.docker.called("run")[-1]
    assert last.labels["tfsdeploy.release"] == first.release_id
    assert last.labels["tfsdeploy.slot"] == "green"


def test_default_target_skips_a_release_rolled_back_from(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    run_deploy(world, 2)
    run_rollback(world)
    third = run_deploy(world, 3)
    result = run_rollback(world)
    assert result.release_id == first.release_id  # v2 was rolled back from: not "good"
    assert third.release_id != result.release_id


def test_rollback_with_an_unreachable_host_does_the_rest_and_exits_3(world: dict[str, Any]
                                                                     ) -> None:
    first = run_deploy(world, 1)
    run_deploy(world, 2)
    world["fleet"]["h3"].unreachable = True
    result = run_rollback(world)
    assert result.exit_code == ExitCode.INCONSISTENT
    assert result.hosts["h3"].status == "unreachable"
    for name in ("h1", "h2", "h4"):
        assert serving(world["fleet"][name]) == [first.release_id]


def test_deploy_killed_between_switch_and_record_converges(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    second = run_deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # what a kill -9 after the switch leaves: traffic on green (v2), `current` still v1
    _point_current(h1, first.release_id)
    h1.docker.by_name[f"tfs-hp2-{first.release_id}-i0"].running = True
    h1.proxy.servers.update({("grpc", "i0-green"): "no check", ("grpc", "i0-blue"): "MAINT"})
    third = run_deploy(world, 3)
    assert third.exit_code == ExitCode.OK, third.message
    record = read_json(manifest(h1, third.release_id))
    assert record["previous"] == second.release_id  # the container really serving
    assert record["slot"] == "blue"
    assert serving(h1) == [third.release_id]


def test_rollback_killed_after_a_switch_then_run_again_keeps_the_serving_container(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    second = run_deploy(world, 2)
    h1: FakeHost = world["fleet"]["h1"]
    # a rollback killed right after h1's switch: v1 serves from blue, `current` still says v2
    h1.docker.by_name[f"tfs-hp2-{first.release_id}-i0"].running = True
    h1.proxy.servers.update({("grpc", "i0-blue"): "no check", ("grpc", "i0-green"): "MAINT"})
    runs_before = len(h1.docker.called("run"))
    calls_before = len(h1.docker.calls)
    result = run_rollback(world)
    assert result.exit_code == ExitCode.OK, result.message
    assert result.release_id == first.release_id
    assert result.hosts["h1"].status == "unchanged"
    assert len(h1.docker.called("run")) == runs_before  # nothing re-created
    assert not [a for m, a in h1.docker.calls[calls_before:]
                if m == "remove" and first.release_id in a]
    assert serving(h1) == [first.release_id]
    assert current(h1) == f"releases/{first.release_id}"
    assert read_json(manifest(h1, second.release_id))["status"] == "rolled_back"


def test_deploy_and_rollback_on_two_gpus_act_on_both_instances(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, gpus=2, count=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    for host in fleet.hosts.values():
        record = read_json(manifest(host, first.release_id))
        assert [(i["index"], i["gpus"]) for i in record["instances"]] == [(0, [0]), (1, [1])]
    second = run_deploy(world, 2, gpus=2, count=2)
    assert second.exit_code == ExitCode.OK, second.message
    for host in fleet.hosts.values():
        assert serving(host) == [second.release_id, second.release_id]
    result = run_rollback(world, gpus=2, count=2)
    assert result.exit_code == ExitCode.OK, result.message
    for host in fleet.hosts.values():
        assert sorted(host.docker.called("start")) == [f"tfs-hp2-{first.release_id}-i0",
                                                       f"tfs-hp2-{first.release_id}-i1"]
        assert serving(host) == [first.release_id, first.release_id]
        assert current(host) == f"releases/{first.release_id}"
