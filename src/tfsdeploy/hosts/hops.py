"""What a deploy machine opens at once over SSH, bounded to fit OpenSSH's defaults: handshakes
per hop, session channels per connection, one connection per jump host.

A bastion with OpenSSH's defaults drops new connections at random once 10 are unauthenticated
(``MaxStartups 10:30:100``: sshd.c ``should_drop_connection`` from the 10th, with probability
30% rising to 100% at 100; the drop writes "Exceeded MaxStartups" and closes, 9.2
``drop_connection``), and refuses an 11th session channel on one connection (``MaxSessions
10``: session.c ``session_new`` returns NULL, serverloop.c answers the open with
SSH2_OPEN_CONNECT_FAILED "open failed"). A tool that connects to every host at once through
one bastion loses hosts past about ten. So:

- a jump host is connected to once per process and shared by every host behind it (``Hop``):
  N hosts cost the bastion one login and N ``direct-tcpip`` channels, which MaxSessions does
  not count (sshd_config(5): "MaxSessions 0 ... still permitting forwarding"; serverloop.c
  opens direct-tcpip channels without a session);
- handshakes, from the TCP connection to the login, are bounded per hop (``Gate``): the jump
  host's own and those of the hosts it carries, or a host's own when it has none; at most
  ``ssh_max_startups`` at once (default 10: below MaxStartups' start nothing is dropped);
- a handshake the server refused or reset (no protocol banner read, a reset, an early end of
  stream) is tried again after a growing pause with jitter (``Backoff``), in case another
  client filled the server's startups meanwhile;
- session channels on one connection are bounded (``Sessions``, ``ssh_max_sessions``), and
  an open the server refused is tried again: sshd frees a session only after its channel is
  closed on both sides and its command ended (session.c ``session_close_by_channel``), a
  moment after the client sees the channel closed.

One ``Links`` serves the whole process (``LINKS``): a hop's sshd counts this process's
handshakes whichever run made them; the unit tests pass their own.
"""

from __future__ import annotations

import contextlib
import errno
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import paramiko
from fabric import Connection as FabricConnection

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.hosts.hostkeys import HostKeyRefused

Endpoint = tuple[str, int]
CHANNEL_OPEN_TIMEOUT_S = 10.0
SESSION_WAIT_S = 120.0
KEEPALIVE_S = 5
USER_TIMEOUT_MS = 30_000


class HandshakesRefused(HostUnreachable):
    """Every attempt of a handshake was refused or reset by the server."""


@dataclass
class Backoff:
    """The pauses between attempts of a refused handshake or session: ``delays`` in turn,
    each scaled by a random factor in [1 - jitter, 1 + jitter] so that clients refused
    together do not come back together."""

    delays: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    jitter: float = 0.5
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def pauses(self) -> Iterator[float]:
        """The pauses, one per retry."""
        for delay in self.delays:
            yield delay * self.rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)


def handshake_refused(error: BaseException) -> bool:
    """Whether ``error`` is a server refusing or resetting a connection before the login:
    paramiko reads no protocol banner (sshd's MaxStartups drop closes the connection after
    its notice; transport.py ``_check_banner``), or the stream is reset or ends. A refused
    host key, a refused login or a closed port are answers, never retried."""
    if isinstance(error, HostKeyRefused | paramiko.AuthenticationException
                  | paramiko.ChannelException | HandshakesRefused):
        return False
    if isinstance(error, ConnectionResetError | EOFError | BrokenPipeError):
        return True
    text = str(error)
    return isinstance(error, paramiko.SSHException) and (
        text.startswith("Error reading SSH protocol banner") or "Connection reset" in text)


def session_refused(error: BaseException) -> bool:
    """Whether opening a channel failed because the server said no. paramiko keeps the
    refusal (a ChannelException) in one place per transport and the first thread to look
    takes it, so a thread opening beside another may see only "Unable to open channel."
    (transport.py ``open_channel``, ``get_exception``)."""
    return isinstance(error, paramiko.ChannelException) or (
        isinstance(error, paramiko.SSHException) and str(error) == "Unable to open channel.")


class Gate:
    """Places held at once: each asker waits until fewer than its own ``limit`` are held
    (hosts behind one hop may set different limits). ``peak`` is the most held at once."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.held = 0
        self.peak = 0

    @contextlib.contextmanager
    def place(self, limit: int) -> Iterator[None]:
        """Hold a place while the block runs."""
        with self._changed:
            self._changed.wait_for(lambda: self.held < limit)
            self.held += 1
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._changed:
                self.held -= 1
                self._changed.notify_all()


class Links:
    """A process's hops and its handshake gates, one gate per hop."""

    def __init__(self, *, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._lock = threading.Lock()
        self._gates: dict[Endpoint, Gate] = {}
        self._hops: dict[tuple[Any, ...], Hop] = {}
        self.retried = 0  # handshakes refused or reset, then tried again

    def gate(self, endpoint: Endpoint) -> Gate:
        """The handshake gate of ``endpoint`` (a first hop)."""
        with self._lock:
            return self._gates.setdefault(endpoint, Gate())

    def hop(self, conn: FabricConnection, *, source: str,
            prepare: Callable[[FabricConnection], None]) -> Hop:
        """The process's shared hop for the jump connection ``conn`` describes (``conn``
        itself the first time: ``prepare`` then sets its host-key checks), keyed by who logs
        in where, with which keys, trusting which known-hosts file, through which hops."""
        key = (source, *(_identity(c) for c in chain(conn)))
        with self._lock:
            found = self._hops.get(key)
            if found is None:
                prepare(conn)
                found = self._hops[key] = Hop(conn, links=self)
            return found

    def handshake(self, endpoint: Endpoint, limit: int, connect: Callable[[], None], *,
                  what: str, before: Callable[[], None] | None = None) -> None:
        """``connect`` while holding a place of ``endpoint``'s gate; a refused or reset
        attempt is tried again after a pause (``before`` runs first each time, outside the
        place: the jump host's own handshake takes a place of its own)."""
        pauses = self.backoff.pauses()
        while True:
            try:
                if before is not None:
                    before()
                with self.gate(endpoint).place(limit):
                    connect()
                return
            except Exception as error:
                pause = next(pauses, None) if handshake_refused(error) else None
                if pause is None:
                    if handshake_refused(error):
                        raise HandshakesRefused(
                            f"{what}: the SSH server refused or reset the handshake "
                            f"{len(self.backoff.delays) + 1} times ({error or type(error)}); "
                            "fix: lower ssh_max_startups, or raise the server's MaxStartups"
                        ) from error
                    raise
            with self._lock:
                self.retried += 1
            self.backoff.sleep(pause)


def chain(conn: FabricConnection) -> list[FabricConnection]:
    """``conn`` and every hop behind it, the first one connected to last."""
    found = [conn]
    while isinstance(found[-1].gateway, FabricConnection):
        found.append(found[-1].gateway)
    return found


def first_endpoint(conn: FabricConnection) -> Endpoint:
    """Where the deploy machine's TCP connection for ``conn`` goes: its first hop."""
    first = chain(conn)[-1]
    return first.host, int(first.port)


def _identity(conn: FabricConnection) -> tuple[Any, ...]:
    keys = conn.connect_kwargs.get("key_filename") or ()
    return (conn.user, conn.host, int(conn.port),
            tuple([keys] if isinstance(keys, str) else keys))


class Hop:
    """One jump host connection, shared by every host behind it: opened on first need (its
    handshake bounded and retried like any), closed when the last connection through it
    closes."""

    def __init__(self, conn: FabricConnection, *, links: Links) -> None:
        self.conn = conn
        self._links = links
        self._lock = threading.Lock()
        self.users = 0
        self.logins = 0  # times this hop was connected to

    @property
    def name(self) -> str:
        """``user@host:port`` of the jump host."""
        return f"{self.conn.user}@{self.conn.host}:{self.conn.port}"

    def join(self) -> None:
        """A connection will go through this hop."""
        with self._lock:
            self.users += 1

    def leave(self) -> None:
        """A connection through this hop closed; the last one closes the hop."""
        with self._lock:
            self.users = max(0, self.users - 1)
            if self.users == 0 and self.conn.is_connected:
                self.conn.close()

    def open(self, limit: int) -> None:
        """Connect to the jump host unless connected (at most ``limit`` handshakes at once
        through it)."""
        with self._lock:
            if self.conn.is_connected:
                return
            self._links.handshake(first_endpoint(self.conn), limit, self._connect,
                                  what=f"jump host {self.name}")
            self.logins += 1

    def _connect(self) -> None:
        try:
            open_connection(self.conn)
        except Exception:
            # a refused key or a dropped connection leaves paramiko's transport thread and
            # socket running (SSHClient.connect raises without closing them)
            for each in chain(self.conn):
                each.client.close()
            raise
        tune(self.conn.client.get_transport())

    def channel_to(self, address: str, port: int) -> paramiko.Channel:
        """A ``direct-tcpip`` channel to ``address:port`` through the open jump host. A hop
        that lost its connection meanwhile raises ConnectionResetError (the caller tries
        again, reconnecting it); a refusal by the jump host (the host down, forwarding not
        allowed) raises what paramiko raised."""
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionResetError(f"the jump host {self.name} closed the connection")
        try:
            channel: paramiko.Channel = transport.open_channel(
                "direct-tcpip", dest_addr=(address, port), src_addr=("", 0),
                timeout=CHANNEL_OPEN_TIMEOUT_S)
        except (paramiko.SSHException, EOFError, OSError) as error:
            if isinstance(error, paramiko.ChannelException) or transport.is_active():
                raise
            raise ConnectionResetError(
                f"the jump host {self.name} closed the connection") from error
        return channel


QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class TcpSocket(socket.socket):
    """The deploy machine's TCP connection to an SSH server, made by ``dial``: Nagle off from
    its first byte, and each segment received acknowledged at once (TCP_QUICKACK, which Linux
    clears as it goes: set again after every read; where the system has no such option, its
    delayed ACKs stay).

    Why: an SSH login is a string of small messages each waiting on the other side's.
    paramiko sends the service request right behind its NEWKEYS, and with Nagle on it waited
    for the server's ACK of NEWKEYS, which the server delays (40 ms on Linux). sshd keeps Nagle
    on until a session starts (OpenSSH packet.c ``ssh_packet_set_interactive`` calls
    ``set_nodelay``, from session.c); after the login it sends its host keys
    (``hostkeys-00@openssh.com``, sshd.c ``notify_hostkeys``), so its answer to the first
    channel open waited for our delayed ACK of those. Measured on the testbed
    (``benchmarks/bench_ssh_connect.py``): a new connection and its first command took a
    median 120 ms with paramiko's own socket, about 40 ms over this one."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if QUICKACK is not None:
            with contextlib.suppress(OSError):
                self.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        return data


def dial(host: str, port: int, timeout: float | None) -> TcpSocket:
    """A TCP connection to ``host:port`` for an SSH login, as paramiko's SSHClient.connect
    makes one (each stream address ``getaddrinfo`` gives, in turn; when every one refuses or
    cannot be reached, paramiko's NoValidConnectionsError naming each; any other error as
    raised), but a ``TcpSocket`` with its options set before the first byte."""
    infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    addresses = [(i[0], i[4]) for i in infos if i[1] == socket.SOCK_STREAM] \
        or [(i[0], i[4]) for i in infos]
    failures: dict[tuple[Any, ...], Exception] = {}
    for family, address in addresses:
        sock = TcpSocket(family, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as error:
            sock.close()
            if error.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                raise
            failures[address] = error
        except BaseException:
            sock.close()
            raise
    raise paramiko.ssh_exception.NoValidConnectionsError(failures)


def open_connection(conn: FabricConnection) -> None:
    """``conn.open()``; a connection that goes straight to its host goes over a socket of
    ours (``dial``), one through a gateway over the gateway's channel."""
    if conn.gateway:
        conn.open()
        return
    sock = dial(conn.host, int(conn.port), conn.connect_timeout)
    conn.connect_kwargs["sock"] = sock
    try:
        conn.open()
    except BaseException:
        sock.close()
        raise
    finally:
        conn.connect_kwargs.pop("sock", None)


def tune(transport: paramiko.Transport | None) -> None:
    """A connection that vanishes without a reset (network down, machine off) must become an
    error within seconds, not a read that blocks forever: SSH keepalives, and a TCP user
    timeout on unacknowledged data. Small requests must not wait for the peer's delayed ACK
    (~40 ms each): no Nagle. A connection tunnelled through a hop has a channel for a socket:
    its hop's socket carries the settings."""
    if transport is None:
        return
    transport.set_keepalive(KEEPALIVE_S)
    sock = transport.sock
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HopConnection(FabricConnection):  # type: ignore[misc]
    """A Fabric connection whose gateway channel comes from its shared ``Hop``."""

    hop: Hop | None = None

    def open_gateway(self) -> Any:
        """The channel to this host through the shared hop (Fabric's own would open the
        gateway again from each thread)."""
        if self.hop is None:
            return super().open_gateway()
        return self.hop.channel_to(self.host, int(self.port))


class Sessions:
    """Session channels open at once on one connection: at most ``limit``.

    A channel holds its place until it is closed (by either side) and the server has seen the
    close: sshd frees a session in its channel collection after the packets it read with
    the close (serverloop.c: ``process_input``, then ``channel_prepare_poll`` collecting dead
    channels), so an open sent right behind a close can be refused though the client counts
    a free place. At the limit, one round trip (``confirm``: a request the server answers
    after the closes sent before it) frees every closed channel's place at once. An open the
    server still refused (a close another thread had not sent yet when the round trip left;
    a command that outlived its channel, which holds its session until it ends) is tried
    again after a pause (``backoff``), then raises."""

    def __init__(self, limit: int, *, host: str, backoff: Backoff | None = None,
                 wait_s: float = SESSION_WAIT_S) -> None:
        self.limit = limit
        self.host = host
        self.backoff = backoff or Backoff(delays=(0.05, 0.1, 0.2, 0.4, 0.8, 1.6))
        self.wait_s = wait_s
        self._changed = threading.Condition()
        self._held: list[weakref.ref[paramiko.Channel]] = []
        self._opening = 0
        self.peak = 0
        self.confirmed = 0  # round trips made at the limit

    def count(self) -> int:
        """Channels open, or closed and not yet seen closed by the server, or being opened."""
        with self._changed:
            return len(self._held) + self._opening

    def open(self, opener: Callable[[], paramiko.Channel],
             confirm: Callable[[], object] | None = None) -> paramiko.Channel:
        """A new session channel by ``opener``, once fewer than ``limit`` are held.
        ``confirm`` makes the round trip (None: a closed channel is free at once)."""
        self._take_place(confirm)
        try:
            channel = self._open_refused_again(opener)
        except BaseException:
            with self._changed:
                self._opening -= 1
                self._changed.notify_all()
            raise
        with self._changed:
            self._opening -= 1
            self._held.append(weakref.ref(channel))
        return channel

    def _closed(self) -> list[weakref.ref[paramiko.Channel]]:
        return [ref for ref in self._held if (chan := ref()) is None or chan.closed]

    def _take_place(self, confirm: Callable[[], object] | None) -> None:
        deadline = time.monotonic() + self.wait_s
        with self._changed:
            while len(self._held) + self._opening >= self.limit:
                closed = self._closed()
                if closed:
                    self._release(closed, confirm)
                    continue
                if time.monotonic() > deadline:
                    raise HostUnreachable(
                        f"{self.host}: no SSH session free in {self.wait_s:g} s "
                        f"(ssh_max_sessions {self.limit} in use)")
                # channels close on paramiko's own thread, unannounced: look every 20 ms
                self._changed.wait(0.02)
            self._opening += 1
            self.peak = max(self.peak, len(self._held) + self._opening)

    def _release(self, closed: list[weakref.ref[paramiko.Channel]],
                 confirm: Callable[[], object] | None) -> None:
        """Free ``closed`` once the server has seen them closed (holding the lock: one
        round trip serves every waiter)."""
        if confirm is not None:
            with contextlib.suppress(Exception):  # a dead connection fails the next open
                confirm()
            self.confirmed += 1
        self._held = [ref for ref in self._held if ref not in closed]
        self._changed.notify_all()

    def _open_refused_again(self, opener: Callable[[], paramiko.Channel]) -> paramiko.Channel:
        pauses = self.backoff.pauses()
        while True:
            try:
                return opener()
            except paramiko.SSHException as error:
                pause = next(pauses, None) if session_refused(error) else None
                if pause is None:
                    raise
            self.backoff.sleep(pause)


LINKS = Links()
"""The process's hops and gates (see the module's docstring)."""
