"""What prune may never remove: the live release, what the proxy serves, the rollback window
and their files, whatever their containers' state (fake hosts; the fleet's own test is
tests/integration/test_prune_protects.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.render.host_proxy import ServerState
from tfsdeploy.core.rollout.records import ReleaseRecord, ReleaseStatus
from tfsdeploy.hosts.dockerapi import ContainerFact
from tfsdeploy.hosts.facts import HostFacts, ProxyFact, parse_facts
from tfsdeploy.run.operations.finalize import protected_releases
from tfsdeploy.run.prune import prune

from .fakes import FakeFleet
from .runs import Recorder, current, manifest, paths, run_deploy, run_rollback, target

R = [f"r20261201-0000{i}0000-v{i}" for i in range(1, 6)]


def _add_version(world: dict[str, Any], version: int) -> None:
    """Another version in the fake model source, with its golden answers."""
    (world["source"] / str(version)).mkdir(parents=True)
    (world["source"] / str(version) / "saved_model.pb").write_bytes(b"pb")
    golden = json.loads(Path(world["golden"]).read_text())
    golden["version_details"][str(version)] = {"golden": [{
        "signature": "serving_default",
        "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [2, 1], "values": [[1.0], [3.0]]}},
        "outputs": {"y": {"dtype": "DT_FLOAT", "shape": [2, 1],
                          "values": [[2.5 + version - 1], [3.5 + version - 1]]}}}]}
    Path(world["golden"]).write_text(json.dumps(golden))


def test_prune_keeps_the_live_release_whose_container_is_not_running(
        world: dict[str, Any]) -> None:
    """`rollback --to` an old release, its container then stops (a crash, a host reboot),
    and a prune with fewer releases kept: the live release, its files and its version stay."""
    for version in (4, 5):
        _add_version(world, version)
    first = run_deploy(world, 1, keep=5)
    for version in (2, 3, 4, 5):
        run_deploy(world, version, keep=5)
    assert run_rollback(world, to=first.release_id, keep=5).exit_code == ExitCode.OK
    fleet: FakeFleet = world["fleet"]
    h1 = fleet["h1"]
    name = f"tfs-hp2-{first.release_id}-i0"
    h1.docker.by_name[name].running = False  # crashed: the proxy still points at its slot
    result = prune(target(world, keep=2), reporter=Recorder(), connect=fleet.connect)
    assert result.exit_code == ExitCode.OK, result.message
    assert current(h1) == f"releases/{first.release_id}"
    assert manifest(h1, first.release_id).is_file(), "the live release's record was removed"
    assert name in h1.docker.by_name, "the live release's container was removed"
    assert Path(paths(h1).version_dir(1), "saved_model.pb").is_file(), \
        "the live release's model version was removed"
    # what nothing protects still goes: v2 (beyond keep_releases; v3 and v4 are the newest
    # good ones, v5 the release v1 replaced: the rollback window)
    assert not manifest(h1, run_release(h1, 2)).exists()


def run_release(host: Any, version: int) -> str:
    """The id of the release of ``version`` a host's audit names (pruned or not)."""
    log = Path(paths(host).audit_log).read_text().splitlines()
    return next(json.loads(line)["release"] for line in log
                if json.loads(line)["release"].endswith(f"-v{version}"))


def _record(release: str, status: ReleaseStatus = ReleaseStatus.SERVING,
            previous: str | None = None) -> ReleaseRecord:
    return ReleaseRecord(id=release, model="hp2", version=int(release[-1]), image="img",
                         slot="blue", status=status, previous=previous)


def _server(release: str, slot: str, *, running: bool = False) -> ContainerFact:
    return ContainerFact(name=f"tfs-hp2-{release}-i0", role="server", release=release,
                         slot=slot, version=int(release[-1]), instance=0, running=running,
                         status="Exited (137)", state="exited", image="img")


def test_protected_releases_come_from_the_hosts_facts_whatever_the_containers_state() -> None:
    records = (_record(R[0]), _record(R[1], previous=R[0]), _record(R[2], previous=R[1]),
               _record(R[3], ReleaseStatus.PAUSED), _record(R[4]))
    # `current` names R[1]; the proxy serves green (R[2], stopped); nothing runs
    served = ProxyFact(running=True, answered=True, servers=(
        ServerState("grpc", 0, "green", "UP", 0, 100),
        ServerState("grpc", 0, "blue", "MAINT", 0, 100)))
    facts = HostFacts(host="h1", releases=records, current=R[1], proxy=served,
                      containers=(_server(R[1], "blue"), _server(R[2], "green")))
    assert protected_releases(facts) == {
        R[1]: "the `current` pointer names it",
        R[2]: "the proxy serves its slot",
        R[3]: "a paused canary",
        R[0]: f"the rollback window ({R[1]} replaced it)"}
    # in a served slot, the container that runs there is what it serves, not the stopped
    # container of an older release beside it
    blue = HostFacts(host="h1", releases=records, current=R[4], proxy=ProxyFact(
        running=True, answered=True, servers=(ServerState("grpc", 0, "blue", "UP", 0, 100),)),
        containers=(_server(R[0], "blue"), _server(R[4], "blue", running=True)))
    assert protected_releases(blue, window=False) == {
        R[4]: "the `current` pointer names it", R[3]: "a paused canary"}
    # the proxy does not answer: its haproxy.cfg says what it serves once restarted
    down = HostFacts(host="h1", releases=records[:3], current=None,
                     containers=(_server(R[2], "green"),),
                     configured_slots=frozenset({(0, "green")}))
    assert protected_releases(down) == {
        R[2]: "the proxy's haproxy.cfg serves its slot",
        R[1]: f"the rollback window ({R[2]} replaced it)"}


def test_the_facts_read_haproxy_cfgs_enabled_servers_and_the_boot_id() -> None:
    boot = "6f1c2a8e-1b2c-4d5e-8f90-0123456789ab"
    text = "\n".join([
        "@@boot", boot, "@@versions", f"1 {'a' * 64} {boot}", f"2 {'b' * 64}", "3 ",
        "@@proxycfg",
        "    server i0-blue 127.0.0.1:8510 proto h2 weight 100",
        "    server i0-green 127.0.0.1:8520 proto h2 weight 100 disabled",
        "    server i1-green 127.0.0.1:8521 weight 100",
        "    server x-blue 127.0.0.1:8511 weight 100", "@@end"])
    facts = parse_facts("h1", text, [])
    assert facts.configured_slots == {(0, "blue"), (1, "green")}
    assert facts.boot_id == boot
    assert facts.versions == {1: "a" * 64, 2: "b" * 64, 3: ""}
    assert facts.version_boots == {1: boot}
