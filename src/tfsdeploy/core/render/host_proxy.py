"""The per-host traffic switch: HAProxy owns a model's stable ports and forwards each request to
the serving slot of each instance (pure: config, runtime commands, parsing of answers).

A switch is a handful of runtime-API commands (no reload): the new slot's server becomes
``ready``, the old one ``drain`` (in-flight requests finish, new ones go to the new slot), then
``maint`` once its current sessions reach zero. Servers are named ``i<instance>-<slot>``.

A change of the host's shape (instances added or removed) changes the proxy's servers, which
the runtime API cannot add: the configuration is rewritten and the proxy reloaded (see
``reload_plan``), and the runtime state the old process held (each server's state and weight)
is applied again to the new one (``restore_commands``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import (
    ADMIN_SOCKET_NAME,
    PROXY_ADMIN_MOUNT,
    SLOTS,
    Ports,
    other_slot,
    parse_server_name,
    server_name,
)
from tfsdeploy.core.render.files import _environment, templates_dir
from tfsdeploy.core.render.haproxy_stat import stat_int, stat_rows

BACKENDS = ("grpc", "rest")
FULL_WEIGHT = 100  # every server's weight in the config: a canary step of w % sets w / 100-w


@dataclass(frozen=True)
class PortMove:
    """What the proxy keeps of the ports a deploy moves (``port_offset``, ``grpc_port``,
    ``slot_ports`` changed): the old stable ports, still bound beside the new ones so that
    their clients keep being served (until the model's next deploy), and the servers whose
    containers still listen on their old ports (name -> gRPC and REST port)."""

    binds: tuple[tuple[int, int], ...] = ()
    servers: tuple[tuple[str, int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.binds or self.servers)


def render_proxy_config(host: ResolvedHost, model: Model, ports: Ports,
                        active: dict[int, str | None], moved: PortMove = PortMove()) -> str:
    """haproxy.cfg with each instance's ``active`` slot serving and its other slot disabled
    (both, for an instance that serves nothing yet); requests go round-robin across the
    instances' serving slots. ``moved``: the old ports a deploy that moves them keeps."""
    env = _environment(str(templates_dir()))
    kept = {name: (grpc, rest) for name, grpc, rest in moved.servers}
    servers = [(name, *kept.get(name, (ports.slot_grpc(slot, i), ports.slot_rest(slot, i))),
                slot == active[i])
               for i in sorted(active) for slot in SLOTS for name in [server_name(slot, i)]]
    return env.get_template("haproxy.cfg.j2").render(
        host=host, model=model, ports=ports, servers=servers, old_binds=moved.binds,
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
    status: str  # UP, UP 1/3, DOWN, DOWN 1/2, DRAIN, MAINT, MAINT (via rest/...), no check
    sessions: int  # current sessions (requests in flight, for HTTP/2 streams)
    weight: int
    # the weight last set (HAProxy 2.6's `uweight` column; `weight` is the effective one,
    # which a drained or stopped server does not follow): what a reload must set again
    user_weight: int = FULL_WEIGHT
    port: int = 0  # where it forwards (the `addr` column; 0: not reported)

    @property
    def takes_new_requests(self) -> bool:
        """Neither draining nor in maintenance nor failing its health check, and a weight
        above zero."""
        return self.ready and not self.down and self.weight > 0

    @property
    def ready(self) -> bool:
        """Its admin state is ready: neither draining nor in maintenance (whatever its
        health)."""
        return not self.status.upper().startswith(("MAINT", "DRAIN"))

    @property
    def down(self) -> bool:
        """Its health check fails (``DOWN``, ``DOWN 1/2`` while it comes back; ``NOLB``):
        HAProxy sends it no request whatever its admin state."""
        return self.status.upper().startswith(("DOWN", "NOLB"))

    @property
    def up(self) -> bool:
        """Ready and passing its health check (``UP``; ``UP 1/3`` while a check fails, before
        it is taken out; ``no check`` on a proxy written before servers were checked)."""
        return self.ready and not self.down


def parse_stat(stat_csv: str) -> tuple[ServerState, ...]:
    """Our servers in ``show stat`` CSV (other proxies and rows are ignored)."""
    found = []
    for row in stat_rows(stat_csv):
        parsed = parse_server_name(row.get("svname") or "")
        if parsed is None or row.get("pxname") not in BACKENDS:
            continue
        found.append(ServerState(backend=row["pxname"], instance=parsed[0], slot=parsed[1],
                                 status=row.get("status") or "",
                                 sessions=stat_int(row.get("scur")),
                                 weight=stat_int(row.get("weight"), default=1),
                                 user_weight=stat_int(row.get("uweight") or row.get("weight"),
                                                      default=FULL_WEIGHT),
                                 port=stat_int((row.get("addr") or "").rpartition(":")[2])))
    return tuple(found)


LISTENER_TYPE = "3"  # `show stat`'s type column: 0 frontend, 1 backend, 2 server, 3 listener


def parse_binds(stat_csv: str) -> dict[str, frozenset[int]]:
    """The ports the running worker listens on, per frontend (grpc, rest): the listener rows
    of ``show stat`` (``option socket-stats``; ``addr`` is ``address:port``). Empty when it
    reports none (a worker loaded on a configuration written before the option)."""
    binds: dict[str, set[int]] = {}
    for row in stat_rows(stat_csv):
        if row.get("type") != LISTENER_TYPE or row.get("pxname") not in BACKENDS:
            continue
        port = stat_int((row.get("addr") or "").rpartition(":")[2])
        if port:
            binds.setdefault(row["pxname"], set()).add(port)
    return {name: frozenset(ports) for name, ports in binds.items()}


def server_names(instances: Iterable[int]) -> frozenset[str]:
    """Every proxy server of ``instances`` (both slots of each)."""
    return frozenset(server_name(slot, i) for i in instances for slot in SLOTS)


def proxy_instances(servers: Iterable[ServerState]) -> frozenset[int]:
    """The instances a running proxy has servers for."""
    return frozenset(s.instance for s in servers)


def restore_commands(before: Iterable[ServerState], kept: frozenset[str]) -> list[str]:
    """Runtime commands that give the servers in ``kept`` the state and weight the old
    process held (``before``: its ``show stat``), server by server on each backend.

    A reload starts a new process from the configuration, whose servers are either enabled
    (weight 100) or ``disabled``; a drain or a canary's weights exist only at run time, so they
    are set again. Servers the old process lacked keep the configuration's state.
    """
    commands = []
    for server in before:
        name = server_name(server.slot, server.instance)
        if name not in kept:
            continue
        status = server.status.upper()
        state = ("maint" if status.startswith("MAINT") else
                 "drain" if status.startswith("DRAIN") else "ready")
        commands += [f"set server {server.backend}/{name} state {state}",
                     f"set server {server.backend}/{name} weight {server.user_weight}"]
    return commands


@dataclass(frozen=True)
class ConfigPorts:
    """The ports a proxy configuration names: what each frontend binds, where each backend's
    servers are."""

    binds: dict[str, frozenset[int]]  # frontend (grpc, rest) -> its ports
    servers: dict[tuple[str, str], int]  # (backend, server) -> port

    def server(self, name: str) -> tuple[int, int] | None:
        """A server's gRPC and REST ports (None: the configuration lacks it)."""
        grpc, rest = self.servers.get(("grpc", name)), self.servers.get(("rest", name))
        return (grpc, rest) if grpc is not None and rest is not None else None


def shape_digest(text: str) -> str:
    """The digest of a proxy configuration less its servers' runtime state: which slot of an
    instance serves (a server line's ``disabled``) is set on the admin socket, and the file is
    rewritten with it after each switch, so that a restarted proxy comes back on the same
    slots; everything else (servers, ports, binds, every setting) is what a worker loads. The
    running worker runs the file's configuration when the digest recorded after its start or
    its last reload (``HostPaths.proxy_loaded``) is this one."""
    shape = "\n".join(line.removesuffix(" disabled") if line.lstrip().startswith("server ")
                      else line for line in text.splitlines())
    return hashlib.sha256(shape.encode()).hexdigest()


def config_ports(text: str) -> ConfigPorts:
    """The ``bind`` ports of each frontend and each backend server's port of a configuration
    this toolkit wrote (lines it cannot read are skipped)."""
    binds: dict[str, set[int]] = {}
    servers: dict[tuple[str, str], int] = {}
    section = ""
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2:
            continue
        if words[0] in ("frontend", "backend"):
            section = words[1]
            continue
        if words[0] == "bind" or (words[0] == "server" and len(words) >= 3):
            port = words[1 if words[0] == "bind" else 2].rsplit(":", 1)[-1]
            if not (port.isascii() and port.isdigit()):
                continue
            if words[0] == "bind":
                binds.setdefault(section, set()).add(int(port))
            else:
                servers[(section, words[1])] = int(port)
    return ConfigPorts({k: frozenset(v) for k, v in binds.items()}, servers)


def parse_info_pid(answer: str) -> int | None:
    """The ``Pid:`` of ``show info`` (the worker process that answered), or None."""
    for line in answer.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Pid" and value.strip().isascii() and value.strip().isdigit():
            return int(value.strip())
    return None


def admin_errors(answer: str) -> list[str]:
    """Lines of an admin-socket answer that report a refused command."""
    return [line for line in answer.splitlines()
            if line.strip().lower().startswith(("unknown", "no such", "require", "invalid"))]
