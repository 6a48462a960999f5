"""The only place that talks SSH: run argument lists on a host, upload files, open tunnels.

Host keys are always checked: keys come from the host's ``ssh_known_hosts`` file (or the user's
~/.ssh/known_hosts), and an unknown or changed key refuses the connection.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tfsdeploy.errors import TfsDeployError
from tfsdeploy.inventory import ResolvedHost


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


class HostUnreachable(TfsDeployError):
    """SSH could not connect, authenticate, or verify the host key."""


class Runner(Protocol):
    """What the rollout needs from a host; tests pass a recording fake."""

    host: ResolvedHost

    def run(self, argv: list[str], *, timeout: float | None = None) -> Result:
        """Run ``argv`` on the host."""

    def put_bytes(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` on the host."""

    def put_file(self, local: str, path: str) -> None:
        """Upload a local file to ``path`` on the host."""

    def tunnel(self, port: int) -> socket.socket:
        """A socket connected to 127.0.0.1:``port`` on the host, through SSH."""

    def close(self) -> None:
        """Close the connection."""


def quiet_paramiko() -> None:
    """paramiko logs every refused tunnel; the gates report what matters instead."""
    import logging

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class SshRunner:
    """A Runner over one Fabric connection (opened lazily, reused for every command)."""

    def __init__(self, host: ResolvedHost, *, connect_timeout: float = 10.0) -> None:
        from fabric import Connection
        from paramiko import RejectPolicy

        quiet_paramiko()
        self.host = host
        v = host.vars
        kwargs: dict[str, Any] = {"allow_agent": v.ssh_key is None,
                                  "look_for_keys": v.ssh_key is None}
        if v.ssh_key:
            kwargs["key_filename"] = [v.ssh_key]
        self._conn = Connection(host.address, user=v.ssh_user, port=v.ssh_port,
                                connect_timeout=int(connect_timeout), connect_kwargs=kwargs)
        client = self._conn.client
        if v.ssh_known_hosts:
            client.load_host_keys(v.ssh_known_hosts)
        else:
            client.load_system_host_keys()
        client.set_missing_host_key_policy(RejectPolicy())

    def _open(self) -> None:
        if self._conn.is_connected:
            return
        try:
            self._conn.open()
        except Exception as exc:  # paramiko/socket errors all mean: this host is unreachable
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

    def run(self, argv: list[str], *, timeout: float | None = None) -> Result:
        """Run ``argv`` (quoted here, once) and capture its output.

        Every command has a deadline (``COMMAND_TIMEOUT_S`` unless given); a command whose
        connection died, or that exceeded its deadline, raises HostUnreachable.
        """
        from invoke.exceptions import CommandTimedOut

        self._open()
        limit = timeout or COMMAND_TIMEOUT_S
        try:
            out = self._conn.run(shlex.join(argv), hide=True, warn=True, in_stream=False,
                                 timeout=limit)
        except CommandTimedOut as exc:
            raise HostUnreachable(f"{self.host.name}: `{argv[0]} ...` gave no answer in "
                                  f"{limit:g} s") from exc
        except (OSError, EOFError) as exc:
            raise HostUnreachable(f"{self.host.name}: connection lost: {exc}") from exc
        if out.exited == -1:  # the channel closed without an exit status: the link died
            self._conn.close()
            raise HostUnreachable(f"{self.host.name}: connection lost during `{argv[0]}`")
        return Result(tuple(argv), out.exited, out.stdout, out.stderr)

    def put_bytes(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` over SFTP."""
        self._open()
        self._conn.put(io.BytesIO(data), path)

    def put_file(self, local: str, path: str) -> None:
        """Upload a local file over SFTP."""
        self._open()
        self._conn.put(str(Path(local)), path)

    def tunnel(self, port: int) -> socket.socket:
        """A direct-tcpip channel to the host's loopback (HAProxy's admin socket)."""
        self._open()
        transport = self._conn.client.get_transport()
        if transport is None:
            raise HostUnreachable(f"{self.host.name}: no SSH transport")
        channel = transport.open_channel("direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0),
                                         timeout=10)
        sock: socket.socket = channel  # a paramiko Channel behaves as a socket
        return sock

    def close(self) -> None:
        """Close the SSH connection."""
        self._conn.close()
