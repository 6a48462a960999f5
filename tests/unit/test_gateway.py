"""The gateway setting (core/inventory/gateway.py) and HAProxy's file for it
(core/render/gateway_proxy.py): every rule refused with its place and fix, the rendered
directory accepted by the real HAProxy (`haproxy -c`, the same Debian 2.6 package as the proxy
image), and the pieces the roll and the deploy use (stat parsing, carried drains, drain
commands)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ConfigError
from tfsdeploy.core.inventory.catalog import Model, Signature, TensorSpec
from tfsdeploy.core.inventory.fleet import Group, Host
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.load import Inventory, build_inventory
from tfsdeploy.core.render.gateway_proxy import (
    GATEWAY_FILE,
    GatewayServer,
    carried_state,
    configured,
    drain_commands,
    files_digest,
    grpc_answer,
    missing_drains,
    parse_gateway_stat,
    plan_gateway,
    render_gateway_files,
    route_health,
    stale_drains,
)
from tfsdeploy.core.rollout.records import GatewayDrain

SIG = Signature(inputs={"x": TensorSpec("DT_FLOAT", (-1, 1))},
                outputs={"y": TensorSpec("DT_FLOAT", (-1, 1))})
HOSTS = [Host("s1", "10.0.0.1"), Host("s2", "10.0.0.2"), Host("gw1", "10.0.0.9"),
         Host("gw2", "10.0.0.10")]


def model(name: str, **extra: Any) -> Model:
    return Model(name=name, source=f"/srv/{name}", signature=SIG, memory_mib=512,
                 latency_slo_ms=50, **extra)


def inventory(gateway: object, *, models: list[Model] | None = None,
              groups: dict[str, Group] | None = None) -> Inventory:
    return build_inventory(
        "inv.py", hosts=HOSTS,
        groups={"gateway": Group(["gw1", "gw2"])} if groups is None else groups,
        defaults={}, gateway=gateway,
        models=models if models is not None else [model("m1"),
                                                  model("m2", port_offset=100)])


def problems(gateway: object, **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        inventory(gateway, **kwargs)
    return [p.render() for p in caught.value.problems]


def test_all_leaves_the_gateway_hosts_out_and_the_routes_reach_the_serving_hosts() -> None:
    inv = inventory(Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)]))
    assert [h.name for h in inv.select(model=inv.model("m1"))] == ["s1", "s2"]
    assert [h.name for h in inv.gateway_hosts] == ["gw1", "gw2"]
    plan = plan_gateway(inv)
    assert [(s.name, s.grpc, s.rest) for s in plan.routes[0].servers] == [
        ("s1", "10.0.0.1:8500", "10.0.0.1:8501"), ("s2", "10.0.0.2:8500", "10.0.0.2:8501")]


@pytest.mark.parametrize(("gateway", "expected"), [
    (Gateway(routes=[Route("nope", grpc_port=9500, rest_port=9501)]),
     "[file inv.py, field gateway.routes[0].model] model 'nope' is not in the catalog"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501),
                     Route("m1", grpc_port=9600, rest_port=9601)]),
     "model 'm1' is routed twice"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501),
                     Route("m2", grpc_port=9501, rest_port=9502)]),
     "[file inv.py, field gateway.routes[1].grpc_port] routes[0].rest_port and "
     "routes[1].grpc_port are both 9501"),
    (Gateway(routes=[Route("m1", grpc_port=9500)]), "model 'm1' has only a gRPC port"),
    (Gateway(routes=[Route("m1")]),
     "model 'm1' has no ports and the gateway no domain: no request could reach it"),
    (Gateway(domain="models.example.com", routes=[Route("m1")], grpc_port=9500,
             rest_port=9500),
     "grpc_port and rest_port are both 9500"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)], check_interval_ms=500,
             check_timeout_ms=500),
     "check_timeout_ms 500 is not below check_interval_ms 500"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)], request_timeout_ms=40),
     "request_timeout_ms 40 is below the latency SLO of model 'm1' (50 ms)"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)], group="edge"),
     "the gateway's group 'edge' is not declared"),
])
def test_each_rule_is_refused_with_its_place(gateway: Gateway, expected: str) -> None:
    found = problems(gateway)
    assert any(expected in p for p in found), found
    assert all("fix:" in p for p in found)


def test_a_model_whose_name_is_no_dns_label_needs_its_own_ports() -> None:
    found = problems(Gateway(domain="models.example.com", routes=[Route("m_1")]),
                     models=[model("m_1")])
    assert any("cannot be the first label of an authority 'm_1.models.example.com'" in p
               and "give this Route its own grpc_port and rest_port" in p for p in found), found


def test_a_model_placed_on_a_gateway_host_is_refused() -> None:
    found = problems(Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)]),
                     models=[model("m1", hosts="s1,gw1")])
    assert any("model 'm1' is placed on gateway host(s) gw1" in p for p in found), found


@pytest.mark.parametrize(("gateway", "field"), [
    ({"routes": []}, "gateway"),
    (Gateway(routes=[Route("m1", grpc_port=0, rest_port=9501)]), "gateway.routes[0].grpc_port"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501, rate_limit_rps=0)]),
     "gateway.routes[0].rate_limit_rps"),
    (Gateway(routes=[Route("m1")], domain="Models.Example"), "gateway.domain"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)], check_interval_ms=True),
     "gateway.check_interval_ms"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)], deadline_s=0.0),
     "gateway.deadline_s"),
    (Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)], deadline_s=1e9),
     "gateway.deadline_s"),
])
def test_values_are_typed_and_bounded(gateway: object, field: str) -> None:
    found = problems(gateway)
    assert found and any(field in p for p in found), found


def _check(directory: Path) -> subprocess.CompletedProcess[str]:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    return subprocess.run([haproxy, "-c", "-f", str(directory / GATEWAY_FILE)],
                          capture_output=True, text=True, timeout=60, check=False)


def _write(files: dict[str, str], directory: Path) -> None:
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)


def test_the_rendered_directory_passes_haproxy_check(tmp_path: Path) -> None:
    inv = inventory(Gateway(domain="models.example.com", routes=[
        Route("m1", rate_limit_rps=1000), Route("m2", grpc_port=9500, rest_port=9501)]))
    plan = plan_gateway(inv)
    files = render_gateway_files(plan, plan.hosts[0], files_dir=str(tmp_path / "gw"),
                                 admin_socket=str(tmp_path / "admin.sock"),
                                 server_state=str(tmp_path / "servers.state"))
    _write(files, tmp_path / "gw")
    (tmp_path / "servers.state").write_text("1\n")  # what a start writes
    checked = _check(tmp_path / "gw")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "[WARNING]" not in checked.stdout + checked.stderr
    config = files[GATEWAY_FILE]
    # h2c to every host's stable gRPC port, checked over HTTP/1 on its REST port
    assert "server s1 10.0.0.1:8500 proto h2 check port 8501 check-proto h1 inter 1000ms" in config
    assert "http-check send meth GET uri /v1/models/m1 ver HTTP/1.1" in config
    # out after 2 failed checks (one late answer of a busy host is no outage), at once on a
    # failed connection of live traffic; back after 2 good ones (2 models x 2 hosts: each REST
    # server tracks its gRPC twin)
    assert config.count("fall 2 rise 2 observe layer4 error-limit 1 on-error mark-down") == 4
    assert "AVAILABLE" in config and "http-reuse always" in config
    # idle connections are purged every pool-purge-delay (default 5 s), and a connection
    # between two requests is idle: the gateway keeps them an hour
    # 2 models x 2 hosts x gRPC, REST x checked and fail-open
    assert config.count("pool-purge-delay 3600000ms") == 16
    # no checked server usable (every host failed its checks): the unchecked twins, which
    # neither check nor track
    assert "use_backend m1-grpc-open if { req.hdr(host),field(1,:),lower -m str " \
           "m1.models.example.com } { nbsrv(m1-grpc) eq 0 }" in config
    assert "frontend m2-rest\n    bind :9501\n    use_backend m2-rest-open if " \
           "{ nbsrv(m2-grpc) eq 0 }\n    default_backend m2-rest" in config
    opened = config[config.index("\nbackend m1-grpc-open"):config.index("\nbackend m1-rest-open")]
    assert "server s1 10.0.0.1:8500 proto h2 pool-purge-delay 3600000ms" in opened
    assert "check" not in opened.replace("# ", "#").split("\n    server", 1)[1]
    # the rate: the requests let through, RESOURCE_EXHAUSTED / 429 beyond
    assert "if { sc_gpc0_rate(0) ge 1000 }" in config
    assert "m1.rate-limited.grpc.http" in files and "status 429" in config
    assert "use_backend m1-grpc if { req.hdr(host),field(1,:),lower -m str " \
           "m1.models.example.com }" in config
    assert "frontend m2-grpc\n    bind :9500 proto h2" in config


def test_a_broken_answer_file_is_what_haproxy_refuses(tmp_path: Path) -> None:
    """The check is real: HAProxy reads the errorfiles the configuration names."""
    inv = inventory(Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501,
                                          rate_limit_rps=5)]))
    plan = plan_gateway(inv)
    files = render_gateway_files(plan, plan.hosts[0], files_dir=str(tmp_path / "gw"),
                                 admin_socket=str(tmp_path / "admin.sock"))
    del files["m1.rate-limited.grpc.http"]
    _write(files, tmp_path / "gw")
    assert _check(tmp_path / "gw").returncode != 0


def test_the_grpc_answer_is_a_trailers_only_response() -> None:
    text = grpc_answer(8, "rate limit of 5 requests/s reached: 100%")
    assert text.split("\r\n") == [
        "HTTP/1.1 200 OK", "Content-Type: application/grpc", "grpc-status: 8",
        "grpc-message: rate limit of 5 requests/s reached: 100%25", "Content-Length: 0", "", ""]


STAT = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,"
        "wretr,wredis,status\n") + """m1-grpc,s1,0,0,3,5,,10,0,0,,0,,0,0,0,0,UP
m1-grpc,s2,0,0,0,1,,10,0,0,,0,,0,0,0,0,DRAIN
m1-grpc,BACKEND,0,0,3,5,,10,0,0,,0,,0,0,0,0,UP
m1-rest,s1,0,0,0,0,,0,0,0,,0,,0,0,0,0,UP
m1-rest,s2,0,0,0,0,,0,0,0,,0,,0,0,0,0,MAINT
m1-grpc-open,s1,0,0,0,0,,0,0,0,,0,,0,0,0,0,no check
m1-grpc-open,s2,0,0,0,0,,0,0,0,,0,,0,0,0,0,DRAIN
m1-rest-open,s1,0,0,0,0,,0,0,0,,0,,0,0,0,0,no check
m1-rest-open,s2,0,0,0,0,,0,0,0,,0,,0,0,0,0,DRAIN
m1-grpc-frontend,FRONTEND,0,0,0,0,,0,0,0,,0,,0,0,0,0,OPEN
"""


def test_stat_health_and_the_drains_a_reload_carries_over() -> None:
    servers = parse_gateway_stat(STAT)
    assert servers[0] == GatewayServer("m1-grpc", "s1", "UP", 3)
    inv = inventory(Gateway(routes=[Route("m1", grpc_port=9500, rest_port=9501)]))
    plan = plan_gateway(inv)
    assert route_health(plan, servers) == {"m1": (1, 2)}  # a draining s2 takes no request
    # the unchecked twins ("no check") are no health: only the checked gRPC servers count
    assert route_health(plan, servers[4:]) == {"m1": (0, 2)}
    assert carried_state(servers, configured(plan)) == [
        "set server m1-grpc/s2 state drain", "set server m1-grpc-open/s2 state drain",
        "set server m1-rest/s2 state maint", "set server m1-rest-open/s2 state drain"]
    assert drain_commands("m1", "s2") == [
        "set server m1-grpc/s2 state drain", "set server m1-rest/s2 state drain",
        "set server m1-grpc-open/s2 state drain", "set server m1-rest-open/s2 state drain"]


def _drain(model: str, host: str) -> GatewayDrain:
    return GatewayDrain(model=model, host=host, reason="why", run="deploy x r1")


def test_recorded_drains_reach_a_new_worker_and_one_that_lacks_them() -> None:
    """A worker started after a kill (or a reboot) holds no drain: the recorded ones are set
    on it; those of servers the configuration no longer has are stale."""
    plan = plan_gateway(inventory(Gateway(routes=[Route("m1", grpc_port=9500,
                                                        rest_port=9501)])))
    fresh = parse_gateway_stat(STAT.replace("DRAIN", "UP").replace("MAINT", "UP"))
    recorded = [_drain("m1", "s2"), _drain("m1", "gone")]
    assert carried_state((), configured(plan), recorded) == [
        "set server m1-grpc/s2 state drain", "set server m1-grpc-open/s2 state drain",
        "set server m1-rest/s2 state drain", "set server m1-rest-open/s2 state drain"]
    assert missing_drains(fresh, plan, recorded) == [
        "set server m1-grpc/s2 state drain", "set server m1-rest/s2 state drain",
        "set server m1-grpc-open/s2 state drain", "set server m1-rest-open/s2 state drain"]
    assert missing_drains(parse_gateway_stat(STAT), plan, recorded) == []  # held already
    assert stale_drains(plan, recorded) == [_drain("m1", "gone")]


PREFIXED = ("# pxname,svname,qcur,qmax,scur,status\n"
            "ranker-grpc,s1,0,0,0,DRAIN\nranker-rest,s1,0,0,0,DRAIN\n"
            "ranker-eu-grpc,s1,0,0,4,UP\nranker-eu-rest,s1,0,0,0,UP\n"
            "ranker-eu-grpc,s2,0,0,0,UP\nranker-eu-rest,s2,0,0,0,UP\n"
            "ranker-grpc-open,s1,0,0,0,DRAIN\nranker-eu-grpc-open,s1,0,0,0,no check\n")


def test_models_whose_names_prefix_each_other_keep_their_own_backends() -> None:
    """``ranker`` and ``ranker-eu``: each model's servers are those of its own two backends,
    matched whole."""
    servers = parse_gateway_stat(PREFIXED)
    assert [(s.backend, s.host) for s in servers if s.of("ranker")] == [
        ("ranker-grpc", "s1"), ("ranker-rest", "s1"), ("ranker-grpc-open", "s1")]
    assert {s.host for s in servers if s.of("ranker-eu")} == {"s1", "s2"}
    inv = inventory(Gateway(routes=[Route("ranker", grpc_port=9500, rest_port=9501),
                                    Route("ranker-eu", grpc_port=9600, rest_port=9601)]),
                    models=[model("ranker"), model("ranker-eu", port_offset=100)])
    plan = plan_gateway(inv)
    assert route_health(plan, servers) == {"ranker": (0, 2), "ranker-eu": (2, 2)}
    assert missing_drains(servers, plan, [_drain("ranker", "s2")]) == []  # no ranker/s2 up
    assert missing_drains(servers, plan, [_drain("ranker-eu", "s2")]) == [
        "set server ranker-eu-grpc/s2 state drain", "set server ranker-eu-rest/s2 state drain"]


def test_the_files_digest_covers_names_and_contents() -> None:
    one = {"haproxy.cfg": "a", "x.http": "b"}
    assert files_digest(one) == files_digest(dict(reversed(one.items())))
    assert files_digest(one) != files_digest({"haproxy.cfg": "a", "x.http": "c"})
    assert files_digest({"ab": "c"}) != files_digest({"a": "bc"})


def test_no_gateway_declared_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="the inventory declares no gateway"):
        plan_gateway(build_inventory("inv.py", hosts=HOSTS, groups={}, defaults={},
                                     models=[model("m1")]))
