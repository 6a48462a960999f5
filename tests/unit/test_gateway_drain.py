"""The deploy keeps the gateway right, on fake hosts: a host taken out of rotation (the
``recreate`` strategy, `fab retire`) is drained on every gateway host first, and put back in
rotation there when it serves again; a gateway host that refuses fails the step before the
host's proxy is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.target import Target, load_target
from tfsdeploy.hosts.ssh import Result
from tfsdeploy.run.deploy import deploy
from tfsdeploy.run.retire import retire

from . import runs
from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import MODEL, Recorder

GATEWAY = '''
from tfsdeploy.core.inventory.fleet import Group
from tfsdeploy.core.inventory.gateway import Gateway, Route
hosts.append(Host("gw1", "10.9.0.99", vars={{"data_root": "/srv/gw"}}))
groups = {{"gateway": Group(["gw1"])}}
gateway = Gateway(routes=[Route("hp2", grpc_port=9500, rest_port=9501)])
'''


class GatewayConnection:
    """A gateway host: its runtime API answers (``socat``), in order, into ``log``."""

    def __init__(self, host: ResolvedHost, log: list[str], *, refuse: bool = False) -> None:
        self.host, self.log, self.refuse = host, log, refuse

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | None = None) -> Result:
        assert argv[0] == "socat" and argv[-1] == "UNIX-CONNECT:/srv/gw/gateway/admin/admin.sock"
        if self.refuse:
            return Result(tuple(argv), 1, "", "socat: Connection refused")
        commands = [c.strip() for c in (stdin or b"").decode().split(";") if c.strip()]
        self.log += [f"gw1: {c}" for c in commands]
        if commands == ["show stat"]:
            return Result(tuple(argv), 0, "# pxname,svname,qcur,qmax,scur,status\n"
                          "hp2-grpc,h1,0,0,0,DRAIN\n", "")
        return Result(tuple(argv), 0, "\n", "")

    def close(self) -> None:
        pass


def _target(world: dict[str, Any], *, strategy: str = "dual-slot",
            hosts: str | None = None) -> Target:
    text = Path(runs.inventory_file(world, count=2)).read_text()
    text = text.replace('keep_releases=3)', f'keep_releases=3, strategy="{strategy}")')
    path = world["tmp"] / f"inv-gateway-{strategy}.py"
    path.write_text(text + GATEWAY.format())
    return load_target(MODEL, inventory=str(path), hosts=hosts)


def _connect(fleet: FakeFleet, log: list[str], *, refuse: bool = False) -> Any:
    def connect(host: ResolvedHost) -> Any:
        if host.name == "gw1":
            return GatewayConnection(host, log, refuse=refuse)
        conn = fleet.connect(host)
        original = conn.run

        def run(argv: list[str], **kwargs: Any) -> Result:
            if argv[:1] == ["socat"] and b"state" in (kwargs.get("stdin") or b""):
                log.append(f"{host.name} proxy: {kwargs['stdin'].decode().strip()}")
            return original(argv, **kwargs)

        conn.run = run  # type: ignore[method-assign]
        return conn
    return connect


def test_retire_drains_the_host_at_the_gateway_before_its_proxy(world: dict[str, Any]) -> None:
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    result = retire(_target(world, hosts="h1"), reporter=Recorder(),
                    connect=_connect(world["fleet"], log))
    assert result.exit_code == ExitCode.OK, result.message
    drain = log.index("gw1: set server hp2-grpc/h1 state drain")
    assert log[drain + 1] == "gw1: set server hp2-rest/h1 state drain"
    assert log[drain + 2] == "gw1: show stat"  # none in flight there: the drain is done
    first_proxy = next(i for i, line in enumerate(log) if line.startswith("h1 proxy:"))
    assert drain < first_proxy, log
    assert not any("h2" in line for line in log if line.startswith("gw1"))


def test_recreate_drains_at_the_gateway_and_puts_the_host_back(world: dict[str, Any]) -> None:
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    result = deploy(_target(world, strategy="recreate"), version=2, reporter=Recorder(),
                    connect=_connect(world["fleet"], log), clock=FrozenClock(),
                    client_factory=FakeSlot)
    assert result.exit_code == ExitCode.OK, result.message
    gateway = [line for line in log if line.startswith("gw1: set")]
    assert gateway == [f"gw1: set server hp2-{kind}/{host} state {state}"
                       for host in ("h1", "h2") for state in ("drain", "ready")
                       for kind in ("grpc", "rest")], gateway
    for host in ("h1", "h2"):
        drained = log.index(f"gw1: set server hp2-grpc/{host} state drain")
        out = next(i for i, line in enumerate(log)
                   if line.startswith(f"{host} proxy:") and "maint" in line)
        back = log.index(f"gw1: set server hp2-grpc/{host} state ready")
        assert drained < out < back, log


def test_a_gateway_that_refuses_the_drain_stops_the_host_before_its_proxy(
        world: dict[str, Any]) -> None:
    runs.run_deploy(world, 1, count=2)
    log: list[str] = []
    result = retire(_target(world, hosts="h1"), reporter=Recorder(),
                    connect=_connect(world["fleet"], log, refuse=True))
    assert result.exit_code != ExitCode.OK
    assert "gateway gw1 to drain h1" in str(result.hosts["h1"].error), result.hosts["h1"]
    assert not any(line.startswith("h1 proxy:") for line in log), log
    assert len(runs.serving(world["fleet"]["h1"])) == 1
