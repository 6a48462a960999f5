"""Host faults on fake hosts: an instance whose server died (its container exited, its GPU
gone) is never counted as the release that serves: `fab deploy` takes it out of rotation
before any traffic moves and replaces it (or, when the plan drops it, removes it); a deploy
started while a server is coming back (restarting after a reboot or a crash) waits for it.

The fake proxy health-checks as the rendered haproxy.cfg asks: a server in rotation is UP
while a running container holds its REST port, DOWN otherwise (tests/unit/fakes.py)."""

from __future__ import annotations

from typing import Any

from tfsdeploy.core.errors import ExitCode

from .fakes import FakeFleet
from .runs import Recorder, run_deploy, serving


def _kill(world: dict[str, Any], release_id: str, instance: int) -> str:
    """h1's container of ``instance`` exits (OOM-killed, its GPU gone): its name."""
    fleet: FakeFleet = world["fleet"]
    name = f"tfs-hp2-{release_id}-i{instance}"
    fleet["h1"].docker.by_name[name].running = False
    return name


def _detail(recorder: Recorder, host: str, step: str) -> str:
    return next(d for s, d in zip(recorder.steps, recorder.details, strict=True)
                if s[0] == host and s[2] == step)


def test_a_dead_instance_is_replaced_and_never_counted_as_serving(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    proxy = fleet["h1"].proxy
    dead = _kill(world, first.release_id, 1)
    recorder = Recorder()
    # the live version again: the host is not "unchanged" while an instance is down
    result = run_deploy(world, 1, recorder, count=1, gpus=2)
    assert result.exit_code == ExitCode.OK, result.message
    assert result.release_id != first.release_id
    assert "i1-blue is down" in _detail(recorder, "h1", "discover")
    # out of rotation before the host's first instance started its new release
    maint = proxy.admin.index("set server grpc/i1-blue state maint")
    assert maint < proxy.admin.index("set server grpc/i0-green state ready")
    assert "set server grpc/i1-blue state drain" not in proxy.admin  # nothing to drain
    assert serving(fleet["h1"]) == [result.release_id, result.release_id]
    assert proxy.servers[("grpc", "i1-green")] == "no check"  # ready
    assert proxy.health("i1-green", "no check") == "UP"
    # the dead container is removed (a restart policy would start it into its old ports)
    assert dead in fleet["h1"].docker.called("remove")
    assert dead not in fleet["h1"].docker.by_name


def test_a_lost_gpu_removes_its_dead_instance_and_the_host_serves_on_one(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    dead = _kill(world, first.release_id, 1)
    fleet["h1"].gpus = [(0, 16384)]  # the host came back with one GPU
    recorder = Recorder()
    result = run_deploy(world, 1, recorder, count=1, gpus=1)
    assert result.exit_code == ExitCode.OK, result.message
    proxy = fleet["h1"].proxy
    assert {s for _, s in proxy.servers} == {"i0-blue", "i0-green"}
    assert serving(fleet["h1"]) == [result.release_id]
    assert "i1-blue is down" in _detail(recorder, "h1", "discover")
    assert "out of rotation until finalize removes it" in _detail(recorder, "h1", "discover")
    assert "set server grpc/i1-blue state drain" not in proxy.admin
    assert dead not in fleet["h1"].docker.by_name


def test_a_deploy_waits_for_an_instance_coming_back_then_finds_the_host_unchanged(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    container = fleet["h1"].docker.by_name[f"tfs-hp2-{first.release_id}-i1"]
    container.running, container.restarting = False, 3  # a reboot: it restarts
    recorder = Recorder()
    result = run_deploy(world, 1, recorder, count=1, gpus=2)
    assert result.exit_code == ExitCode.OK, result.message
    waited = _detail(recorder, "h1", "await_restarts")
    assert waited.startswith("i1-blue back after"), waited
    assert "(unchanged)" in _detail(recorder, "h1", "discover")
    assert serving(fleet["h1"]) == [first.release_id, first.release_id]
    assert "set server grpc/i1-blue state maint" not in fleet["h1"].proxy.admin


def test_nothing_coming_back_costs_no_wait(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    recorder = Recorder()
    assert run_deploy(world, 1, recorder, count=1, gpus=2).exit_code == ExitCode.OK
    assert _detail(recorder, "h1", "await_restarts") == "nothing coming back"


def test_a_gpu_lost_then_back_with_the_inventory_unchanged_needs_fab_deploy_alone(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    _kill(world, first.release_id, 1)
    fleet["h1"].gpus = [(0, 16384)]  # GPU 1 fell off the bus; the inventory still lists it
    recorder = Recorder()
    lost = run_deploy(world, 1, recorder, count=1, gpus=2)
    assert lost.exit_code == ExitCode.OK, lost.message
    assert "GPU 1 of the inventory absent" in _detail(recorder, "h1", "discover")
    assert serving(fleet["h1"]) == [lost.release_id]
    assert {s for _, s in fleet["h1"].proxy.servers} == {"i0-blue", "i0-green"}
    fleet["h1"].gpus = [(0, 16384), (1, 16384)]  # the card is back
    back = run_deploy(world, 1, count=1, gpus=2)
    assert back.exit_code == ExitCode.OK, back.message
    assert serving(fleet["h1"]) == [back.release_id, back.release_id]
    assert {s for _, s in fleet["h1"].proxy.servers} == {
        "i0-blue", "i0-green", "i1-blue", "i1-green"}


def test_a_host_reporting_none_of_its_gpus_is_refused_before_anything_changes(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    fleet["h1"].gpus = []
    result = run_deploy(world, 2, count=1, gpus=2)
    assert result.exit_code == ExitCode.INVALID, result.message
    assert "nvidia-smi: no GPU" in str(result.hosts["h1"].__dict__)
    assert serving(fleet["h1"]) == [first.release_id, first.release_id]


def test_status_names_a_down_instance_as_drift_with_its_fix(world: dict[str, Any]) -> None:
    from tfsdeploy.run import views as fleet_cli

    from .runs import target

    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    (healthy,) = fleet_cli.status(target(world, count=1, gpus=2), connect=fleet.connect)
    assert healthy["down"] == [] and healthy["instance_drift"] == []
    dead = _kill(world, first.release_id, 1)
    (row,) = fleet_cli.status(target(world, count=1, gpus=2), connect=fleet.connect)
    assert row["down"] == [1]
    assert row["instance_drift"] == [
        f"i1 planned, down ({dead} exited, failing its health check); "
        "fix: fab deploy --model hp2"]
    fleet["h1"].gpus = [(0, 16384)]
    (row,) = fleet_cli.status(target(world, count=1, gpus=2), connect=fleet.connect)
    assert row["instance_drift"] == [
        "i1 planned, down (GPU 1 absent); fix: fab deploy --model hp2"]
