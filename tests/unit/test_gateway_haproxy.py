"""The rendered gateway run by the real HAProxy of this machine (Debian 12's 2.6, the package
the proxy image installs), on loopback addresses only: requests routed by their authority
(HTTP/2 ``:authority`` for gRPC, ``Host`` for REST), an unknown authority answered NOT_FOUND /
404, and the rate limit answered RESOURCE_EXHAUSTED (gRPC's Trailers-Only answer from the
errorfile) / 429. The serving hosts are closed loopback ports: a request the gateway routes
finds every checked server down, goes to the unchecked fail-open twins, is refused there and
ends UNAVAILABLE / 503 after the retries, which tells it apart from the gateway's own answers.
Then a host whose status read never says AVAILABLE but which serves: every check fails, and
the gateway fails open to it (a request served), unless it is drained there."""

from __future__ import annotations

import http.client
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port as _free_port
from tfsdeploy.core.inventory.fleet import Group, Host
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.load import build_inventory
from tfsdeploy.core.render.gateway_proxy import GATEWAY_FILE, plan_gateway, render_gateway_files

from .test_gateway import model

DOMAIN = "models.example.com"
PREDICT = "/tensorflow.serving.PredictionService/Predict"


@contextmanager
def _haproxy(directory: Path, gateway: Gateway, host: Host) -> Iterator[None]:
    """The gateway of ``gateway`` routing model m1 to ``host``, run by HAProxy within the
    block; its admin socket is ``directory``/admin.sock."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.fail("haproxy is not installed: run scripts/setup (it installs it)")
    inv = build_inventory(
        "inv.py", hosts=[host, Host("gw", "127.0.0.9")], groups={"gateway": Group(["gw"])},
        defaults={}, models=[model("m1")], gateway=gateway)
    plan = plan_gateway(inv)
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
        yield
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    ports = {"grpc": _free_port(), "rest": _free_port()}
    with _haproxy(tmp_path_factory.mktemp("gateway"),
                  Gateway(domain=DOMAIN, grpc_port=ports["grpc"], rest_port=ports["rest"],
                          routes=[Route("m1", rate_limit_rps=1)], check_interval_ms=200,
                          check_timeout_ms=100),
                  Host("s1", "127.0.0.2", vars={"grpc_port": 1, "rest_port": 2})):
        yield ports


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
    # three at once: one within the rate, routed to m1 (no host answers); the others refused
    # at once (the routed one takes a second per retry: HAProxy waits min(timeout connect,
    # 1 s) before each, so one after the other they would each start a new second)
    with ThreadPoolExecutor(max_workers=3) as pool:
        routed = sorted(pool.map(lambda _: _grpc(gateway["grpc"],
                                                 f"m1.{DOMAIN}:{gateway['grpc']}"), range(3)))
    assert routed == [("RESOURCE_EXHAUSTED", "rate limit of 1 requests/s of model m1 reached")
                      ] * 2 + [("UNAVAILABLE", routed[2][1])], routed


def test_rest_is_routed_by_host_and_refused_beyond_the_rate(gateway: dict[str, int]) -> None:
    time.sleep(2.1)  # the gRPC test's requests have left the 1 s rate (HAProxy weighs the
    # previous second in as well)
    assert _rest(gateway["rest"], f"nope.{DOMAIN}") == (
        404, '{"error": "no model at this authority"}')
    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = sorted(pool.map(lambda _: _rest(gateway["rest"], f"M1.{DOMAIN}"), range(3)))
    assert [a[0] for a in answers] == [429, 429, 503], answers
    assert answers[0][1] == '{"error": "rate limit of 1 requests/s reached"}'


class _ServesButNeverAvailable(BaseHTTPRequestHandler):
    """A host that serves every request but whose model status never says AVAILABLE (the
    gateway's check fails on every read)."""

    BODY = b'{"model_version_status": [{"version": "1", "state": "LOADING"}]}'

    def do_GET(self) -> None:
        body = self.BODY
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


def _admin(directory: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(directory / "admin.sock"))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def _status(directory: Path) -> dict[tuple[str, str], str]:
    """(backend, server) -> status, from ``show stat``."""
    rows = [line.split(",") for line in _admin(directory, "show stat").splitlines()]
    return {(row[0], row[1]): row[17] for row in rows if len(row) > 17}


def test_every_host_failing_its_checks_is_still_sent_requests_unless_drained(
        tmp_path: Path) -> None:
    """Every check of the model's one host fails (its status says LOADING) while it serves:
    the checked backend has no server up, and the gateway fails open to the unchecked twin
    (as a cloud load balancer does when every target is unhealthy); a drain set on the
    model's backends (what `fab retire` and a recreate deploy send) holds there too."""
    server = ThreadingHTTPServer(("127.0.0.3", 0), _ServesButNeverAvailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rest = _free_port()
    try:
        with _haproxy(tmp_path, Gateway(routes=[Route("m1", grpc_port=_free_port(),
                                                      rest_port=rest)],
                                        check_interval_ms=100, check_timeout_ms=50),
                      Host("s1", "127.0.0.3", vars={"grpc_port": 1,
                                                    "rest_port": server.server_port})):
            end = time.monotonic() + 10
            while _status(tmp_path)[("m1-grpc", "s1")] != "DOWN":  # after 2 failed checks
                assert time.monotonic() < end, _status(tmp_path)
                time.sleep(0.1)
            assert _status(tmp_path)[("m1-rest-open", "s1")] == "no check"
            # the host's own answer, through the gateway
            assert _rest(rest, "m1") == (200, _ServesButNeverAvailable.BODY.decode())
            for backend in ("m1-grpc", "m1-rest", "m1-grpc-open", "m1-rest-open"):
                _admin(tmp_path, f"set server {backend}/s1 state drain")
            assert _rest(rest, "m1")[0] == 503
    finally:
        server.shutdown()
