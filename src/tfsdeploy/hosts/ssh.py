"""The only place that talks SSH: one connection per host per run, for commands, files and the
Docker Engine.

Host keys are always checked, on the host and on every ProxyJump hop, before authentication,
as OpenSSH checks them (hostkeys.py): keys and CAs come from the host's ``ssh_known_hosts``
file (or the user's ~/.ssh/known_hosts), certificates signed by a ``@cert-authority`` are
accepted, and an unknown, changed or ``@revoked`` key refuses the connection. Commands are
argument lists quoted here, once. Files are written atomically and durably (a temporary name,
fsynced, then a rename, the directory fsynced). Docker Engine calls ride the same connection
(``dockerssh``): no second login, no port forwarding.

Through a jump host (``ssh_proxy_jump``, or ``ProxyJump`` in ~/.ssh/config), the process holds
one connection to the jump host for every host behind it. Handshakes are bounded per hop
(``ssh_max_startups``) and a refused or reset one is tried again after a pause; session
channels are bounded per connection (``ssh_max_sessions``): hops.py says why and how.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import select
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import paramiko
from fabric import Connection as FabricConnection

from tfsdeploy.core.errors import HostUnreachable, TfsDeployError
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.ssh.jump import parse_jump
from tfsdeploy.hosts.commands.files import write_file
from tfsdeploy.hosts.dockerapi import Docker, SdkDocker
from tfsdeploy.hosts.dockerssh import OPEN_TIMEOUT_S, POOL_SIZE, docker_client
from tfsdeploy.hosts.hops import (
    LINKS,
    HandshakesRefused,
    Hop,
    HopConnection,
    Links,
    Sessions,
    chain,
    first_endpoint,
    open_connection,
    session_refused,
    tune,
)
from tfsdeploy.hosts.hostkeys import USER_KNOWN_HOSTS, check_host_keys, read_known_hosts
from tfsdeploy.hosts.logins import PullLogins


@dataclass(frozen=True)
class Result:
    """What a command did."""

    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """Whether the command exited 0."""
        return self.code == 0

    def tail(self, lines: int = 5) -> str:
        """The last lines of stderr (or stdout), for error messages."""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return "\n".join(text[-lines:])


COMMAND_TIMEOUT_S = 120.0


class Connection(Protocol):
    """What a run needs of a host; the unit tests pass a recording fake."""

    host: ResolvedHost

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | None = None) -> Result:
        """Run ``argv`` on the host (``stdin`` fed to it, then closed)."""

    def put_bytes(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically (temporary name, then rename)."""

    def put_file(self, local: str, path: str) -> None:
        """Upload a local file to ``path``."""

    @property
    def docker(self) -> Docker:
        """The host's Docker Engine, over this connection."""

    def close(self) -> None:
        """Close the connection."""


def quiet_paramiko() -> None:
    """paramiko logs every refused channel; the gates report what matters instead."""
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class UploadFailed(TfsDeployError):
    """The host refused a file the toolkit uploaded (its volume full, a path it cannot
    write); the connection itself is fine."""


ConnectionFactory = Callable[[ResolvedHost], Connection]
"""How a run gets a host's connection (``SshConnection``; the unit tests pass a fake's)."""


class SshConnection:
    """A host's connection: one Fabric/paramiko transport, opened lazily, reused for every
    command, file and Docker call of the run; through the process's shared jump host when
    the host has one."""

    def __init__(self, host: ResolvedHost, *, connect_timeout: float = 10.0,
                 links: Links = LINKS) -> None:
        quiet_paramiko()
        self.host = host
        self._links = links
        v = host.vars
        kwargs: dict[str, Any] = {"allow_agent": v.ssh_key is None,
                                  "look_for_keys": v.ssh_key is None}
        if v.ssh_key:
            kwargs["key_filename"] = [v.ssh_key]
        self._conn = HopConnection(host.address, user=v.ssh_user, port=v.ssh_port,
                                   connect_timeout=int(connect_timeout),
                                   connect_kwargs=dict(kwargs))
        self._sessions = Sessions(v.ssh_max_sessions, host=host.name)
        self._hop: Hop | None = None
        self._joined = False
        self._opening = threading.Lock()
        # a known_hosts file that is missing or unreadable makes the host unreachable (as an
        # unknown key would), reported when the run first needs the host
        self._refused: HostUnreachable | None = None
        source = v.ssh_known_hosts or USER_KNOWN_HOSTS
        try:
            entries = read_known_hosts(v.ssh_known_hosts)
        except OSError as exc:
            self._refused = HostUnreachable(
                f"{host.name}: the known-hosts file {source} cannot be used "
                f"({type(exc).__name__}: {exc}); fix: point ssh_known_hosts at a readable file "
                "holding the host's key or its CA")
        else:
            def trust(conn: FabricConnection) -> None:  # every hop is checked strictly too
                for hop in chain(conn):
                    check_host_keys(hop.client, hop.connect_kwargs, entries, address=hop.host,
                                    port=hop.port, source=source)

            self._hop = self._shared_hop(kwargs, connect_timeout, source, trust)
            check_host_keys(self._conn.client, self._conn.connect_kwargs, entries,
                            address=self._conn.host, port=self._conn.port, source=source)
        self._sftp: Any = None
        self._docker: Docker | None = None

    def _shared_hop(self, kwargs: dict[str, Any], connect_timeout: float, source: str,
                    trust: Callable[[FabricConnection], None]) -> Hop | None:
        """The process's connection to the host's jump host: the inventory's
        ``ssh_proxy_jump`` (logging in with the host's key), else ~/.ssh/config's ProxyJump
        (as Fabric read it), else none."""
        jump = self.host.vars.ssh_proxy_jump
        if jump is not None:
            spec = parse_jump(jump)
            gateway = FabricConnection(spec.address, user=spec.user, port=spec.port,
                                       connect_timeout=int(connect_timeout),
                                       connect_kwargs=dict(kwargs))
        elif isinstance(self._conn.gateway, FabricConnection):
            gateway = self._conn.gateway
        else:
            return None
        hop = self._links.hop(gateway, source=source, prepare=trust)
        self._conn.gateway = hop.conn
        self._conn.hop = hop
        return hop

    @property
    def sessions(self) -> Sessions:
        """The bound on this connection's session channels (``peak``: the most held)."""
        return self._sessions

    def transport(self) -> Any:
        """The open paramiko Transport (connecting first if needed)."""
        return self._transport()

    def _transport(self) -> Any:
        if self._refused is not None:
            raise self._refused
        if not self._conn.is_connected:
            with self._opening:  # threads sharing the connection open it once
                if not self._conn.is_connected:
                    self._open()
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(f"{self.host.name}: the SSH connection is closed")
        return transport

    def _open(self) -> None:
        """Connect: the jump host first (once per process), then the host through it, the
        handshakes bounded per hop and a refused or reset one tried again."""
        hop, limit = self._hop, self.host.vars.ssh_max_startups
        if hop is not None and not self._joined:
            hop.join()
            self._joined = True
        where = f"{self.host.name} ({self.host.address})"
        try:
            self._links.handshake(first_endpoint(self._conn), limit, self._connect, what=where,
                                  before=None if hop is None else lambda: hop.open(limit))
        except HandshakesRefused:
            self._leave_hop()
            raise
        except Exception as exc:  # paramiko/socket errors all mean: this host is unreachable
            self._leave_hop()
            raise HostUnreachable(f"{where}: {type(exc).__name__}: {exc}") from exc
        tune(self._conn.client.get_transport())

    def _connect(self) -> None:
        try:
            open_connection(self._conn)
        except Exception:
            # a refused key leaves paramiko's transport thread and socket running
            # (SSHClient.connect raises without closing, and Fabric's close() does nothing
            # before open() succeeded); a shared hop stays for the other hosts
            self._conn.client.close()
            raise

    def _leave_hop(self) -> None:
        if self._hop is not None and self._joined:
            self._joined = False
            self._hop.leave()

    def _open_session(self, transport: Any) -> paramiko.Channel:
        """A session channel, once fewer than ``ssh_max_sessions`` are open. At the limit,
        the round trip that frees closed channels' places is OpenSSH's own keepalive
        (``keepalive@openssh.com`` with a reply, as ssh's ServerAliveInterval sends it:
        every server answers it, a failure reply included)."""
        return self._sessions.open(
            lambda: transport.open_session(timeout=OPEN_TIMEOUT_S),
            confirm=lambda: transport.global_request("keepalive@openssh.com", wait=True))

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | None = None) -> Result:
        """Run ``argv`` (quoted here, once) on an exec channel and capture its output.

        Every command has a deadline (``COMMAND_TIMEOUT_S`` unless given); a command whose
        connection died, or that exceeded its deadline, raises HostUnreachable.
        """
        limit = timeout or COMMAND_TIMEOUT_S
        transport = self._transport()
        try:
            channel = self._open_session(transport)
            # A command given no input reads /dev/null on the host, and no EOF is sent on its
            # channel: paramiko sends a channel's EOF after releasing the channel's lock
            # (Channel.shutdown), so the EOF of a command that ends at once can follow the
            # CLOSE that answers the host's, and OpenSSH ends the whole connection on a
            # packet naming a channel it has freed (channels.c: "ieof packet referred to
            # nonexistent channel"; every command of every thread on it is lost). ``exec``:
            # the login shell becomes the command, as it does for a command without a
            # redirection, so a command killed by a signal still ends its channel with the
            # signal (not the shell's "Killed" and exit 137).
            channel.exec_command(shlex.join(argv) if stdin is not None
                                 else f"exec {shlex.join(argv)} </dev/null")
            if stdin is not None:
                _send_input(channel, stdin)
                if not channel.closed:
                    channel.shutdown_write()
            out, err = _drain(channel, time.monotonic() + limit)
            code = channel.recv_exit_status() if channel.exit_status_ready() else -1
            channel.close()
        except TimeoutError:
            raise HostUnreachable(f"{self.host.name}: `{argv[0]} ...` gave no answer in "
                                  f"{limit:g} s") from None
        except (OSError, EOFError, Exception) as exc:
            if isinstance(exc, HostUnreachable):
                raise
            if session_refused(exc) and transport.is_active():  # the host said no
                raise HostUnreachable(
                    f"{self.host.name}: the host refused a session for `{argv[0]}` ({exc}); "
                    "fix: set ssh_max_sessions at most its sshd's MaxSessions") from exc
            self.close()
            raise HostUnreachable(f"{self.host.name}: connection lost during `{argv[0]}`: "
                                  f"{type(exc).__name__}: {exc}") from exc
        if code == -1:  # the channel closed without an exit status: the link died
            self.close()
            raise HostUnreachable(f"{self.host.name}: connection lost during `{argv[0]}`")
        return Result(tuple(argv), code, out.decode(errors="replace"),
                      err.decode(errors="replace"))

    def _sftp_client(self) -> Any:
        if self._sftp is None:
            try:
                channel = self._open_session(self._transport())
                channel.invoke_subsystem("sftp")
                self._sftp = paramiko.SFTPClient(channel)
            except HostUnreachable:
                raise
            except Exception as exc:
                raise HostUnreachable(f"{self.host.name}: SFTP: {exc}") from exc
        return self._sftp

    def put_bytes(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        """Write ``data`` to a temporary name beside ``path``, then rename it over ``path``,
        durably (``files.write_file``: the file and its directory fsynced before the rename,
        the directory after): a reader never sees half a file, a killed run or a power loss
        never leaves one."""
        result = self.run(write_file(path, mode=mode), stdin=data)
        if not result.ok:
            raise HostUnreachable(f"{self.host.name}: writing {path}: {result.tail()}")

    def put_file(self, local: str, path: str) -> None:
        """Upload a local file over SFTP. A failed upload over a live connection is the host's
        refusal (its volume full, say: SFTP then reports only a short file), said with the
        free space where it was written; over a lost one, the host is unreachable."""
        try:
            self._sftp_client().put(str(Path(local)), path)
        except OSError as exc:
            if not self._transport().is_active():
                raise HostUnreachable(f"{self.host.name}: uploading to {path}: {exc}") from exc
            why = self._upload_failure(local, path, exc)
            with contextlib.suppress(OSError):  # no partial file is left behind
                self._sftp_client().remove(path)
            raise UploadFailed(why) from exc

    def _upload_failure(self, local: str, path: str, error: OSError) -> str:
        """Why an upload failed, with the free space beside ``path`` when it is short."""
        need_kib = Path(local).stat().st_size // 1024 + 1
        where = posixpath.dirname(path) or "/"
        found = self.run(["df", "-Pk", where], timeout=30)
        fields = found.stdout.splitlines()[-1].split() if found.ok and found.stdout else []
        free = int(fields[3]) if len(fields) >= 4 and fields[3].isdigit() else None
        if free is not None and free < need_kib:
            return (f"{self.host.name}: no space left under {where} ({free} KiB free, "
                    f"{need_kib} KiB to upload): free space there (`fab prune`) or give the "
                    f"model's versions a larger volume")
        return f"{self.host.name}: uploading to {path} failed: {error}"

    @property
    def docker(self) -> Docker:
        """The host's Docker Engine through ``docker system dial-stdio`` on this connection."""
        if self._docker is None:
            logins = PullLogins(self.host.name, self.host.vars.pull_logins,
                                lambda argv, stdin: self.run(argv, stdin=stdin, timeout=30))
            transport = self._transport()
            # idle channels kept for reuse hold sessions too: leave room for a command and
            # an upload beside them
            client = docker_client(
                transport, pool_size=max(1, min(POOL_SIZE, self._sessions.limit - 2)),
                open_session=lambda: self._open_session(transport))
            self._docker = SdkDocker(client, self.host.name, logins)
        return self._docker

    def close(self) -> None:
        """Close the SFTP session and the SSH connection."""
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        self._sftp = None
        self._docker = None
        self._conn.close()
        self._leave_hop()


def _send_input(channel: Any, data: bytes) -> None:
    """Send a command's standard input. A command may end, and its channel close, before it
    reads all of it (socat when the socket it should write to is not there yet): that is the
    command's answer, read as usual from its exit status, not a lost connection. A dead link
    closes the channel too, but sends no exit status, which ``run`` reports."""
    try:
        channel.sendall(data)
    except OSError:
        if not channel.closed:
            raise


def _drain(channel: Any, deadline: float) -> tuple[bytes, bytes]:
    """Read a channel's stdout and stderr until the command ends, or raise TimeoutError."""
    out, err = bytearray(), bytearray()
    while True:
        while channel.recv_ready():
            out += channel.recv(65536)
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(65536)
        if channel.eof_received or channel.closed:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        select.select([channel], [], [], min(left, 1.0))
    while channel.recv_ready():
        out += channel.recv(65536)
    while channel.recv_stderr_ready():
        err += channel.recv_stderr(65536)
    if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
        raise TimeoutError
    return bytes(out), bytes(err)
