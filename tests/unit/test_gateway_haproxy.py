"""The rendered gateway run by the real HAProxy of this machine (Debian 12's 2.6, the package
the proxy image installs), on loopback addresses only: requests routed by their authority
(HTTP/2 ``:authority`` for gRPC, ``Host`` for REST), an unknown authority answered NOT_FOUND /
404, and the rate limit answered RESOURCE_EXHAUSTED (gRPC's Trailers-Only answer from the
errorfile) / 429. The serving hosts are closed loopback ports: a request the gateway routes
finds no server up (UNAVAILABLE / 503), which tells it apart from the gateway's own answers."""

from __future__ import annotations

import http.client
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.inventory.fleet import Group, Host
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.load import build_inventory
from tfsdeploy.core.render.gateway_proxy import GATEWAY_FILE, plan_gateway, render_gateway_files

from .test_gateway import model

DOMAIN = "models.example.com"
PREDICT = "/tensorflow.serving.PredictionService/Predict"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.fail("haproxy is not installed: run scripts/setup (it installs it)")
    ports = {"grpc": _free_port(), "rest": _free_port()}
    hosts = [Host("s1", "127.0.0.2", vars={"grpc_port": 1, "rest_port": 2}),
             Host("gw", "127.0.0.9")]
    inv = build_inventory(
        "inv.py", hosts=hosts, groups={"gateway": Group(["gw"])}, defaults={},
        models=[model("m1")],
        gateway=Gateway(domain=DOMAIN, grpc_port=ports["grpc"], rest_port=ports["rest"],
                        routes=[Route("m1", rate_limit_rps=1)], check_interval_ms=200,
                        check_timeout_ms=100))
    plan = plan_gateway(inv)
    directory = tmp_path_factory.mktemp("gateway")
    files = render_gateway_files(plan, plan.hosts[0], files_dir=str(directory),
                                 admin_socket=str(directory / "admin.sock"),
                                 server_state=str(directory / "servers.state"))
    for name, text in files.items():
        (directory / name).write_text(text)
    (directory / "servers.state").write_text("1\n")  # what a start writes
    process = subprocess.Popen([haproxy, "-db", "-f", str(directory / GATEWAY_FILE)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 10
        while (directory / "admin.sock").exists() is False and time.monotonic() < end:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            time.sleep(0.05)
        time.sleep(0.3)
        yield ports
    finally:
        process.kill()
        process.wait(timeout=10)


def _grpc(port: int, authority: str) -> tuple[str, str]:
    import grpc

    options = [("grpc.default_authority", authority)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_unary(PREDICT, request_serializer=None,
                                   response_deserializer=None)
        try:
            call(b"", timeout=5)
        except grpc.RpcError as error:
            return error.code().name, error.details() or ""
    return "OK", ""


def _rest(port: int, host: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/v1/models/m1", headers={"Host": host})
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def test_grpc_is_routed_by_authority_and_refused_beyond_the_rate(
        gateway: dict[str, int]) -> None:
    unknown = _grpc(gateway["grpc"], f"nope.{DOMAIN}")
    assert unknown == ("NOT_FOUND", "no model at this authority"), unknown
    routed = [_grpc(gateway["grpc"], f"m1.{DOMAIN}:{gateway['grpc']}") for _ in range(3)]
    assert routed[0][0] == "UNAVAILABLE", routed  # routed to m1: no server up
    assert ("RESOURCE_EXHAUSTED", "rate limit of 1 requests/s of model m1 reached") \
        in routed[1:], routed


def test_rest_is_routed_by_host_and_refused_beyond_the_rate(gateway: dict[str, int]) -> None:
    time.sleep(2.1)  # the gRPC test's requests have left the 1 s rate (HAProxy weighs the
    # previous second in as well)
    assert _rest(gateway["rest"], f"nope.{DOMAIN}") == (
        404, '{"error": "no model at this authority"}')
    answers = [_rest(gateway["rest"], f"M1.{DOMAIN}") for _ in range(3)]
    assert answers[0][0] == 503, answers
    assert (429, '{"error": "rate limit of 1 requests/s reached"}') in answers[1:], answers
