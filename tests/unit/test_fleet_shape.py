"""A host whose shape changes between deploys, on fake hosts: a GPU added (a second instance),
a GPU removed (an instance fewer), each carried out by `fab deploy` alone; the proxy follows
the plan (rewritten, reloaded) before traffic moves and gets its runtime state back."""

from __future__ import annotations

from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.proxy import ServerState, restore_commands

from .fakes import READY, FakeFleet, read_json
from .runs import Recorder, manifest, run_deploy, serving


def _instances(world: dict[str, Any], release_id: str) -> list[int]:
    fleet: FakeFleet = world["fleet"]
    return [i["index"] for i in read_json(manifest(fleet["h1"], release_id))["instances"]]


def test_a_gpu_added_rolls_a_second_instance_behind_the_reloaded_proxy(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1, count=1, gpus=1)
    fleet: FakeFleet = world["fleet"]
    proxy = fleet["h1"].proxy
    assert {s for _, s in proxy.servers} == {"i0-blue", "i0-green"}
    recorder = Recorder()
    result = run_deploy(world, 2, recorder, count=1, gpus=2)
    assert result.exit_code == ExitCode.OK, result.message
    assert proxy.reloads == 1
    assert serving(fleet["h1"]) == [result.release_id, result.release_id]
    assert _instances(world, result.release_id) == [0, 1]
    # both instances serve their new slot; the old one is out
    assert proxy.servers[("grpc", "i0-green")] == READY
    assert proxy.servers[("grpc", "i1-blue")] == READY
    assert proxy.servers[("grpc", "i0-blue")] == "MAINT"
    # the reload came before the first instance rolled, and kept i0-blue's live state
    reshape = recorder.steps.index(("h1", "roll", "reshape_proxy", "ok"))
    assert reshape < recorder.steps.index(("h1", "roll", "start_slot", "ok"))
    detail = recorder.details[reshape]
    assert "i1 added" in detail, detail


def test_a_gpu_removed_drains_the_instance_then_reloads_the_proxy_without_it(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1, gpus=2)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    proxy = fleet["h1"].proxy
    recorder = Recorder()
    result = run_deploy(world, 2, recorder, count=1, gpus=1)
    assert result.exit_code == ExitCode.OK, result.message
    assert {s for _, s in proxy.servers} == {"i0-blue", "i0-green"}
    assert proxy.reloads == 1
    assert serving(fleet["h1"]) == [result.release_id]
    assert _instances(world, result.release_id) == [0]
    # drained before it left the proxy: drain, maint, then the reload (no request cut)
    drain = proxy.admin.index("set server grpc/i1-blue state drain")
    assert proxy.admin.index("set server grpc/i1-blue state maint") > drain
    steps = [s for s in recorder.steps if s[0] == "h1"]
    assert steps.index(("h1", "finalize", "remove_instances", "ok")) < \
        steps.index(("h1", "finalize", "retire_old", "ok"))
    # the dropped instance's container is stopped (kept for a rollback)
    assert sorted(fleet["h1"].docker.called("stop")) == [f"tfs-hp2-{first.release_id}-i0",
                                                         f"tfs-hp2-{first.release_id}-i1"]


def test_the_same_shape_never_reloads_the_proxy(world: dict[str, Any]) -> None:
    run_deploy(world, 1, count=1, gpus=2)
    result = run_deploy(world, 2, count=1, gpus=2)
    assert result.exit_code == ExitCode.OK, result.message
    fleet: FakeFleet = world["fleet"]
    assert fleet["h1"].proxy.reloads == 0
    assert fleet["h1"].docker.called("kill") == []


def test_check_lists_the_reload_a_gpu_added_needs_and_changes_nothing(
        world: dict[str, Any]) -> None:
    from tfsdeploy.cli.deploy import check

    from .runs import target

    run_deploy(world, 1, count=1, gpus=1)
    fleet: FakeFleet = world["fleet"]
    before = dict(fleet["h1"].proxy.servers)
    plan = check(target(world, count=1, gpus=2), version=2, connect=fleet.connect)
    changes = [c["what"] for s in plan[0]["steps"] for c in s["changes"]]
    assert any("reload the proxy seamlessly: servers of i1 added" in c for c in changes), changes
    assert fleet["h1"].proxy.servers == before
    assert fleet["h1"].proxy.reloads == 0


def test_a_reload_gives_back_each_kept_server_its_state_and_weight() -> None:
    before = [ServerState("grpc", 0, "blue", "DRAIN", 3, 0, user_weight=100),
              ServerState("grpc", 0, "green", "no check", 0, 25, user_weight=25),
              ServerState("rest", 1, "blue", "MAINT", 0, 100),
              ServerState("grpc", 2, "blue", "no check", 0, 100)]
    kept = frozenset({"i0-blue", "i0-green", "i1-blue"})
    assert restore_commands(before, kept) == [
        "set server grpc/i0-blue state drain", "set server grpc/i0-blue weight 100",
        "set server grpc/i0-green state ready", "set server grpc/i0-green weight 25",
        "set server rest/i1-blue state maint", "set server rest/i1-blue weight 100"]
