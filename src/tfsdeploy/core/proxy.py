"""The per-host traffic switch: HAProxy owns a model's stable ports and forwards each request to
the serving slot of each instance (pure: config, runtime commands, parsing of answers).

A switch is a handful of runtime-API commands (no reload): the new slot's server becomes
``ready``, the old one ``drain`` (in-flight requests finish, new ones go to the new slot), then
``maint`` once its current sessions reach zero. Servers are named ``i<instance>-<slot>``.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from tfsdeploy.core.catalog import Model
from tfsdeploy.core.fleet import ResolvedHost
from tfsdeploy.core.layout import (
    ADMIN_SOCKET_NAME,
    PROXY_ADMIN_MOUNT,
    SLOTS,
    Ports,
    other_slot,
    parse_server_name,
    server_name,
)
from tfsdeploy.core.render import _environment, templates_dir

BACKENDS = ("grpc", "rest")
FULL_WEIGHT = 100  # every server's weight in the config: a canary step of w % sets w / 100-w


def render_proxy_config(host: ResolvedHost, model: Model, ports: Ports,
                        active: dict[int, str | None]) -> str:
    """haproxy.cfg with each instance's ``active`` slot serving and its other slot disabled
    (both, for an instance that serves nothing yet); requests go round-robin across the
    instances' serving slots."""
    env = _environment(str(templates_dir()))
    servers = [(server_name(slot, i), ports.slot_grpc(slot, i), ports.slot_rest(slot, i),
                slot == active[i]) for i in sorted(active) for slot in SLOTS]
    return env.get_template("haproxy.cfg.j2").render(
        host=host, model=model, ports=ports, servers=servers,
        admin_socket=f"{PROXY_ADMIN_MOUNT}/{ADMIN_SOCKET_NAME}")


def set_state(instance: int, slot: str, state: str) -> list[str]:
    """Runtime commands: one server's state (ready, drain, maint) on both backends."""
    return [f"set server {b}/{server_name(slot, instance)} state {state}" for b in BACKENDS]


def switch_commands(instance: int, new: str, old: str | None) -> list[str]:
    """Send new requests of ``instance`` to slot ``new`` and start draining ``old``.

    With no live old release (its container died), the other slot goes straight to
    maintenance so that no request is sent to a dead server.
    """
    if old:
        return set_state(instance, new, "ready") + set_state(instance, old, "drain")
    return set_state(instance, new, "ready") + set_state(instance, other_slot(new), "maint")


def weight_commands(instance: int, slot: str, weight: int) -> list[str]:
    """Runtime commands: one server's weight (0..256) on both backends."""
    return [f"set server {b}/{server_name(slot, instance)} weight {weight}" for b in BACKENDS]


@dataclass(frozen=True)
class ServerState:
    """One backend server as ``show stat`` reports it."""

    backend: str
    instance: int
    slot: str
    status: str  # UP, DRAIN, MAINT, no check ...
    sessions: int  # current sessions (requests in flight, for HTTP/2 streams)
    weight: int

    @property
    def takes_new_requests(self) -> bool:
        """Neither draining nor in maintenance, and a weight above zero."""
        return not self.status.upper().startswith(("MAINT", "DRAIN")) and self.weight > 0


def parse_stat(stat_csv: str) -> tuple[ServerState, ...]:
    """Our servers in ``show stat`` CSV (other proxies and rows are ignored)."""
    rows = csv.DictReader(io.StringIO(stat_csv.lstrip("# ")))
    found = []
    for row in rows:
        parsed = parse_server_name(row.get("svname") or "")
        if parsed is None or row.get("pxname") not in BACKENDS:
            continue
        found.append(ServerState(backend=row["pxname"], instance=parsed[0], slot=parsed[1],
                                 status=row.get("status") or "", sessions=_int(row.get("scur")),
                                 weight=_int(row.get("weight"), default=1)))
    return tuple(found)


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(text or default)
    except ValueError:
        return default


def admin_errors(answer: str) -> list[str]:
    """Lines of an admin-socket answer that report a refused command."""
    return [line for line in answer.splitlines()
            if line.strip().lower().startswith(("unknown", "no such", "require", "invalid"))]
