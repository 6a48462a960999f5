"""What the toolkit opens at once over SSH (tfsdeploy.hosts.hops and the connection in
hosts/ssh.py): handshakes bounded per hop, one shared connection to a jump host, session
channels bounded per connection, refused handshakes and sessions tried again.

The pure parts run against fakes with a recorded clock; the connection runs against paramiko
SSH servers started here on 127.0.0.1 and 127.0.0.2, which count what OpenSSH's sshd limits
(unauthenticated connections, as MaxStartups; sessions per connection, as MaxSessions) and
refuse what it would refuse. The real sshd with OpenSSH's defaults is the fleet tier's
(tests/integration/test_bastion.py, benchmarks/bench_fleet.py)."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from tfsdeploy.core.errors import ConfigError, HostUnreachable
from tfsdeploy.core.inventory.fleet import Host, HostVars, ResolvedHost
from tfsdeploy.core.inventory.load import build_inventory
from tfsdeploy.core.ssh.jump import JumpHost, jump_problem, parse_jump
from tfsdeploy.hosts import hops
from tfsdeploy.hosts.hops import (
    Backoff,
    Gate,
    HandshakesRefused,
    Links,
    Sessions,
    handshake_refused,
)
from tfsdeploy.hosts.ssh import SshConnection

from .helpers import model

JUMP_KEY = ed25519.Ed25519PrivateKey.generate()
HOST_KEY = ed25519.Ed25519PrivateKey.generate()
BANNER_LOST = paramiko.SSHException("Error reading SSH protocol banner")


def private_pem(key: ed25519.Ed25519PrivateKey) -> str:
    return key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode()


def public_line(key: ed25519.Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


@dataclass
class Recorded:
    """A Backoff whose sleeps are recorded, not slept."""

    slept: list[float] = field(default_factory=list)

    def backoff(self, delays: tuple[float, ...] = (0.25, 0.5, 1.0)) -> Backoff:
        return Backoff(delays=delays, sleep=self.slept.append)


# -- the jump host as OpenSSH names it ---------------------------------------------------------

@pytest.mark.parametrize(("value", "hop"), [
    ("bastion.example", JumpHost("bastion.example", 22, None)),
    ("root@10.87.0.31", JumpHost("10.87.0.31", 22, "root")),
    ("ops@bastion:2222", JumpHost("bastion", 2222, "ops")),
    ("ops@[2001:db8::1]:22", JumpHost("2001:db8::1", 22, "ops")),
])
def test_a_jump_host_is_read_as_proxyjump_writes_it(value: str, hop: JumpHost) -> None:
    assert parse_jump(value) == hop


@pytest.mark.parametrize(("value", "problem"), [
    ("a,b", "names more than one hop"),
    ("root@", "neither an IP address nor a DNS name"),
    ("-oProxyCommand=x", "neither an IP address nor a DNS name"),
    ("b:0", "port outside 1-65535"),
    ("bad user@b", "user that is not a user name"),
    ("[10.0.0.1]", "not an IPv6 address"),
])
def test_a_jump_host_that_is_not_one_is_named_so(value: str, problem: str) -> None:
    assert problem in (jump_problem(value) or "")


# -- the pure parts, on fakes ------------------------------------------------------------------

def test_a_gate_never_lets_more_than_its_limit_through() -> None:
    gate, inside, seen = Gate(), [0], []
    lock = threading.Lock()

    def handshake(_: int) -> None:
        with gate.place(3):
            with lock:
                inside[0] += 1
                seen.append(inside[0])
            time.sleep(0.01)
            with lock:
                inside[0] -= 1

    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(handshake, range(24)))
    assert max(seen) == 3 and gate.peak == 3 and gate.held == 0


def test_a_refused_handshake_is_tried_again_after_growing_pauses() -> None:
    clock = Recorded()
    links = Links(backoff=clock.backoff())
    attempts: list[int] = []

    def connect() -> None:
        attempts.append(len(attempts))
        if len(attempts) < 3:
            raise BANNER_LOST

    links.handshake(("bastion", 22), 10, connect, what="tb5")
    assert len(attempts) == 3 and links.retried == 2
    assert 0.125 <= clock.slept[0] <= 0.375 and 0.25 <= clock.slept[1] <= 0.75


def test_a_handshake_refused_every_time_says_so_after_the_last_pause() -> None:
    clock = Recorded()
    links = Links(backoff=clock.backoff())

    def reset() -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    with pytest.raises(HandshakesRefused, match=r"tb5: the SSH server refused or reset the "
                       r"handshake 4 times .*fix: lower ssh_max_startups"):
        links.handshake(("bastion", 22), 10, reset, what="tb5")
    assert len(clock.slept) == 3


@pytest.mark.parametrize("answer", [
    paramiko.AuthenticationException("Authentication failed."),
    paramiko.ChannelException(2, "Connect failed"),
    ConnectionRefusedError(111, "Connection refused"),
    TimeoutError("timed out"),
])
def test_an_answer_is_never_tried_again(answer: Exception) -> None:
    clock = Recorded()
    links = Links(backoff=clock.backoff())

    def connect() -> None:
        raise answer

    with pytest.raises(type(answer)):
        links.handshake(("tb5", 22), 10, connect, what="tb5")
    assert clock.slept == [] and not handshake_refused(answer)


@dataclass
class FakeChannel:
    closed: bool = False


def test_sessions_wait_for_a_closed_channel_and_try_a_refused_open_again() -> None:
    clock = Recorded()
    sessions = Sessions(2, host="tb5", backoff=clock.backoff(), wait_s=5)
    first, second = sessions.open(FakeChannel), sessions.open(FakeChannel)
    opened: list[FakeChannel] = []
    refusals = [paramiko.ChannelException(2, "open failed")]

    def third() -> FakeChannel:
        if refusals:  # sshd frees a session a moment after the client sees it closed
            raise refusals.pop()
        return FakeChannel()

    waiter = threading.Thread(target=lambda: opened.append(sessions.open(third)))
    waiter.start()
    time.sleep(0.2)
    assert not opened and sessions.count() == 2  # the third waits for a place
    first.closed = True
    waiter.join(5)
    assert opened and sessions.count() == 2 and len(clock.slept) == 1 and not second.closed
    assert sessions.peak == 2


def test_a_session_never_freed_is_an_error_naming_the_bound() -> None:
    sessions = Sessions(3, host="tb5", wait_s=0.1)
    held = [sessions.open(FakeChannel) for _ in range(3)]
    assert not any(channel.closed for channel in held)
    with pytest.raises(HostUnreachable, match=r"tb5: no SSH session free in 0.1 s "
                       r"\(ssh_max_sessions 3 in use\)"):
        sessions.open(FakeChannel)


# -- the connection, against SSH servers that count what sshd limits ---------------------------

@dataclass
class Counts:
    """What a server saw: logins, handshakes in flight (as MaxStartups counts them: from the
    TCP connection to the login), sessions per connection (as MaxSessions), refusals."""

    unauthenticated: int = 0
    peak_unauthenticated: int = 0
    logins: int = 0
    dropped: int = 0
    peak_sessions: int = 0
    refused_sessions: int = 0
    forwards: list[tuple[str, int]] = field(default_factory=list)
    connections_open: int = 0


class FakeSshd:
    """A multi-client SSH server: any public key logs in after ``login_s``; ``exec`` of
    ``sleep S`` answers exit status 0 after S seconds; direct-tcpip channels are forwarded.
    Like sshd, it drops a connection (writing "Exceeded MaxStartups") while ``max_startups``
    are unauthenticated, and the first ``drop_first`` connections, and refuses a session
    channel beyond ``max_sessions`` on one connection."""

    def __init__(self, key: ed25519.Ed25519PrivateKey, address: str = "127.0.0.1", *,
                 max_startups: int = 1000, max_sessions: int = 1000, drop_first: int = 0,
                 login_s: float = 0.0) -> None:
        self.key = paramiko.Ed25519Key.from_private_key(io.StringIO(private_pem(key)))
        self.listener = socket.create_server((address, 0), backlog=128)
        self.address, self.port = address, self.listener.getsockname()[1]
        self.max_startups, self.max_sessions = max_startups, max_sessions
        self.drop_first, self.login_s = drop_first, login_s
        self.counts = Counts()
        self.lock = threading.Lock()
        self.transports: list[paramiko.Transport] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def known_line(self) -> str:
        key = HOST_KEY if self.key.asbytes() == _blob(HOST_KEY) else JUMP_KEY
        return f"[{self.address}]:{self.port} {public_line(key)}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _admit(self) -> bool:
        with self.lock:
            if self.drop_first > 0 or self.counts.unauthenticated >= self.max_startups:
                self.drop_first = max(0, self.drop_first - 1)
                self.counts.dropped += 1
                return False
            self.counts.unauthenticated += 1
            self.counts.connections_open += 1
            self.counts.peak_unauthenticated = max(self.counts.peak_unauthenticated,
                                                   self.counts.unauthenticated)
            return True

    def _serve(self, conn: socket.socket) -> None:
        if not self._admit():
            with contextlib.suppress(OSError):
                conn.sendall(b"Exceeded MaxStartups\r\n")
                conn.close()
            return
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.key)
        iface = _Interface(self, transport)
        with self.lock:
            self.transports.append(transport)
        try:
            transport.start_server(server=iface)
            threading.Thread(target=iface.collect, daemon=True).start()
            while transport.is_active():
                channel = transport.accept(0.2)
                if channel is not None:  # held: a channel object dropped closes its channel
                    iface.channels.append(channel)
                if channel is not None and channel.get_id() in iface.forwards:
                    target = socket.create_connection(iface.forwards[channel.get_id()])
                    for a, b in ((channel, target), (target, channel)):
                        threading.Thread(target=_pump, args=(a, b), daemon=True).start()
        except (paramiko.SSHException, EOFError, OSError):
            pass
        finally:
            transport.close()
            with self.lock:
                if not iface.logged_in:
                    self.counts.unauthenticated -= 1
                self.counts.connections_open -= 1

    def close(self) -> None:
        self.listener.close()
        for transport in self.transports:
            transport.close()


def _blob(key: ed25519.Ed25519PrivateKey) -> bytes:
    return paramiko.Ed25519Key.from_private_key(io.StringIO(private_pem(key))).asbytes()


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: FakeSshd, transport: paramiko.Transport) -> None:
        self.server = server
        self.transport = transport
        self.logged_in = False
        self.sessions: set[int] = set()
        self.forwards: dict[int, tuple[str, int]] = {}
        self.channels: list[paramiko.Channel] = []

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        time.sleep(self.server.login_s)
        with self.server.lock:
            if not self.logged_in:
                self.logged_in = True
                self.server.counts.unauthenticated -= 1
                self.server.counts.logins += 1
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind != "session":
            return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        with self.server.lock:
            if len(self.sessions) >= self.server.max_sessions:
                self.server.counts.refused_sessions += 1
                return paramiko.OPEN_FAILED_CONNECT_FAILED  # sshd's answer (serverloop.c)
            self.sessions.add(chanid)
            self.server.counts.peak_sessions = max(self.server.counts.peak_sessions,
                                                   len(self.sessions))
        return paramiko.OPEN_SUCCEEDED

    def free_closed(self) -> None:
        """Free the sessions of closed channels, as sshd's channel collection does after
        the packets it read with their close: never between an open and the close before
        it in the same read."""
        channels = self.transport._channels  # the fake's view of its own server side
        with self.server.lock:
            self.sessions = {c for c in self.sessions
                             if (chan := channels.get(c)) is not None and not chan.closed}

    def collect(self) -> None:
        while self.transport.is_active():
            time.sleep(0.02)
            self.free_closed()

    def check_global_request(self, kind: str, msg: paramiko.Message) -> bool:
        self.free_closed()  # read after the closes before it: they are collected first
        return False  # sshd answers a keepalive it does not know with a failure

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        self.forwards[chanid] = destination
        with self.server.lock:
            self.server.counts.forwards.append(destination)
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        seconds = float(command.split()[1]) if command.startswith(b"sleep ") else 0.0
        threading.Thread(target=self._finish, args=(channel, seconds), daemon=True).start()
        return True

    def _finish(self, channel: paramiko.Channel, seconds: float) -> None:
        time.sleep(seconds)
        with contextlib.suppress(OSError, EOFError):
            channel.send_exit_status(0)
            channel.shutdown_write()
        deadline = time.monotonic() + 10  # the client closes after the exit status
        while not channel.closed and time.monotonic() < deadline:
            time.sleep(0.005)
        channel.close()


def _pump(source: Any, sink: Any) -> None:
    with contextlib.suppress(OSError, EOFError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError, EOFError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def sshd(key: ed25519.Ed25519PrivateKey, address: str = "127.0.0.1",
         **limits: Any) -> Iterator[FakeSshd]:
    server = FakeSshd(key, address, **limits)
    try:
        yield server
    finally:
        server.close()


def hosts(tmp_path: Path, target: FakeSshd, count: int, *, known: list[str],
          **vars_: Any) -> list[ResolvedHost]:
    """``count`` inventory hosts, all reached at ``target`` (one key, one known-hosts file)."""
    key = tmp_path / "id_ed25519"
    if not key.exists():
        key.write_text(private_pem(ed25519.Ed25519PrivateKey.generate()))
        key.chmod(0o600)
    path = tmp_path / "known_hosts"
    path.write_text("".join(f"{line}\n" for line in known))
    checked = HostVars(ssh_port=target.port, ssh_key=str(key), ssh_known_hosts=str(path),
                       **vars_)
    return [ResolvedHost(f"tb{i}", target.address, (), (), checked) for i in range(count)]


def run_everywhere(conns: list[SshConnection], command: list[str]) -> list[bool]:
    with ThreadPoolExecutor(max_workers=len(conns)) as pool:
        return list(pool.map(lambda c: c.run(command).ok, conns))


def test_handshakes_to_one_hop_never_exceed_the_bound(tmp_path: Path) -> None:
    # 16 hosts at one address: one hop. The server drops a connection while 4 are
    # unauthenticated (as sshd past MaxStartups); bounded at 4, none is ever dropped
    links = Links(backoff=Recorded().backoff())
    with sshd(HOST_KEY, max_startups=4, login_s=0.05) as server:
        fleet = hosts(tmp_path, server, 16, known=[server.known_line()], ssh_max_startups=4)
        conns = [SshConnection(h, links=links) for h in fleet]
        try:
            assert run_everywhere(conns, ["true"]) == [True] * 16
        finally:
            for conn in conns:
                conn.close()
        assert server.counts.logins == 16 and server.counts.dropped == 0
        assert server.counts.peak_unauthenticated == 4 and links.retried == 0


def test_without_the_bound_the_same_server_drops_handshakes(tmp_path: Path) -> None:
    # the counter-proof of the test above: the fake server does drop, and the drops are
    # tried again until every host is in
    clock = Recorded()
    links = Links(backoff=clock.backoff(delays=(0.05,) * 20))
    links.backoff.sleep = time.sleep
    with sshd(HOST_KEY, max_startups=4, login_s=0.05) as server:
        fleet = hosts(tmp_path, server, 16, known=[server.known_line()], ssh_max_startups=16)
        conns = [SshConnection(h, links=links) for h in fleet]
        try:
            assert run_everywhere(conns, ["true"]) == [True] * 16
        finally:
            for conn in conns:
                conn.close()
        assert server.counts.dropped > 0 and links.retried == server.counts.dropped


def test_a_dropped_handshake_is_tried_again_and_the_host_is_reached(tmp_path: Path) -> None:
    clock = Recorded()
    links = Links(backoff=clock.backoff())
    with sshd(HOST_KEY, drop_first=2) as server:
        (host,) = hosts(tmp_path, server, 1, known=[server.known_line()])
        conn = SshConnection(host, links=links)
        try:
            assert conn.run(["true"]).ok
        finally:
            conn.close()
        assert server.counts.dropped == 2 and links.retried == 2 and len(clock.slept) == 2


def test_a_host_that_keeps_dropping_is_unreachable_with_the_fix(tmp_path: Path) -> None:
    links = Links(backoff=Recorded().backoff(delays=(0.0, 0.0)))
    with sshd(HOST_KEY, drop_first=100) as server:
        (host,) = hosts(tmp_path, server, 1, known=[server.known_line()])
        conn = SshConnection(host, links=links)
        with pytest.raises(HostUnreachable, match="refused or reset the handshake 3 times"):
            conn.run(["true"])
        assert server.counts.dropped == 3


def test_hosts_behind_a_jump_host_share_one_connection_to_it(tmp_path: Path) -> None:
    # the jump host as a bastion with OpenSSH's defaults: 10 startups, 10 sessions
    links = Links(backoff=Recorded().backoff())
    with sshd(JUMP_KEY, max_startups=10, max_sessions=10) as jump, \
            sshd(HOST_KEY, "127.0.0.2", login_s=0.02) as target:
        fleet = hosts(tmp_path, target, 24, known=[jump.known_line(), target.known_line()],
                      ssh_proxy_jump=f"root@127.0.0.1:{jump.port}", ssh_max_startups=6)
        conns = [SshConnection(h, links=links) for h in fleet]
        try:
            assert run_everywhere(conns, ["true"]) == [True] * 24
            assert jump.counts.logins == 1 and jump.counts.connections_open == 1
            assert jump.counts.forwards == [("127.0.0.2", target.port)] * 24
            assert target.counts.logins == 24 and target.counts.peak_unauthenticated <= 6
            assert links.gate(("127.0.0.1", jump.port)).peak <= 6
        finally:
            for conn in conns:
                conn.close()
        deadline = time.monotonic() + 10  # the last connection through it closed the hop
        while jump.counts.connections_open and time.monotonic() < deadline:
            time.sleep(0.05)
        assert jump.counts.connections_open == 0
        assert jump.counts.dropped == 0 and jump.counts.peak_sessions == 0


def commands_at_once(tmp_path: Path, server: FakeSshd, bound: int) -> tuple[int, Counts]:
    """40 commands from 20 threads over one connection whose sessions are bounded: the most
    it held open at once, and what the server saw."""
    (host,) = hosts(tmp_path, server, 1, known=[server.known_line()], ssh_max_sessions=bound)
    conn = SshConnection(host, links=Links())
    try:
        with ThreadPoolExecutor(max_workers=20) as pool:
            done = list(pool.map(lambda _: conn.run(["sleep", "0.05"]).ok, range(40)))
    finally:
        conn.close()
    assert done == [True] * 40
    return conn.sessions.peak, server.counts


def test_sessions_on_one_connection_never_exceed_the_bound(tmp_path: Path) -> None:
    # a server with MaxSessions 4, the connection bounded at 4
    with sshd(HOST_KEY, max_sessions=4) as server:
        peak, counts = commands_at_once(tmp_path, server, 4)
    assert peak == 4 and counts.peak_sessions == 4 and counts.logins == 1


def test_beyond_the_servers_sessions_the_refused_ones_are_tried_again(tmp_path: Path) -> None:
    # the counter-proof: bounded above the server's MaxSessions, the connection opens more
    # than the server allows; the server refuses them, each is tried again after a pause,
    # and every command still runs
    with sshd(HOST_KEY, max_sessions=4) as server:
        peak, counts = commands_at_once(tmp_path, server, 20)
    assert peak > 4 and counts.refused_sessions > 0 and counts.peak_sessions == 4


# -- the TCP connection under a login -----------------------------------------------------------

def test_a_host_is_dialled_with_nagle_off_before_its_first_byte(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what the socket's options were when it connected: Nagle set afterwards (the old
    # transport tuning) leaves the handshake's small messages waiting for delayed ACKs
    seen: list[int] = []
    connect = hops.TcpSocket.connect

    def recorded(sock: hops.TcpSocket, address: Any) -> None:
        seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        connect(sock, address)

    monkeypatch.setattr(hops.TcpSocket, "connect", recorded)
    with sshd(HOST_KEY) as server:
        (host,) = hosts(tmp_path, server, 1, known=[server.known_line()])
        conn = SshConnection(host, links=Links())
        try:
            assert conn.run(["true"]).ok
            assert isinstance(conn.transport().sock, hops.TcpSocket)
        finally:
            conn.close()
    assert len(seen) == 1 and seen[0] != 0


def test_a_jump_host_is_dialled_the_same_way(tmp_path: Path) -> None:
    with sshd(JUMP_KEY) as jump, sshd(HOST_KEY, "127.0.0.2") as target:
        (host,) = hosts(tmp_path, target, 1, known=[jump.known_line(), target.known_line()],
                        ssh_proxy_jump=f"root@127.0.0.1:{jump.port}")
        conn = SshConnection(host, links=Links())
        try:
            assert conn.run(["true"]).ok
            hop = conn._hop  # the shared jump connection this host went through
            assert hop is not None
            assert isinstance(hop.conn.client.get_transport().sock, hops.TcpSocket)
            assert isinstance(conn.transport().sock, paramiko.Channel)  # tunnelled
        finally:
            conn.close()


@pytest.mark.skipif(hops.QUICKACK is None, reason="TCP_QUICKACK is Linux's")
def test_every_read_acknowledges_at_once() -> None:
    # after a string of small exchanges Linux delays its ACKs (pingpong mode; getsockopt
    # TCP_QUICKACK reads 0 then); each read of ours asks for the next ACK at once again
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sock = hops.dial("127.0.0.1", listener.getsockname()[1], 5.0)
        peer, _ = listener.accept()
        with sock, peer:
            for _ in range(8):
                peer.sendall(b"ping")
                assert sock.recv(4) == b"ping"
                sock.sendall(b"pong")
                assert peer.recv(4) == b"pong"
            peer.sendall(b"last")
            assert sock.recv(4) == b"last"
            assert sock.getsockopt(socket.IPPROTO_TCP, hops.QUICKACK) == 1


def test_a_refused_port_is_said_as_paramiko_says_it(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    with pytest.raises(paramiko.ssh_exception.NoValidConnectionsError) as refused:
        hops.dial("127.0.0.1", port, 5.0)
    assert refused.value.errors.keys() == {("127.0.0.1", port)}
    assert str(refused.value) == f"[Errno None] Unable to connect to port {port} on 127.0.0.1"


# -- the inventory's settings ------------------------------------------------------------------

@pytest.mark.parametrize(("vars_", "said"), [
    ({"ssh_proxy_jump": "a@b,c@d"}, "vars.ssh_proxy_jump] names more than one hop"),
    ({"ssh_max_sessions": 2}, "ssh_max_sessions is 2: must be at least 3"),
    ({"ssh_max_startups": 0}, "ssh_max_startups is 0: must be at least 1"),
])
def test_a_bad_ssh_setting_is_a_located_problem(vars_: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        build_inventory("inv.py", hosts=[Host("h1", "10.0.0.1", vars=vars_)], groups={},
                        defaults={}, models=[model()])
    assert said in str(refused.value) and "h1" in str(refused.value)


def test_the_defaults_fit_openssh_defaults() -> None:
    # sshd_config(5): MaxStartups 10:30:100, MaxSessions 10
    assert (HostVars().ssh_max_startups, HostVars().ssh_max_sessions) == (10, 10)
