"""Reaching the proxy's admin API on a host: its unix socket, in a root-only directory, driven
through the SSH exec channel (no TCP admin port, no port forwarding)."""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv


def admin(socket: str, timeout_s: float = 5.0) -> Argv:
    """Connect stdin/stdout to the admin socket (the commands go on stdin)."""
    return ["socat", "-t", f"{timeout_s:g}", "-", f"UNIX-CONNECT:{socket}"]
