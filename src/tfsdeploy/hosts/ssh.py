"""The only place that talks SSH: one connection per host per run, for commands, files and the
Docker Engine.

Host keys are always checked, on the host and on every ProxyJump hop, before authentication,
as OpenSSH checks them (hostkeys.py): keys and CAs come from the host's ``ssh_known_hosts``
file (or the user's ~/.ssh/known_hosts), certificates signed by a ``@cert-authority`` are
accepted, and an unknown, changed or ``@revoked`` key refuses the connection. Commands are
argument lists quoted here, once. Files are written atomically and durably (a temporary name,
fsynced, then a rename, the directory fsynced). Docker Engine calls ride the same connection
(``dockerssh``): no second login, no port forwarding.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import select
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fabric import Connection as FabricConnection

from tfsdeploy.core.errors import HostUnreachable, TfsDeployError
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.hosts.commands.files import write_file
from tfsdeploy.hosts.dockerapi import Docker, SdkDocker
from tfsdeploy.hosts.dockerssh import docker_client
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
KEEPALIVE_S = 5
USER_TIMEOUT_MS = 30_000


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


def _hops(conn: FabricConnection) -> list[FabricConnection]:
    """The connection and every ProxyJump hop it goes through."""
    chain = [conn]
    while isinstance(chain[-1].gateway, FabricConnection):
        chain.append(chain[-1].gateway)
    return chain


class UploadFailed(TfsDeployError):
    """The host refused a file the toolkit uploaded (its volume full, a path it cannot
    write); the connection itself is fine."""


ConnectionFactory = Callable[[ResolvedHost], Connection]
"""How a run gets a host's connection (``SshConnection``; the unit tests pass a fake's)."""


class SshConnection:
    """A host's connection: one Fabric/paramiko transport, opened lazily, reused for every
    command, file and Docker call of the run."""

    def __init__(self, host: ResolvedHost, *, connect_timeout: float = 10.0) -> None:
        quiet_paramiko()
        self.host = host
        v = host.vars
        kwargs: dict[str, Any] = {"allow_agent": v.ssh_key is None,
                                  "look_for_keys": v.ssh_key is None}
        if v.ssh_key:
            kwargs["key_filename"] = [v.ssh_key]
        self._conn = FabricConnection(host.address, user=v.ssh_user, port=v.ssh_port,
                                      connect_timeout=int(connect_timeout),
                                      connect_kwargs=kwargs)
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
            for hop in _hops(self._conn):  # every ProxyJump hop, strictly too
                check_host_keys(hop.client, hop.connect_kwargs, entries, address=hop.host,
                                port=hop.port, source=source)
        self._sftp: Any = None
        self._docker: Docker | None = None

    def transport(self) -> Any:
        """The open paramiko Transport (connecting first if needed)."""
        return self._transport()

    def _transport(self) -> Any:
        if self._refused is not None:
            raise self._refused
        if not self._conn.is_connected:
            try:
                self._conn.open()
            except Exception as exc:  # paramiko/socket errors all mean: this host is unreachable
                # a refused key leaves paramiko's transport thread and socket running
                # (SSHClient.connect raises without closing, and Fabric's close() does nothing
                # before open() succeeded): close every hop's client
                for hop in _hops(self._conn):
                    hop.client.close()
                raise HostUnreachable(f"{self.host.name} ({self.host.address}): "
                                      f"{type(exc).__name__}: {exc}") from exc
            # A host that vanishes without a reset (network down, machine off) must become an
            # error within seconds, not a read that blocks forever: SSH keepalives, and a TCP
            # user timeout on unacknowledged data.
            transport = self._conn.client.get_transport()
            if transport is not None:
                transport.set_keepalive(KEEPALIVE_S)
                with contextlib.suppress(OSError, AttributeError):
                    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                              USER_TIMEOUT_MS)
                # small requests must not wait for the host's delayed ACK (~40 ms each)
                with contextlib.suppress(OSError, AttributeError):
                    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(f"{self.host.name}: the SSH connection is closed")
        return transport

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | None = None) -> Result:
        """Run ``argv`` (quoted here, once) on an exec channel and capture its output.

        Every command has a deadline (``COMMAND_TIMEOUT_S`` unless given); a command whose
        connection died, or that exceeded its deadline, raises HostUnreachable.
        """
        limit = timeout or COMMAND_TIMEOUT_S
        transport = self._transport()
        try:
            channel = transport.open_session(timeout=10)
            channel.exec_command(shlex.join(argv))
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
                self._sftp = self._transport().open_sftp_client()
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
            self._docker = SdkDocker(docker_client(self._transport()), self.host.name, logins)
        return self._docker

    def close(self) -> None:
        """Close the SFTP session and the SSH connection."""
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        self._sftp = None
        self._docker = None
        self._conn.close()


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
