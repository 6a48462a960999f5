"""`fab retire` on fake hosts: the model taken off a host under its lock (drained, containers
and proxy removed, files removed but the audit log), other models untouched; a host the
inventory no longer places the model on is reported by status and deploy --check; a deploy
that would move a serving model's ports is refused before anything changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.layout import LABEL_PREFIX
from tfsdeploy.core.target import Target, load_target
from tfsdeploy.run import deploy as deploy_cli
from tfsdeploy.run import views as fleet_cli
from tfsdeploy.run.retire import retire, retire_check

from . import runs
from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import MODEL, Recorder, paths, run_deploy, serving


def _narrowed(world: dict[str, Any], hosts: str | None = None, **inventory: Any) -> Target:
    """The model placed on h1 only (``hosts="h1"`` in its catalog entry)."""
    text = Path(runs.inventory_file(world, count=2, **inventory)).read_text()
    narrowed = world["tmp"] / "inv-narrowed.py"
    narrowed.write_text(text.replace('Model(name="hp2",', 'Model(name="hp2", hosts="h1",'))
    return load_target(MODEL, inventory=str(narrowed), hosts=hosts)


def test_retire_takes_the_model_off_one_host_and_keeps_its_audit_log(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1, count=2)
    fleet: FakeFleet = world["fleet"]
    h1, h2 = fleet["h1"], fleet["h2"]
    other = h2.dir / "r" / "other"
    other.mkdir(parents=True)
    h2.docker.add("tfs-other-r1-i0", {f"{LABEL_PREFIX}.model": "other",
                                      f"{LABEL_PREFIX}.role": "server"})
    recorder = Recorder()
    result = retire(runs.target(world, hosts="h2", count=2), reporter=recorder,
                    connect=fleet.connect)
    assert result.exit_code == ExitCode.OK, result.message
    assert result.hosts["h2"].status == "retired"
    assert result.message == "hp2 retired from h2"
    assert serving(h2) == [] and not h2.proxy.running
    assert "tfs-other-r1-i0" in h2.docker.by_name and other.is_dir()
    home = Path(paths(h2).home)
    left = {p.name for p in home.iterdir()}
    assert "audit.log" in left and left <= {"audit.log", "lock.flock"}, left
    assert not Path(paths(h2).model_dir).exists()
    audit = [json.loads(line) for line in (home / "audit.log").read_text().splitlines()]
    retired = [e["details"]["change"] for e in audit if e["event"] == "remove_containers"]
    assert "remove container tfs-proxy-hp2" in retired, retired
    # drained before anything was removed
    assert h2.proxy.admin.index("set server grpc/i0-blue state drain") < \
        h2.proxy.admin.index("set server grpc/i0-blue state maint")
    assert len(serving(h1)) == 1 and h1.proxy.running  # the other host is untouched
    again = retire(runs.target(world, hosts="h2", count=2), reporter=Recorder(),
                   connect=fleet.connect)
    assert again.hosts["h2"].status == "absent" and again.message == "no selected host held hp2"


def test_retire_check_lists_the_removals_and_changes_nothing(world: dict[str, Any]) -> None:
    run_deploy(world, 1, count=2)
    fleet: FakeFleet = world["fleet"]
    rows = {r["host"]: r for r in retire_check(runs.target(world, hosts="h2", count=2),
                                               connect=fleet.connect)}
    changes = [c["what"] for s in rows["h2"]["steps"] for c in s["changes"]]
    assert "remove container tfs-proxy-hp2" in changes, changes
    assert rows["h2"]["action"].startswith("retire: ")
    assert len(serving(fleet["h2"])) == 1 and fleet["h2"].proxy.running


def test_a_host_the_model_left_is_reported_until_retired(world: dict[str, Any]) -> None:
    run_deploy(world, 1, count=2)
    fleet: FakeFleet = world["fleet"]
    narrowed = _narrowed(world)
    rows = {r["host"]: r for r in fleet_cli.status(narrowed, connect=fleet.connect,
                                                    with_orphans=True)}
    assert rows["h2"]["orphan"] and not rows["h1"]["orphan"]
    assert rows["h2"]["note"] == ("no longer in the inventory for hp2: fab retire --model "
                                  "hp2 --hosts h2")
    planned = {r["host"]: r for r in deploy_cli.check(narrowed, version=2,
                                                      connect=fleet.connect)}
    assert planned["h2"]["action"] == rows["h2"]["note"]
    recorder = Recorder()
    result = deploy_cli.deploy(narrowed, version=2, reporter=recorder, connect=fleet.connect,
                               clock=FrozenClock(), client_factory=FakeSlot)
    assert result.exit_code == ExitCode.OK, result.message
    assert "h2: no longer in the inventory for hp2" in result.message
    retire(_narrowed(world, hosts="h2"), reporter=Recorder(), connect=fleet.connect)
    after = fleet_cli.status(narrowed, connect=fleet.connect, with_orphans=True)
    assert [r["host"] for r in after] == ["h1"]


def test_ports_moved_keep_the_old_stable_ports_served_until_the_next_deploy(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1, count=1)
    fleet: FakeFleet = world["fleet"]
    proxy = fleet["h1"].proxy
    moved = {"h1": {"grpc_port": 9500, "rest_port": 9501,
                    "slot_ports": {"blue": (9510, 9511), "green": (9520, 9521)}}}
    recorder = Recorder()
    result = run_deploy(world, 2, recorder, count=1, host_vars=moved)
    assert result.exit_code == ExitCode.OK, result.message
    # both stable ports bound; the drained old server kept its address, the new one moved
    assert {8500, 8501, 9500, 9501} <= proxy.bound
    assert proxy.addresses[("grpc", "i0-blue")] == 8510
    assert proxy.addresses[("grpc", "i0-green")] == 9520
    assert proxy.reloads == 1
    assert any("stable ports :8500/:8501 -> :9500/:9501" in d for d in recorder.details)
    again = run_deploy(world, 3, count=1, host_vars=moved)
    assert again.exit_code == ExitCode.OK, again.message
    assert proxy.bound == {9500, 9501} and proxy.reloads == 2
    assert proxy.addresses[("grpc", "i0-blue")] == 9510


def test_a_rollback_across_a_port_move_recreates_the_old_release_on_the_new_ports(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1, count=1)
    moved = {"h1": {"grpc_port": 9500, "rest_port": 9501,
                    "slot_ports": {"blue": (9510, 9511), "green": (9520, 9521)}}}
    assert run_deploy(world, 2, count=1, host_vars=moved).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    result = runs.run_rollback(world, count=1, host_vars=moved)
    assert result.exit_code == ExitCode.OK, result.message
    container = fleet["h1"].docker.by_name[f"tfs-hp2-{first.release_id}-i0"]
    assert container.port("--port") == 9510 and container.running
    assert fleet["h1"].proxy.addresses[("grpc", "i0-blue")] == 9510
    assert serving(fleet["h1"]) == [first.release_id]
