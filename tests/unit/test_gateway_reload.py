"""A gateway reload with the real HAProxy of this machine (Debian 12's 2.6, the package the
proxy image installs), in master-worker mode as in the gateway's container, on loopback: the
new worker starts from the servers' states the old one held (``kept_server_state`` written
where ``server-state-file`` points, then SIGUSR2 to the master, as `fab gateway` does), so a
reload is no health event; a server whose ports the new file changes starts afresh."""

from __future__ import annotations

import http.server
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bounds import within
from tests.ports import free_port as _free_port
from tfsdeploy.core.inventory.fleet import Group, Host
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.load import build_inventory
from tfsdeploy.core.render.gateway_proxy import (
    GATEWAY_FILE,
    kept_server_state,
    plan_gateway,
    render_gateway_files,
)

from .test_gateway import model

RISE, FALL = 2, 2
FIELDS = ["be_id", "be_name", "srv_id", "srv_name", "srv_addr", "srv_op_state",
          "srv_admin_state", "srv_uweight", "srv_iweight", "srv_time_since_last_change",
          "srv_check_status", "srv_check_result", "srv_check_health"]


class _Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"model_version_status": [{"version": "1", "state": "AVAILABLE"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Gw:
    directory: Path
    master: subprocess.Popen[bytes]
    s1_rest: int

    def admin(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.directory / "admin.sock"))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def states(self) -> dict[tuple[str, str], dict[str, int]]:
        found = {}
        for line in self.admin("show servers state").splitlines()[1:]:
            if line.strip() and not line.startswith("#"):
                row = dict(zip(FIELDS, line.split(), strict=False))
                found[(row["be_name"], row["srv_name"])] = {
                    k: int(row[k]) for k in ("srv_op_state", "srv_check_health",
                                             "srv_time_since_last_change")}
        return found

    def worker(self) -> int:
        info = self.admin("show info")
        return int(next(line.split(":")[1] for line in info.splitlines()
                        if line.startswith("Pid:")))

    def log(self) -> str:
        return (self.directory / "haproxy.log").read_text(errors="replace")

    def reload(self, config: str) -> None:
        """What start_or_reload does on a gateway host, here on loopback."""
        (self.directory / GATEWAY_FILE).write_text(config)
        kept = kept_server_state(self.admin("show servers state"), config)
        (self.directory / "servers.state").write_text(kept)
        old = self.worker()
        self.master.send_signal(signal.SIGUSR2)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            try:
                if self.worker() != old:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"no new worker after the reload:\n{self.log()}")


def render(directory: Path, s1_rest: int, s1_grpc: int, ports: dict[str, int]) -> str:
    hosts = [Host("s1", "127.0.0.1", vars={"grpc_port": s1_grpc, "rest_port": s1_rest}),
             Host("s2", "127.0.0.2", vars={"grpc_port": ports["s2_grpc"],
                                           "rest_port": ports["s2_rest"]}),
             Host("gw", "127.0.0.9")]
    inv = build_inventory(
        "inv.py", hosts=hosts, groups={"gateway": Group(["gw"])}, defaults={},
        models=[model("m1")],
        gateway=Gateway(routes=[Route("m1", grpc_port=ports["grpc"], rest_port=ports["rest"])],
                        # s1's checks go to this test's own HTTP server, which runs at nice 19
                        # beside the fleet tiers in CI: 900 ms cover its stalls (0.25 s seen)
                        check_interval_ms=1000, check_timeout_ms=900, rise=RISE, fall=FALL))
    plan = plan_gateway(inv)
    return render_gateway_files(plan, plan.hosts[0], files_dir=str(directory),
                                admin_socket=str(directory / "admin.sock"),
                                server_state=str(directory / "servers.state"))[GATEWAY_FILE]


@pytest.fixture()
def gateway(tmp_path: Path) -> Iterator[tuple[Gw, dict[str, int]]]:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.fail("haproxy is not installed: run scripts/setup (it installs it)")
    status = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    threading.Thread(target=status.serve_forever, daemon=True).start()
    ports = {name: _free_port() for name in ("grpc", "rest", "s1_grpc", "s2_grpc", "s2_rest")}
    s1_rest = int(status.server_address[1])
    config = render(tmp_path, s1_rest, ports["s1_grpc"], ports)
    (tmp_path / GATEWAY_FILE).write_text(config)
    (tmp_path / "servers.state").write_text(kept_server_state("", config))  # as a start
    with open(tmp_path / "haproxy.log", "wb") as log:
        master = subprocess.Popen([haproxy, "-W", "-db", "-f", str(tmp_path / GATEWAY_FILE)],
                                  stdout=log, stderr=subprocess.STDOUT)
    gw = Gw(tmp_path, master, s1_rest)
    try:
        end = time.monotonic() + 15
        while time.monotonic() < end:
            assert master.poll() is None, gw.log()
            try:
                states = gw.states()
            except OSError:
                states = {}
            if states.get(("m1-grpc", "s1"), {}).get("srv_check_health") == RISE + FALL - 1 \
                    and states.get(("m1-grpc", "s2"), {}).get("srv_op_state") == 0:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"s1 not fully up, s2 not down: {gw.states()}\n{gw.log()}")
        yield gw, ports
    finally:
        master.kill()
        master.wait(timeout=10)
        status.shutdown()


def test_a_reload_keeps_each_servers_health_and_age(
        gateway: tuple[Gw, dict[str, int]]) -> None:
    """s1 fully up (health rise+fall-1: one failed check leaves it UP) and s2 down keep their
    states, and the age of their last change, on the new worker from its first answer. A
    worker that starts without them gives s1 the health of `rise` (one failed check from
    DOWN, whatever `fall` says), s2 UP, and both an age of 0 s."""
    gw, _ = gateway
    time.sleep(2.5)
    config = (gw.directory / GATEWAY_FILE).read_text()
    gw.reload(config)
    states = gw.states()
    s1, s2 = states[("m1-grpc", "s1")], states[("m1-grpc", "s2")]
    assert s1["srv_check_health"] == RISE + FALL - 1 and s1["srv_op_state"] == 2, states
    # ages, in HAProxy's whole seconds, after 2.5 s of sleep: a state not carried over reads
    # 0 on the new worker, so 2 separates the two cases whatever the machine's load adds
    within("age of s1's state on the new worker, s", s1["srv_time_since_last_change"],
           at_least=2, detail=states)
    assert s2["srv_op_state"] == 0, states
    within("age of s2's state on the new worker, s", s2["srv_time_since_last_change"],
           at_least=2, detail=states)
    # the REST servers track the gRPC ones: theirs carried too
    assert states[("m1-rest", "s1")]["srv_op_state"] == 2, states
    assert "m1-grpc/s1 is DOWN" not in gw.log(), gw.log()
    assert "partially applied" not in gw.log(), gw.log()  # every field it reads it applied


def test_a_server_whose_ports_change_starts_afresh(
        gateway: tuple[Gw, dict[str, int]]) -> None:
    """A state line sets the server's port and check port (src/server_state.c): the line of
    a server the new file moves is not written, so the new ports hold; the others keep
    their states."""
    gw, ports = gateway
    time.sleep(2.5)
    moved = render(gw.directory, gw.s1_rest, _free_port(), ports)
    gw.reload(moved)
    states = gw.states()
    # as above: the moved server starts afresh (age 0, or 1 if a second ticked over before
    # the admin socket answered), the kept one keeps its 2.5 s
    within("age of the moved s1 on the new worker, s",
           states[("m1-grpc", "s1")]["srv_time_since_last_change"], below=2, detail=states)
    within("age of the kept s2 on the new worker, s",
           states[("m1-grpc", "s2")]["srv_time_since_last_change"], at_least=2, detail=states)
    served = gw.admin("show servers state m1-grpc")
    assert f" {moved.split('server s1 127.0.0.1:')[1].split()[0]} " in served, served


def test_only_the_servers_the_new_file_keeps_at_their_endpoints_are_written() -> None:
    config = ("backend m1-grpc\n"
              "    server s1 10.0.0.1:8500 proto h2 check port 8501 check-proto h1\n"
              "    server s2 tb2.example:8500 proto h2 check port 8501\n"
              "backend m1-rest\n"
              "    server s1 10.0.0.1:8501 track m1-grpc/s1\n")
    header = "# be_id be_name srv_id srv_name srv_addr ..."

    def line(backend: str, server: str, addr: str, port: int, check: int,
             fqdn: str = "-") -> str:
        return (f"3 {backend} 1 {server} {addr} 2 0 100 100 41 15 3 3 6 0 0 0 {fqdn} {port} "
                f"- 0 {check} - - 0")

    state = "\n".join(["1", header,
                       line("m1-grpc", "s1", "10.0.0.1", 8500, 8501),  # kept
                       line("m1-grpc", "s2", "10.0.0.7", 8500, 8501, "tb2.example"),  # kept
                       line("m1-rest", "s1", "10.0.0.1", 8501, 0),  # kept
                       line("m1-grpc", "s3", "10.0.0.3", 8500, 8501),  # no longer there
                       line("m1-rest", "s2", "10.0.0.7", 8501, 0, "tb2.example"),  # gone
                       line("m2-grpc", "s1", "10.0.0.1", 8500, 8501)]) + "\n"  # other backend
    kept = kept_server_state(state, config).splitlines()
    assert kept[:2] == ["1", header]
    assert kept[2] == "3 m1-grpc 1 s1 10.0.0.1 2 0 100 100 41 15 3 3 6 0 0 0 - 8500 - 0 8501 -"
    assert [(k.split()[1], k.split()[3]) for k in kept[2:]] == [
        ("m1-grpc", "s1"), ("m1-grpc", "s2"), ("m1-rest", "s1")]
    moved = config.replace("check port 8501 check-proto", "check port 9501 check-proto")
    assert [k.split()[3] for k in kept_server_state(state, moved).splitlines()[2:]] == \
        ["s2", "s1"]
    readdressed = config.replace("10.0.0.1:8500", "10.0.0.11:8500")
    assert [(k.split()[1], k.split()[3])
            for k in kept_server_state(state, readdressed).splitlines()[2:]] == [
        ("m1-grpc", "s2"), ("m1-rest", "s1")]
    assert kept_server_state("2\n" + state[2:], config) == "1\n"  # a version it cannot read
    assert kept_server_state("", config) == "1\n"
