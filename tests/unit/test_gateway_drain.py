"""The deploy keeps the gateway right, on fake hosts: a host taken out of rotation (the
``recreate`` strategy, `fab retire`) is drained on every gateway host first, the drain recorded
there (which run, why), and put back in rotation there when it serves again; a gateway host
that refuses fails the step before the host's proxy is touched. What a run leaves drained
outlives it: the next deploy or rollback puts the model's hosts back in rotation (a recreate
interrupted after its drain, a host put back among the model's hosts) and drains those that
left, its backends matched by their exact names (``hp2`` is not ``hp2-eu``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.target import Target, load_target
from tfsdeploy.hosts.ssh import Result
from tfsdeploy.run.deploy import deploy
from tfsdeploy.run.retire import retire
from tfsdeploy.run.rollback import rollback

from . import runs
from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import MODEL, Recorder

GATEWAY = '''
from tfsdeploy.core.inventory.fleet import Group
from tfsdeploy.core.inventory.gateway import Gateway, Route
hosts.append(Host("gw1", "10.9.0.99", vars={{"data_root": "{root}"}}))
groups = {{"gateway": Group(["gw1"])}}
gateway = Gateway(routes=[Route("hp2", grpc_port=9500, rest_port=9501)])
'''


# a model's backends on a gateway: the checked ones, then their fail-open twins
KINDS = ("grpc", "rest", "grpc-open", "rest-open")


class GatewayAdmin:
    """The runtime API of gw1's HAProxy: its servers' states and requests in flight; every
    command into ``log``. A server it lacks is refused as HAProxy does ("No such server.")."""

    def __init__(self, log: list[str], servers: dict[str, str] | None = None) -> None:
        self.log = log
        self.refuse = False
        self.servers = servers if servers is not None else {
            f"hp2-{kind}/{host}": "UP" for kind in KINDS for host in ("h1", "h2")}
        self.sessions: dict[str, int] = {}

    def answer(self, argv: list[str], stdin: bytes | None) -> Result:
        if self.refuse:
            return Result(tuple(argv), 1, "", "socat: Connection refused")
        commands = [c.strip() for c in (stdin or b"").decode().split(";") if c.strip()]
        self.log += [f"gw1: {c}" for c in commands]
        out = ""
        for command in commands:
            words = command.split()
            if words == ["show", "stat"]:
                out += "# pxname,svname,qcur,qmax,scur,status\n" + "".join(
                    f"{key.split('/')[0]},{key.split('/')[1]},0,0,{self.sessions.get(key, 0)},"
                    f"{status}\n" for key, status in self.servers.items())
            elif words[:2] == ["set", "server"] and words[3] == "state":
                if words[2] not in self.servers:
                    out += "No such server.\n\n"
                    continue
                self.servers[words[2]] = {"ready": "UP", "drain": "DRAIN",
                                          "maint": "MAINT"}[words[4]]
        return Result(tuple(argv), 0, out + "\n", "")


def _target(world: dict[str, Any], *, strategy: str = "dual-slot", count: int = 2,
            hosts: str | None = None) -> Target:
    text = Path(runs.inventory_file(world, count=count)).read_text()
    recreate = text.replace('keep_releases=3,', f'keep_releases=3, strategy="{strategy}",')
    assert recreate != text, "the fake inventory's Rollout(...) no longer reads as expected"
    text = recreate
    path = world["tmp"] / f"inv-gateway-{strategy}-{count}.py"
    path.write_text(text + GATEWAY.format(root=world["tmp"] / "gw1" / "r"))
    return load_target(MODEL, inventory=str(path), hosts=hosts)


def _connect(fleet: FakeFleet, log: list[str], admin: GatewayAdmin) -> Any:
    """The fleet's fake hosts, gw1 too (its files real, under the test's directory), whose
    `socat` reaches ``admin``; the hosts' proxy state commands go to ``log`` as well."""
    def connect(host: ResolvedHost) -> Any:
        conn = fleet.connect(host)
        original = conn.run

        def run(argv: list[str], **kwargs: Any) -> Result:
            conn.fake.check_reachable()
            if argv[:1] == ["socat"] and host.name == "gw1":
                return admin.answer(argv, kwargs.get("stdin"))
            if argv[:1] == ["socat"] and b"state" in (kwargs.get("stdin") or b""):
                log.append(f"{host.name} proxy: {kwargs['stdin'].decode().strip()}")
            return original(argv, **kwargs)

        conn.run = run  # type: ignore[method-assign]
        return conn
    return connect


def drains(world: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The drain records on gw1: ``model/host`` -> record."""
    root = world["tmp"] / "gw1" / "r" / "gateway" / "drains"
    return {str(p.relative_to(root)): json.loads(p.read_text())
            for p in sorted(root.glob("*/*"))} if root.is_dir() else {}


def _deploy(world: dict[str, Any], version: int, admin: GatewayAdmin, log: list[str],
            recorder: Recorder | None = None, **target: Any) -> Any:
    return deploy(_target(world, **target), version=version, reporter=recorder or Recorder(),
                  connect=_connect(world["fleet"], log, admin), clock=FrozenClock(),
                  client_factory=FakeSlot)


def test_retire_drains_the_host_at_the_gateway_before_its_proxy(world: dict[str, Any]) -> None:
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    result = retire(_target(world, hosts="h1"), reporter=Recorder(),
                    connect=_connect(world["fleet"], log, GatewayAdmin(log)))
    assert result.exit_code == ExitCode.OK, result.message
    drain = log.index("gw1: set server hp2-grpc/h1 state drain")
    assert log[drain + 1:drain + 4] == [f"gw1: set server hp2-{kind}/h1 state drain"
                                        for kind in KINDS[1:]]
    assert log[drain + 4] == "gw1: show stat"  # none in flight there: the drain is done
    first_proxy = next(i for i, line in enumerate(log) if line.startswith("h1 proxy:"))
    assert drain < first_proxy, log
    assert not any("h2" in line for line in log if line.startswith("gw1: set"))
    record = drains(world)["hp2/h1"]
    assert record["reason"] == "retire: the model leaves the host"
    assert record["run"] == "retire hp2" and record["who"], record


def test_recreate_drains_at_the_gateway_and_puts_the_host_back(world: dict[str, Any]) -> None:
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    admin = GatewayAdmin(log)
    result = _deploy(world, 2, admin, log, strategy="recreate")
    assert result.exit_code == ExitCode.OK, result.message
    gateway = [line for line in log if line.startswith("gw1: set")]
    assert gateway == [f"gw1: set server hp2-{kind}/{host} state {state}"
                       for host in ("h1", "h2") for state in ("drain", "ready")
                       for kind in KINDS], gateway
    for host in ("h1", "h2"):
        drained = log.index(f"gw1: set server hp2-grpc/{host} state drain")
        out = next(i for i, line in enumerate(log)
                   if line.startswith(f"{host} proxy:") and "maint" in line)
        back = log.index(f"gw1: set server hp2-grpc/{host} state ready")
        assert drained < out < back, log
    assert drains(world) == {}  # each record removed when its host came back
    assert set(admin.servers.values()) == {"UP"}


def test_a_gateway_that_refuses_the_drain_stops_the_host_before_its_proxy(
        world: dict[str, Any]) -> None:
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    admin = GatewayAdmin(log)
    admin.refuse = True
    result = retire(_target(world, hosts="h1"), reporter=Recorder(),
                    connect=_connect(world["fleet"], log, admin))
    assert result.exit_code != ExitCode.OK
    assert "gateway gw1 to drain h1" in str(result.hosts["h1"].error), result.hosts["h1"]
    assert not any(line.startswith("h1 proxy:") for line in log), log
    assert len(runs.serving(world["fleet"]["h1"])) == 1


class KillAfter(Recorder):
    """A reporter that, once ``host`` finished ``task``, cuts every host off: from there on
    the run reaches nothing, as after a kill -9 of its process (its lock stays behind)."""

    def __init__(self, fleet: FakeFleet, host: str, task: str) -> None:
        super().__init__()
        self.fleet, self.host, self.task = fleet, host, task

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        super().step(host, phase, task, status, seconds, detail)
        if (host, task, status) == (self.host, self.task, "ok"):
            for fake in self.fleet.hosts.values():
                fake.unreachable = True


def _revive(world: dict[str, Any]) -> None:
    """The hosts reachable again and the dead run's lock gone (the next run breaks a dead
    process's lock: tests/unit/test_lock.py)."""
    for name, fake in world["fleet"].hosts.items():
        fake.unreachable = False
        if name != "gw1":
            shutil.rmtree(runs.paths(fake).lock_dir, ignore_errors=True)


def _drained_by_a_stopped_recreate(world: dict[str, Any], version: int, admin: GatewayAdmin,
                                   log: list[str]) -> dict[str, dict[str, Any]]:
    """A recreate deploy of ``version`` killed (its process gone, its lock left) once h1 was
    drained at gw1; the hosts reachable again. Returns the drain records it left."""
    killed = _deploy(world, version, admin, log,
                     KillAfter(world["fleet"], "h1", "take_out_of_rotation"),
                     strategy="recreate")
    assert killed.exit_code != ExitCode.OK
    _revive(world)
    assert admin.servers["hp2-grpc/h1"] == "DRAIN"
    left = drains(world)
    assert set(left) == {"hp2/h1"}, left
    return left


def test_a_recreate_stopped_after_its_gateway_drain_is_put_back_by_the_next_deploy(
        world: dict[str, Any]) -> None:
    """The drain outlives the run that made it (recorded on gw1); the next deploy, of the
    other strategy, which drains nothing itself, puts h1 back in rotation there and says
    which run had drained it."""
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    admin = GatewayAdmin(log)
    left = _drained_by_a_stopped_recreate(world, 2, admin, log)
    recorder = Recorder()
    again = _deploy(world, 2, admin, log, recorder)
    assert again.exit_code == ExitCode.OK, again.message
    assert admin.servers["hp2-grpc/h1"] == admin.servers["hp2-rest/h1"] == "UP", admin.servers
    assert drains(world) == {}
    record = left["hp2/h1"]
    assert record["run"].startswith("deploy hp2 ") and record["reason"].startswith("recreate")
    (note,) = [n for n in recorder.notes if "back in rotation" in n]
    assert note.startswith("gateway gw1: h1 back in rotation for hp2 (drained by "
                           f"`{record['run']}`"), note
    assert "recreate: its last serving instance is replaced in place" in note


def test_a_recreate_stopped_after_its_gateway_drain_is_put_back_by_a_rollback(
        world: dict[str, Any]) -> None:
    """The same drain left behind, then `fab rollback` instead of a deploy: before its roll
    the rollback puts h1 back in rotation at gw1 and removes the record."""
    runs.run_deploy(world, 1, count=2)
    runs.run_deploy(world, 2, count=2)
    log: list[str] = []
    admin = GatewayAdmin(log)
    _drained_by_a_stopped_recreate(world, 3, admin, log)
    recorder = Recorder()
    back = rollback(_target(world), reporter=recorder,
                    connect=_connect(world["fleet"], log, admin), clock=FrozenClock(),
                    client_factory=FakeSlot)
    assert back.exit_code == ExitCode.OK, back.message
    assert admin.servers["hp2-grpc/h1"] == admin.servers["hp2-rest/h1"] == "UP", admin.servers
    assert drains(world) == {}
    assert any(n.startswith("gateway gw1: h1 back in rotation for hp2 (drained by ")
               for n in recorder.notes), recorder.notes


def test_a_host_taken_out_of_the_models_hosts_and_put_back(world: dict[str, Any]) -> None:
    """h2 leaves the model's hosts: the deploy drains it at gw1 and records why; h2 back
    among them: the next deploy puts it back in rotation and removes the record."""
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    admin = GatewayAdmin(log)
    narrowed = Recorder()
    result = _deploy(world, 2, admin, log, narrowed, count=1)
    assert result.exit_code == ExitCode.OK, result.message
    assert admin.servers["hp2-grpc/h2"] == "DRAIN" and admin.servers["hp2-grpc/h1"] == "UP"
    assert any(n.startswith("gateway gw1: h2 drained for hp2: no longer among its hosts")
               for n in narrowed.notes), narrowed.notes
    left = drains(world)
    back = Recorder()
    result = _deploy(world, 2, admin, log, back)
    assert result.exit_code == ExitCode.OK, result.message
    assert admin.servers["hp2-grpc/h2"] == admin.servers["hp2-rest/h2"] == "UP", admin.servers
    assert drains(world) == {}
    assert left["hp2/h2"]["reason"] == "no longer among the model's hosts", left
    assert any(n.startswith("gateway gw1: h2 back in rotation for hp2") for n in back.notes)


def test_backends_are_matched_by_their_exact_names(world: dict[str, Any]) -> None:
    """gw1 also routes ``hp2-eu``, whose name starts with ``hp2-``: its servers (h0, and h2
    with requests always in flight) are neither drained nor waited on for hp2."""
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    servers = {f"{model}-{kind}/{host}": "UP" for model, hosts in
               (("hp2", ("h1", "h2")), ("hp2-eu", ("h0", "h2"))) for host in hosts
               for kind in KINDS}
    admin = GatewayAdmin(log, servers)
    admin.sessions["hp2-eu-grpc/h2"] = 5
    recorder = Recorder()
    result = _deploy(world, 2, admin, log, recorder, count=1)
    assert result.exit_code == ExitCode.OK, result.message
    assert [line for line in log if line.startswith("gw1: set")] == [
        f"gw1: set server hp2-{kind}/h2 state drain" for kind in KINDS]
    assert not [n for n in recorder.notes if "could not" in n], recorder.notes
    assert any(n.startswith("gateway gw1: h2 drained for hp2:") for n in recorder.notes)
    assert {k: v for k, v in admin.servers.items() if k.startswith("hp2-eu")} == {
        k: "UP" for k in servers if k.startswith("hp2-eu")}
    assert list(drains(world)) == ["hp2/h2"]
