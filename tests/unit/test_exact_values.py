"""Values that reach argvs, paths, ACLs and audit lines are checked exactly: ``model_registry``
by the OCI reference grammar (a registry host[:port] Docker pulls from, a repository; no
credentials, nothing that reads as an option), gateway route names unique without case, release
ids whole and in ASCII digits; and `fab gateway` runs one at a time (its lock, the real lock
scripts on local directories)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from tfsdeploy.core.errors import ExitCode
from tfsdeploy.core.inventory.fleet import Group, Host, HostVars, ResolvedHost
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.layout import HostPaths, is_release_id
from tfsdeploy.core.inventory.load import build_inventory
from tfsdeploy.core.inventory.schema import check
from tfsdeploy.core.render.gateway_proxy import plan_gateway
from tfsdeploy.core.rollout.records import ReleaseId
from tfsdeploy.hosts import lock
from tfsdeploy.hosts.ssh import Result
from tfsdeploy.run.gateway import roll_gateway

from .fakes import FrozenClock
from .test_gateway import model, problems
from .test_gateway_roll import FakeConnection, FakeGatewayHost, _roll


def _registry_problems(value: str) -> list[str]:
    _, found = check(HostVars, {"model_registry": value}, file="inv.py")
    return [p.render() for p in found]


@pytest.mark.parametrize(("value", "expected"), [
    ("--entrypoint=x/models", "has a registry starting with '-' ('--entrypoint=x'): it would "
                              "read as an option"),
    ("a b;$(id)/models", "has no registry host[:port] ('a b;$(id)' is not a DNS name"),
    ("bob:s3cr3t@reg:5000/models", "model_registry '***@reg:5000/models' holds credentials"),
    ("registry/models", "Docker would take for a Docker Hub namespace"),
    ("reg:70000/models", "has port 70000, not 1-65535"),
    ("reg:5000/Models", "has 'Models', not a repository name component"),
    ("reg:5000/models\n", "is not 'host[:port]/repository'"),
    ("reg:5000", "is not 'host[:port]/repository'"),
])
def test_a_model_registry_outside_the_reference_grammar_is_refused(value: str,
                                                                   expected: str) -> None:
    found = _registry_problems(value)
    assert len(found) == 1 and expected in found[0], found
    assert "field model_registry" in found[0] and "fix:" in found[0], found
    assert "s3cr3t" not in found[0] and "bob" not in found[0]  # a password is never shown


@pytest.mark.parametrize("value", ["reg:5000/tfsdeploy-models", "10.87.0.1:5000/m/x",
                                   "registry.internal/models", "localhost/m",
                                   "[fd00::1]:5000/models", "Registry/models"])
def test_registries_docker_pulls_from_pass(value: str) -> None:
    assert _registry_problems(value) == []


def test_route_names_differing_only_in_case_are_refused() -> None:
    found = problems(Gateway(domain="models.example.com", routes=[
        Route("resnet50"), Route("ResNet50", rate_limit_rps=10)]),
        models=[model("resnet50"), model("ResNet50", port_offset=100)])
    assert any("[file inv.py, field gateway.routes[1].model] model 'ResNet50' is routed "
               "beside 'resnet50': route names must differ in more than case" in p
               for p in found), found


@pytest.mark.parametrize("value", ["r20260101-000000000-v1\n", "r20260101-000000000-v1 ",
                                   "r\uff120260101-000000000-v1", "x/r20260101-000000000-v1"])
def test_a_release_id_is_matched_whole(value: str) -> None:
    assert not is_release_id(value)
    with pytest.raises(ValidationError):
        TypeAdapter(ReleaseId).validate_python(value)


def test_a_well_formed_release_id_passes() -> None:
    assert is_release_id("r20260101-000000000-v12")
    assert TypeAdapter(ReleaseId).validate_python("r20260101-000000000-v12")


# -- fab gateway under a lock ------------------------------------------------------------------

class LockingConnection(FakeConnection):
    """A fake gateway host whose lock commands run for real on its local data root."""

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | None = None) -> Result:
        if any("/gateway/lock" in arg for arg in argv):
            done = subprocess.run(argv, input=stdin, capture_output=True, check=False)
            return Result(tuple(argv), done.returncode, done.stdout.decode(),
                          done.stderr.decode())
        return super().run(argv, timeout=timeout, stdin=stdin)


def _plan(root: Path) -> Any:
    hosts = [Host("s1", "10.0.0.1"), Host("s2", "10.0.0.2"),
             Host("gw1", "10.0.0.9", vars={"data_root": str(root / "gw1")}),
             Host("gw2", "10.0.0.10", vars={"data_root": str(root / "gw2")})]
    inv = build_inventory("inv.py", hosts=hosts, groups={"gateway": Group(["gw1", "gw2"])},
                          defaults={}, models=[model("m1")],
                          gateway=Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)]))
    return plan_gateway(inv)


def test_a_second_fab_gateway_is_refused_while_one_runs(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    fakes = {"gw1": FakeGatewayHost("gw1"), "gw2": FakeGatewayHost("gw2")}
    holder = lock.new_lock_record("gateway")  # a run of this very process: alive
    for host in plan.hosts:
        site = lock.LockSite(host.name, LockingConnection(host, fakes[host.name]),
                             HostPaths(root=host.vars.data_root, model="gateway"))
        assert site.conn.run(lock.lock_commands.acquire(site.paths,
                                                        holder.model_dump_json())).ok

    def connect(host: ResolvedHost) -> LockingConnection:
        return LockingConnection(host, fakes[host.name])

    lines: list[str] = []
    refused = roll_gateway(plan, say=lines.append, clock=FrozenClock(), connect=connect)
    assert refused.exit_code == ExitCode.LOCKED, refused.hosts
    assert "another deploy of the gateway holds the lock on gw1: gateway by" in \
        refused.hosts["lock"]
    assert all(not f.live and not f.events for f in fakes.values()), "nothing changed"
    for host in plan.hosts:  # the holder's parts are its own still
        site = lock.LockSite(host.name, connect(host),
                             HostPaths(root=host.vars.data_root, model="gateway"))
        assert lock.read(site)[0] == holder
        assert lock.remove(site, holder.token)[0]
    done = roll_gateway(plan, say=lines.append, clock=FrozenClock(), connect=connect)
    assert done.exit_code == ExitCode.OK, done.hosts
    assert all(f.running for f in fakes.values())
    assert not any((tmp_path / h / "gateway" / "lock").exists() for h in ("gw1", "gw2")), \
        "the run gave its lock back"


def test_fab_gateway_check_reads_only_and_takes_no_lock(tmp_path: Path) -> None:
    fakes = {"gw1": FakeGatewayHost("gw1"), "gw2": FakeGatewayHost("gw2")}
    result, _ = _roll(_plan(tmp_path), fakes, check=True)
    assert result.exit_code == ExitCode.OK
    assert not (tmp_path / "gw1").exists()
