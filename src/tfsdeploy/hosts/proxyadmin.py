"""Talking to a host's proxy: runtime commands on its admin socket, through the host's SSH
connection (``socat`` on the host bridges the exec channel to the unix socket)."""

from __future__ import annotations

from collections.abc import Sequence

from tfsdeploy.core.inventory.layout import server_name
from tfsdeploy.core.render.host_proxy import (
    admin_errors,
    parse_info_pid,
    parse_stat,
    restore_commands,
)
from tfsdeploy.core.rollout.gates import Clock, Verdict, poll
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


# The proxy runs HAProxy in master-worker mode (`haproxy -W`, the entrypoint of the Debian
# based tfsdeploy-proxy image and of the official haproxy image), so its PID 1 is the master.
# HAProxy's management guide (doc/management.txt, "-W" and section 4 "Stopping and restarting
# HAProxy"; the commit that added the mode, haproxy mailing list msg26241): SIGUSR2 to the
# master re-reads the configuration and starts a new worker, and the master hands the
# listening sockets to it (the seamless reload, `-x`), so no connection is refused; the old
# worker soft-stops: it stops accepting, finishes what is in flight on its established
# connections (HTTP/2 clients get a GOAWAY and open their next connection to the new worker)
# and exits. Checked on HAProxy 2.6.12 (Debian 12): with `noreuseport` in `global` the reload
# succeeds, the new worker never binds the ports itself.
RELOAD_SIGNAL = "SIGUSR2"
CONFIG_CHECK = ["haproxy", "-c", "-q", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]


def worker_pid(conn: Connection, socket: str) -> int | None:
    """The pid of the worker that answers the admin socket (``show info``)."""
    return parse_info_pid(send(conn, socket, ["show info"]))


def reload(conn: Connection, socket: str, container: str, servers: frozenset[str], *,
           clock: Clock, deadline_s: float = 20.0) -> str:
    """Reload the proxy on the configuration its directory holds now, seamlessly, and give
    the servers it keeps the runtime state the old worker held.

    The configuration is checked inside the container first (``haproxy -c``): a refused one
    changes nothing. Then SIGUSR2 to the master; the reload is done when a new worker answers
    the admin socket with every server of ``servers``.
    """
    code, output = conn.docker.exec(container, CONFIG_CHECK)
    if code != 0:
        raise ProxyRefused(f"haproxy -c refused the new configuration: {output.strip()[-500:]}")
    before = parse_stat(stat(conn, socket))
    old_pid = worker_pid(conn, socket)
    conn.docker.kill(container, RELOAD_SIGNAL)

    def reloaded() -> Verdict:
        try:
            pid = worker_pid(conn, socket)
            if pid is None or pid == old_pid:
                return Verdict.wait(f"worker {old_pid} still answers")
            names = {server_name(s.slot, s.instance) for s in parse_stat(stat(conn, socket))}
        except ProxyRefused as error:  # the socket is re-bound by the new worker
            return Verdict.wait(str(error))
        missing = sorted(servers - names)
        return Verdict.wait(f"worker {pid} lacks {missing}") if missing else \
            Verdict.ok(f"worker {pid}")

    seen = poll(reloaded, step="reload_proxy", expected="a new worker with the new servers",
                deadline_s=deadline_s, clock=clock, interval_s=0.1, max_interval_s=0.5)
    restore = restore_commands(before, servers)
    if restore:
        send(conn, socket, restore)
    return f"reloaded: {seen.seen}; runtime state of {len(restore) // 2} server(s) applied again"
