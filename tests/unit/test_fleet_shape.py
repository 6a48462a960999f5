"""A host whose shape changes between deploys, on fake hosts: a GPU added (a second instance),
a GPU removed (an instance fewer), each carried out by `fab deploy` alone; the proxy follows
the plan (rewritten, reloaded) before traffic moves and gets its runtime state back."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.render.host_proxy import ServerState, restore_commands

from .fakes import READY, FakeFleet, read_json
from .runs import Recorder, manifest, run_deploy, serving


def _fit_gpus(world: dict[str, Any], count: int) -> None:
    """h1's hardware changed: ``count`` GPUs now (what its nvidia-smi reports)."""
    fleet: FakeFleet = world["fleet"]
    fleet["h1"].gpus = [(i, 16384) for i in range(count)]


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
    _fit_gpus(world, 2)
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
    _fit_gpus(world, 1)
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


def test_check_names_an_instance_removed_and_the_gpus_an_instance_moves_to(
        world: dict[str, Any]) -> None:
    from tfsdeploy.run.deploy import check

    from .runs import target

    run_deploy(world, 1, count=1, gpus=2)
    fleet: FakeFleet = world["fleet"]
    _fit_gpus(world, 1)
    plan = check(target(world, count=1, gpus=1), version=2, connect=fleet.connect)
    shape = plan[0]["shape"]
    assert shape[0] == "instances: i0, i1 -> i0", shape
    assert shape[1].startswith("i1 removed: serving on through the roll, then drained"), shape
    changes = [c["what"] for s in plan[0]["steps"] for c in s["changes"]]
    assert "reload the proxy seamlessly without the servers of i1" in changes, changes


def test_the_same_shape_never_reloads_the_proxy(world: dict[str, Any]) -> None:
    run_deploy(world, 1, count=1, gpus=2)
    result = run_deploy(world, 2, count=1, gpus=2)
    assert result.exit_code == ExitCode.OK, result.message
    fleet: FakeFleet = world["fleet"]
    assert fleet["h1"].proxy.reloads == 0
    assert fleet["h1"].docker.called("kill") == []


def _reshape_detail(recorder: Recorder) -> str:
    return recorder.details[recorder.steps.index(("h1", "roll", "reshape_proxy", "ok"))]


def test_a_worker_not_loaded_on_the_file_is_reloaded_once(world: dict[str, Any]) -> None:
    """The proxy's worker runs another configuration than the one the plan needs, with the
    same servers and ports (a setting changed in a newer toolkit, or a run stopped between
    writing haproxy.cfg and reloading it): the next deploy reloads it, records what it
    loaded, and the one after does not reload."""
    from pathlib import Path

    from tfsdeploy.core.render.host_proxy import shape_digest

    from .runs import paths

    first = run_deploy(world, 1, count=1)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    host = fleet["h1"]
    loaded = Path(paths(host).proxy_loaded)
    config = Path(paths(host).proxy_dir) / "haproxy.cfg"
    # the first start recorded the file's configuration, less the slots' runtime state
    assert loaded.read_text() == shape_digest(config.read_text()) + "\n"
    assert host.proxy.reloads == 0
    loaded.write_text(shape_digest(config.read_text() + "\n# another setting\n") + "\n")

    recorder = Recorder()
    second = run_deploy(world, 2, recorder, count=1)
    assert second.exit_code == ExitCode.OK, second.message
    assert host.proxy.reloads == 1
    assert "its worker was not loaded on this configuration" in _reshape_detail(recorder)
    assert loaded.read_text() == shape_digest(config.read_text()) + "\n"

    recorder = Recorder()
    third = run_deploy(world, 1, recorder, count=1)
    assert third.exit_code == ExitCode.OK, third.message
    assert host.proxy.reloads == 1
    assert "proxy has the servers and ports" in _reshape_detail(recorder)


def test_check_lists_the_reload_a_gpu_added_needs_and_changes_nothing(
        world: dict[str, Any]) -> None:
    from tfsdeploy.run.deploy import check

    from .runs import target

    run_deploy(world, 1, count=1, gpus=1)
    fleet: FakeFleet = world["fleet"]
    before = dict(fleet["h1"].proxy.servers)
    _fit_gpus(world, 2)
    plan = check(target(world, count=1, gpus=2), version=2, diff=True, connect=fleet.connect)
    changes = [c["what"] for s in plan[0]["steps"] for c in s["changes"]]
    assert any("reload the proxy seamlessly: servers of i1 added" in c for c in changes), changes
    shape = plan[0]["shape"]
    assert shape[0] == "instances: i0 -> i0, i1", shape
    assert shape[1].startswith("i1 added: the proxy's configuration gets their servers"), shape
    diff = plan[0]["diff"]
    assert "h1:live/proxy/haproxy.cfg" in diff, diff
    assert "+    server i1-blue 127.0.0.1:8530 proto h2 weight 100" in diff, diff
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


def test_a_configuration_haproxy_refuses_is_never_loaded(
        world: dict[str, Any], monkeypatch: Any) -> None:
    first = run_deploy(world, 1, count=1, gpus=1)
    fleet: FakeFleet = world["fleet"]
    proxy = fleet["h1"].proxy
    monkeypatch.setattr(type(proxy), "check",
                        lambda self, config_dir: "[ALERT] parsing [haproxy.cfg:30]: unknown")
    _fit_gpus(world, 2)
    result = run_deploy(world, 2, count=1, gpus=2)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.message
    assert "haproxy -c refused the new configuration" in result.hosts["h1"].error
    assert proxy.reloads == 0 and fleet["h1"].docker.called("kill") == []
    assert serving(fleet["h1"]) == [first.release_id]
    assert proxy.servers[("grpc", "i0-blue")] == READY


def test_a_port_move_renders_both_stable_ports_and_keeps_the_old_server_address(
        tmp_path: Any) -> None:
    import shutil
    import subprocess

    from tfsdeploy.core.inventory.layout import model_ports
    from tfsdeploy.core.inventory.load import load_inventory
    from tfsdeploy.core.render.host_proxy import PortMove, config_ports, render_proxy_config

    from .runs import INVENTORY

    inventory = tmp_path / "inv.py"
    inventory.write_text(INVENTORY.format(
        source=tmp_path, golden=tmp_path / "g.json", hosts=tmp_path, serial='(1,)',
        on_failure="revert", max_fail=0, window=0, keep=3, host_vars={}, count=1, gpus=1,
        deadline=None))
    inv = load_inventory(str(inventory))
    host, model = inv.hosts[0], inv.models["hp2"]
    text = render_proxy_config(host, model, model_ports(host, model), {0: "green"},
                               PortMove(binds=((8400, 8401),),
                                        servers=(("i0-blue", 8410, 8411),)))
    ports = config_ports(text)
    assert ports.binds == {"grpc": frozenset({8500, 8400}), "rest": frozenset({8501, 8401})}
    assert ports.server("i0-blue") == (8410, 8411)
    assert ports.server("i0-green") == (8520, 8521)
    checked = tmp_path / "haproxy.cfg"
    checked.write_text(text.replace("/run/tfsdeploy-admin/", f"{tmp_path}/"))
    result = subprocess.run([shutil.which("haproxy") or "/usr/sbin/haproxy", "-c", "-f",
                             str(checked)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_show_stat_gives_each_server_its_address_and_the_weight_last_set() -> None:
    from tfsdeploy.core.render.host_proxy import parse_info_pid, parse_stat

    # HAProxy 2.6's `show stat`: `weight` is the effective weight (a drained server's does
    # not follow `set server ... weight`), `uweight` the one set, `addr` where it forwards
    stat = ("# pxname,svname,scur,status,weight,addr,uweight\n"
            "grpc,i0-blue,0,DRAIN,100,127.0.0.1:8510,30\n"
            "grpc,i0-green,1,no check,100,127.0.0.1:8520,100\n")
    blue, green = parse_stat(stat)
    assert (blue.port, blue.user_weight, green.port) == (8510, 30, 8520)
    assert restore_commands([blue], frozenset({"i0-blue"})) == [
        "set server grpc/i0-blue state drain", "set server grpc/i0-blue weight 30"]
    assert parse_info_pid("Name: HAProxy\nVersion: 2.6.12\nPid: 73\nUptime_sec: 4\n") == 73
    assert parse_info_pid("Unknown command.\n") is None


@pytest.mark.parametrize("reloaded", [False, True], ids=["before-reload", "after-reload"])
def test_a_port_move_killed_at_its_reload_converges_when_run_again(
        world: dict[str, Any], monkeypatch: Any, reloaded: bool) -> None:
    """A deploy that moves the model's ports is killed as it reloads the proxy on its new
    configuration (new and old stable ports). Before the signal: the file binds both, the
    running worker only the old ones; the same deploy again reads the worker, not the file,
    and reloads. After it: the worker binds both, the host's current release is still the
    one behind the old ports; the same deploy again keeps them (only the model's next deploy
    drops them): the worker binds them, but the record of what it loaded is the one before,
    so the same deploy reloads once more."""
    from pathlib import Path

    from tfsdeploy.core.errors import HostUnreachable
    from tfsdeploy.core.render.host_proxy import config_ports
    from tfsdeploy.core.target import load_target
    from tfsdeploy.run.deploy import deploy

    from .fakes import FakeDocker, FakeSlot, FrozenClock
    from .runs import MODEL, inventory_file, paths

    first = run_deploy(world, 1, count=1)
    assert first.exit_code == ExitCode.OK, first.message
    fleet: FakeFleet = world["fleet"]
    host = fleet["h1"]
    moved = Path(world["tmp"] / "inv-moved.py")
    moved.write_text(Path(inventory_file(world, count=1)).read_text().replace(
        "memory_mib=512,", "memory_mib=512, port_offset=100,"))

    def move(recorder: Recorder, version: int = 2) -> Any:
        return deploy(load_target(MODEL, inventory=str(moved)), version=version, reporter=recorder,
                      connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot)

    reload = FakeDocker.kill

    def killed(self: FakeDocker, name: str, signal: str) -> None:
        if reloaded:
            reload(self, name, signal)
        for fake in fleet.hosts.values():  # the process is gone: nothing reaches a host
            fake.unreachable = True
        raise HostUnreachable(f"{name}: the run was killed at its {signal}")

    with monkeypatch.context() as patched:
        patched.setattr(FakeDocker, "kill", killed)
        dead = move(Recorder())
    assert dead.exit_code != ExitCode.OK
    host.unreachable = False
    shutil.rmtree(paths(host).lock_dir)  # the dead run's lock (broken by a live run)
    written = config_ports((Path(paths(host).proxy_dir) / "haproxy.cfg").read_text())
    assert written.binds["grpc"] == {8500, 8600}, written.binds
    assert host.proxy.bound == ({8500, 8501, 8600, 8601} if reloaded else {8500, 8501})

    recorder = Recorder()
    again = move(recorder)
    assert again.exit_code == ExitCode.OK, again.message
    assert host.proxy.bound == {8500, 8501, 8600, 8601}
    reshape = _reshape_detail(recorder)
    # killed after the reload but before its record (proxy/loaded): the worker binds the
    # ports already, yet nothing says it runs the file, so the same deploy reloads once more
    assert ("reloaded" in reshape and "its worker was not loaded on this configuration"
            in reshape) if reloaded else ("reloaded" in reshape and ":8500" in reshape), reshape
    third = move(Recorder(), version=1)  # the model's next deploy: the old ports go
    assert third.exit_code == ExitCode.OK, third.message
    assert host.proxy.bound == {8600, 8601}
