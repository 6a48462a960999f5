"""HAProxy's configuration for a gateway host, rendered from the inventory (pure), the
gateway's place on its hosts, and the runtime commands that take a serving host out of its
rotation.

Upstream facts the file relies on (HAProxy 2.6's doc/configuration.txt, the version of the
proxy image, Debian 12's haproxy 2.6.12):
- ``server ... proto h2`` speaks HTTP/2 cleartext (h2c) to the backend, what TFServing's gRPC
  port takes; ``check-proto h1`` makes the health check HTTP/1.1 to the REST port
  (``check port``) whatever the server's protocol (section 5.2, ``check-proto``: h1, h2, fcgi).
- ``http-reuse always`` lets any request, a client's first too, take an idle connection of
  its server; on an h2 server many streams share one connection (section 4, ``http-reuse``).
  Idle connections are closed half at a time every ``pool-purge-delay`` (default 5 s), and
  a connection between two requests is idle: the default 5 s would replace the gateway's
  connection to each host every few seconds under a load that leaves gaps between requests
  (measured on 2.6.12: a purge delay of 60 s replaced it at 60 s, of 10 s at 10 s and 20 s).
  ``backend_idle_ms`` (1 h) is that delay.
- The check: ``option httpchk`` + ``http-check send meth GET uri /v1/models/<model>``,
  ``http-check expect rstring`` on the JSON's ``"state": "AVAILABLE"``. TFServing's REST
  status answers 200 before a version is ready, and its gRPC health service
  (``--enable_grpc_healthcheck_service``) SERVING from start-up with no model check: the model
  state is the only proof of service.
- ``fall`` (2 by default) with ``inter``/``fastinter``/``downinter`` of one interval: that
  many failed checks in a row take the host out; ``observe layer4 error-limit 1 on-error
  mark-down`` takes it out at the first failed connection of live traffic, before its next
  check (section 5.2 ``observe``, ``on-error``).
- Fail-open: ``nbsrv(<backend>)`` is the number of its usable servers (UP and not draining:
  section 7.3.2 ``nbsrv``); while the checked gRPC backend has none, both frontends use the
  ``-open`` twins, the same servers with no check (their ``show stat`` status is "no check").
  A refused connection is retried after min(``timeout connect``, 1 s) (section 4.2
  ``retries``), on another server with ``option redispatch``.
- A server's health starts at ``rise`` when a worker starts (src/server.c, ``health = rise``),
  and a failed check below ``rise + fall - 1`` ... ``rise`` drops it to 0, DOWN (src/check.c,
  ``check_notify_failure``): without the previous worker's states every reload would leave
  each host one failed check from DOWN. ``server-state-file`` + ``load-server-state-from-file
  global`` give the new worker the states of ``show servers state`` (version 1; its fields in
  include/haproxy/server-t.h ``SRV_STATE_FILE_FIELD_NAMES``) before it takes traffic; a line
  also sets the server's port and check port (src/server_state.c ``srv_state_srv_update``), so
  only the lines of servers whose address and ports the new file keeps are written
  (``kept_server_state``).
- A gRPC error from the gateway itself must be gRPC's Trailers-Only response (grpc
  doc/PROTOCOL-HTTP2.md: ``:status 200``, ``content-type: application/grpc``, ``grpc-status``
  and ``grpc-message`` in one HEADERS frame that ends the stream). ``http-request return``
  cannot build it from arguments: without a payload it ignores ``content-type``, ``hdr``
  never sets one (HAProxy 2.6 warns "header 'content-type' always ignored by the http
  reply"), and ``string`` refuses an empty payload. An ``errorfile`` (a whole HTTP response,
  status 200 allowed) carries every header as written, and with ``Content-Length: 0`` the
  HTTP/2 side sends headers only. Checked with grpc-python against HAProxy 2.6.12:
  RESOURCE_EXHAUSTED with its message. REST answers 429 with TFServing's ``{"error": ...}``.
- The rate limit counts the requests let through (``sc-inc-gpc0`` after the refusal rule,
  ``gpc0_rate(1s)``), not all requests: counting the refused ones too (``http_req_rate``)
  would refuse everything once clients send twice the limit.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.layout import (
    ADMIN_SOCKET_NAME,
    PROXY_ADMIN_MOUNT,
    host_port,
    model_ports,
)
from tfsdeploy.core.inventory.load import Inventory
from tfsdeploy.core.render.files import _environment, templates_dir
from tfsdeploy.core.render.haproxy_stat import stat_int, stat_rows
from tfsdeploy.core.rollout.records import GatewayDrain

GATEWAY_CONTAINER = "tfs-gateway"
GATEWAY_FILE = "haproxy.cfg"
# where the gateway container sees its configuration directory (the proxy image's)
CONTAINER_FILES_DIR = "/usr/local/etc/haproxy"
NO_ROUTE_FILE = "no-route.grpc.http"
SERVER_STATE_NAME = "servers.state"  # in the admin directory: root-only, the worker reads it
# gRPC status codes (grpc doc/statuscodes.md)
GRPC_NOT_FOUND = 5
GRPC_RESOURCE_EXHAUSTED = 8


@dataclass(frozen=True)
class Backend:
    """One serving host of a routed model: where the gateway sends its requests."""

    name: str  # the host's name: the server's name in both backends
    address: str
    grpc_port: int
    rest_port: int

    @property
    def grpc(self) -> str:
        """``address:port`` of the host's stable gRPC port."""
        return host_port(self.address, self.grpc_port)

    @property
    def rest(self) -> str:
        """``address:port`` of the host's stable REST port."""
        return host_port(self.address, self.rest_port)


@dataclass(frozen=True)
class RoutePlan:
    """A route with the hosts behind it."""

    model: str
    grpc_port: int | None
    rest_port: int | None
    rate_limit_rps: int | None
    by_authority: bool  # reached through the shared ports by `<model>.<domain>`
    servers: tuple[Backend, ...]

    @property
    def limit_file(self) -> str:
        """The errorfile of the model's RESOURCE_EXHAUSTED answer."""
        return f"{self.model}.rate-limited.grpc.http"


@dataclass(frozen=True)
class GatewayPlan:
    """What every gateway host runs: the setting, its hosts, each route's backends."""

    gateway: Gateway
    hosts: tuple[ResolvedHost, ...]
    routes: tuple[RoutePlan, ...]
    inventory_path: str

    def route(self, model: str) -> RoutePlan | None:
        """The route of ``model`` (None: not routed)."""
        return next((r for r in self.routes if r.model == model), None)


def plan_gateway(inventory: Inventory) -> GatewayPlan:
    """The gateway of ``inventory`` with each route's serving hosts; a ConfigError when the
    inventory declares none (the inventory load has checked everything else)."""
    gateway = inventory.gateway
    if gateway is None:
        raise ConfigError(Problem(
            "the inventory declares no gateway",
            fix="add `gateway = Gateway(routes=[Route('<model>', ...)])` and a 'gateway' group "
                "of gateway hosts to the inventory (docs/gateway.md)",
            file=inventory.path, field="gateway"))
    routes = tuple(_route_plan(inventory, gateway, route) for route in gateway.routes)
    return GatewayPlan(gateway=gateway, hosts=inventory.gateway_hosts, routes=routes,
                       inventory_path=inventory.path)


def _route_plan(inventory: Inventory, gateway: Gateway, route: Route) -> RoutePlan:
    model = inventory.model(route.model)
    servers = []
    for host in inventory.match(model.hosts, f"models.{model.name}.hosts"):
        ports = model_ports(host, model)
        servers.append(Backend(host.name, host.address, ports.grpc, ports.rest))
    return RoutePlan(model=route.model, grpc_port=route.grpc_port, rest_port=route.rest_port,
                     rate_limit_rps=route.rate_limit_rps,
                     by_authority=gateway.domain is not None and route.grpc_port is None,
                     servers=tuple(servers))


def render_gateway_files(plan: GatewayPlan, host: ResolvedHost, *,
                         files_dir: str = CONTAINER_FILES_DIR,
                         admin_socket: str = f"{PROXY_ADMIN_MOUNT}/{ADMIN_SOCKET_NAME}",
                         server_state: str = f"{PROXY_ADMIN_MOUNT}/{SERVER_STATE_NAME}"
                         ) -> dict[str, str]:
    """Every file of one gateway host's configuration directory, by name: haproxy.cfg and the
    gRPC answers it returns itself. ``files_dir``: where HAProxy finds that directory;
    ``admin_socket``, ``server_state``: where it finds its runtime socket and state file."""
    env = _environment(str(templates_dir()))
    config = env.get_template("gateway.cfg.j2").render(
        host=host, gw=plan.gateway, routes=plan.routes, inventory=plan.inventory_path,
        admin_socket=admin_socket, server_state=server_state, files_dir=files_dir,
        no_route_file=NO_ROUTE_FILE)
    files = {GATEWAY_FILE: config,
             NO_ROUTE_FILE: grpc_answer(GRPC_NOT_FOUND, "no model at this authority")}
    for route in plan.routes:
        if route.rate_limit_rps:
            files[route.limit_file] = grpc_answer(
                GRPC_RESOURCE_EXHAUSTED,
                f"rate limit of {route.rate_limit_rps} requests/s of model {route.model} "
                "reached")
    return files


def grpc_answer(status: int, message: str) -> str:
    """A gRPC Trailers-Only response as an HAProxy errorfile (HTTP/1 syntax, CRLF lines): HTTP
    200, application/grpc, the status and its percent-encoded message, no body."""
    encoded = "".join(c if c.isascii() and c.isprintable() and c != "%" else
                      "".join(f"%{b:02X}" for b in c.encode()) for c in message)
    lines = ["HTTP/1.1 200 OK", "Content-Type: application/grpc", f"grpc-status: {status}",
             f"grpc-message: {encoded}", "Content-Length: 0", "", ""]
    return "\r\n".join(lines)


@dataclass(frozen=True)
class GatewayPaths:
    """The gateway's files on a gateway host."""

    root: str

    @property
    def config_dir(self) -> str:
        """Mounted read-only at the proxy image's configuration directory."""
        return f"{self.root}/gateway/config"

    @property
    def config(self) -> str:
        """The live configuration."""
        return f"{self.config_dir}/{GATEWAY_FILE}"

    @property
    def admin_dir(self) -> str:
        """Root-only directory of the runtime API's socket."""
        return f"{self.root}/gateway/admin"

    @property
    def admin_socket(self) -> str:
        """The runtime API's socket as the host sees it."""
        return f"{self.admin_dir}/{ADMIN_SOCKET_NAME}"

    @property
    def server_state(self) -> str:
        """The servers' states a reloading worker starts from (``kept_server_state``)."""
        return f"{self.admin_dir}/{SERVER_STATE_NAME}"

    @property
    def drains_dir(self) -> str:
        """The recorded drains: ``<model>/<host>``, one file each (``GatewayDrain``)."""
        return f"{self.root}/gateway/drains"

    def drain_record(self, model: str, host: str) -> str:
        """The record of ``host`` drained for ``model``."""
        return f"{self.drains_dir}/{model}/{host}"

    @property
    def loaded(self) -> str:
        """The digest of the files the running worker was started or reloaded on, written
        once it answered (``files_digest``): equal files on disk are not enough, a run
        killed between writing them and the reload leaves the old worker running."""
        return f"{self.root}/gateway/loaded"


def gateway_paths(host: ResolvedHost) -> GatewayPaths:
    """Where the gateway lives on ``host``."""
    return GatewayPaths(root=host.vars.data_root.rstrip("/"))


def gateway_image(plan: GatewayPlan, host: ResolvedHost) -> str:
    """The HAProxy image the gateway runs on ``host``: the setting's, else the host's
    ``proxy_image``."""
    return plan.gateway.image or host.vars.proxy_image


def files_digest(files: Mapping[str, str]) -> str:
    """sha256 over a configuration directory's files, names and contents (each length-
    prefixed: no two directories give one digest)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        for part in (name.encode(), files[name].encode()):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


OPEN_SUFFIX = "-open"


def model_backends(model: str) -> tuple[str, str, str, str]:
    """The names of ``model``'s backends: the checked gRPC and REST ones, then their
    fail-open twins (the same hosts unchecked, used while no checked server is usable): a
    server belongs to the model only in these, matched whole (``ranker``'s are not
    ``ranker-eu``'s). A drain or a ready is set on all four."""
    grpc, rest = f"{model}-grpc", f"{model}-rest"
    return grpc, rest, grpc + OPEN_SUFFIX, rest + OPEN_SUFFIX


def drain_commands(model: str, host: str) -> list[str]:
    """Runtime commands: no new request of ``model`` goes to serving host ``host`` (those in
    flight finish); on both of the model's backends."""
    return [f"set server {backend}/{host} state drain" for backend in model_backends(model)]


def ready_commands(model: str, host: str) -> list[str]:
    """Runtime commands: ``host`` takes ``model``'s requests again."""
    return [f"set server {backend}/{host} state ready" for backend in model_backends(model)]


@dataclass(frozen=True)
class GatewayServer:
    """One server of a gateway backend as ``show stat`` reports it."""

    backend: str  # <model>-grpc or <model>-rest, or either's fail-open twin (<...>-open)
    host: str
    status: str  # UP, DOWN, DRAIN, MAINT, "UP 1/2" while rising ...
    sessions: int

    @property
    def up(self) -> bool:
        """Checked and taking new requests: ``UP`` (``UP 1/2`` while a failed check has not
        yet taken it out). A draining server takes none, however healthy."""
        return self.status.upper().startswith("UP")

    @property
    def ready(self) -> bool:
        """Its admin state lets it take requests (neither draining nor in maintenance),
        whatever its health."""
        return not self.status.upper().startswith(("DRAIN", "MAINT"))

    def of(self, model: str) -> bool:
        """A server of one of ``model``'s backends."""
        return self.backend in model_backends(model)


def parse_gateway_stat(stat_csv: str) -> tuple[GatewayServer, ...]:
    """The servers of the gateway's backends in ``show stat`` CSV."""
    found = []
    for row in stat_rows(stat_csv):
        backend, name = row.get("pxname") or "", row.get("svname") or ""
        if name in ("FRONTEND", "BACKEND", "") or not backend.removesuffix(
                OPEN_SUFFIX).endswith(("-grpc", "-rest")):
            continue
        found.append(GatewayServer(backend, name, row.get("status") or "",
                                   stat_int(row.get("scur"))))
    return tuple(found)


def route_health(plan: GatewayPlan, servers: tuple[GatewayServer, ...]
                 ) -> dict[str, tuple[int, int]]:
    """Per routed model: (servers of its gRPC backend that are up, servers it has)."""
    health = {}
    for route in plan.routes:
        grpc = model_backends(route.model)[0]
        mine = [s for s in servers if s.backend == grpc]
        health[route.model] = (sum(s.up for s in mine), len(route.servers))
    return health


def configured(plan: GatewayPlan) -> set[tuple[str, str]]:
    """(backend, server) of every server the configuration of ``plan`` has."""
    return {(backend, s.name) for r in plan.routes for s in r.servers
            for backend in model_backends(r.model)}


def carried_state(before: Iterable[GatewayServer], present: set[tuple[str, str]],
                  recorded: Iterable[GatewayDrain] = ()) -> list[str]:
    """Runtime commands that give a new worker the drains and maintenances the old one held
    (a reload starts every server ready), and every recorded drain (a worker started after a
    kill, or a reboot, never held them), for the servers it has (``present``: (backend,
    server))."""
    states: dict[tuple[str, str], str] = {}
    for drain in recorded:
        for backend in model_backends(drain.model):
            states[(backend, drain.host)] = "drain"
    for server in before:
        status = server.status.upper()
        if status.startswith("MAINT"):
            states[(server.backend, server.host)] = "maint"
        elif status.startswith("DRAIN"):
            states.setdefault((server.backend, server.host), "drain")
    return [f"set server {backend}/{host} state {state}"
            for (backend, host), state in sorted(states.items()) if (backend, host) in present]


def missing_drains(servers: Iterable[GatewayServer], plan: GatewayPlan,
                   recorded: Iterable[GatewayDrain]) -> list[str]:
    """Runtime commands for the recorded drains the running worker does not hold (a run
    killed between its reload and setting them again): the servers the configuration has
    whose admin state is ready."""
    ready, kept = {(s.backend, s.host) for s in servers if s.ready}, configured(plan)
    return [f"set server {backend}/{drain.host} state drain" for drain in recorded
            for backend in model_backends(drain.model) if (backend, drain.host) in ready
            and (backend, drain.host) in kept]


def stale_drains(plan: GatewayPlan, recorded: Iterable[GatewayDrain]) -> list[GatewayDrain]:
    """Recorded drains of servers the configuration no longer has (the host left the
    model's hosts and `fab gateway` took it out): nothing left to drain."""
    kept = configured(plan)
    return [d for d in recorded if (model_backends(d.model)[0], d.host) not in kept]


SERVER_STATE_VERSION = "1"  # the only version HAProxy 2.6 writes and reads
_BE_NAME, _SRV_NAME, _SRV_ADDR, _SRV_FQDN, _SRV_PORT, _SRV_CHECK_PORT = 1, 3, 4, 17, 18, 21


@dataclass(frozen=True)
class Endpoint:
    """Where one server of a configuration sends requests and checks."""

    address: str  # an IP address or a DNS name, as the file writes it
    port: int
    check_port: int  # 0: no `check port` (checks on ``port``, or a tracking server)


def server_endpoints(config: str) -> dict[tuple[str, str], Endpoint]:
    """(backend, server) -> Endpoint of every ``server`` line of a rendered HAProxy file
    (lines it cannot read are skipped, as ``host_proxy.config_ports`` does)."""
    found: dict[tuple[str, str], Endpoint] = {}
    backend = ""
    for line in config.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] in ("backend", "frontend", "defaults", "global", "listen"):
            backend = words[1] if words[0] == "backend" and len(words) > 1 else ""
        elif words[0] == "server" and backend and len(words) > 2:
            address, _, port = words[2].rpartition(":")
            check = next((words[i + 2] for i in range(len(words) - 2)
                          if words[i] == "check" and words[i + 1] == "port"), "0")
            if all(p.isascii() and p.isdigit() for p in (port, check)):
                found[(backend, words[1])] = Endpoint(address.strip("[]"), int(port),
                                                      int(check))
    return found


def kept_server_state(state: str, config: str) -> str:
    """The lines of ``show servers state`` (``state``, from the running worker) that a worker
    loading ``config`` may start from: the header, and each server that ``config`` has in
    the same backend at the same address, port and check port (a line sets them), without
    its check address and agent fields. An unknown version keeps nothing but a version line
    (the worker starts every server afresh)."""
    lines = state.splitlines()
    if not lines or lines[0].strip() != SERVER_STATE_VERSION:
        return SERVER_STATE_VERSION + "\n"
    wanted = server_endpoints(config)
    kept = [SERVER_STATE_VERSION]
    for line in lines[1:]:
        fields = line.split()
        if line.startswith("#"):
            kept.append(line)
        elif len(fields) > _SRV_CHECK_PORT and _same_endpoint(
                fields, wanted.get((fields[_BE_NAME], fields[_SRV_NAME]))):
            # up to the check port, the check address "-": the check follows the server's
            # address as the file resolves it; no agent fields (no agent is configured:
            # HAProxy warns "partially applied" on every line that has them)
            kept.append(" ".join([*fields[:_SRV_CHECK_PORT + 1], "-"]))
    return "\n".join(kept) + "\n"


def _same_endpoint(fields: list[str], endpoint: Endpoint | None) -> bool:
    if endpoint is None:
        return False
    try:
        same_address = ipaddress.ip_address(endpoint.address) == \
            ipaddress.ip_address(fields[_SRV_ADDR])
    except ValueError:  # a DNS name: the state names it in srv_fqdn
        same_address = endpoint.address == fields[_SRV_FQDN]
    return same_address and fields[_SRV_PORT] == str(endpoint.port) \
        and fields[_SRV_CHECK_PORT] == str(endpoint.check_port)
