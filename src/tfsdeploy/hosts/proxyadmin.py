"""Talking to a host's proxy: runtime commands on its admin socket, through the host's SSH
connection (``socat`` on the host bridges the exec channel to the unix socket)."""

from __future__ import annotations

from collections.abc import Sequence

from tfsdeploy.core.proxy import admin_errors
from tfsdeploy.hosts.commands.proxy import admin
from tfsdeploy.hosts.ssh import Connection


class ProxyRefused(RuntimeError):
    """The proxy refused a runtime command, or its admin socket did not answer."""


def send(conn: Connection, socket: str, commands: Sequence[str]) -> str:
    """Send ``commands`` in one session (``;``-separated) and return the answer."""
    result = conn.run(admin(socket), stdin=("; ".join(commands) + "\n").encode(), timeout=15)
    if not result.ok:
        raise ProxyRefused(f"the proxy's admin socket {socket} did not answer: "
                           f"{result.tail() or f'exit {result.code}'}")
    refused = admin_errors(result.stdout)
    if refused:
        raise ProxyRefused(f"HAProxy refused {list(commands)}: {'; '.join(refused)}")
    return result.stdout


def stat(conn: Connection, socket: str) -> str:
    """``show stat`` CSV."""
    return send(conn, socket, ["show stat"])
