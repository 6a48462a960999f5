"""`fab gateway`: render every gateway host's HAProxy configuration from the inventory, check
it on every host in the gateway's own image, then roll it host by host: files written, a
seamless reload (or the first start), the drains the old worker held carried over, and a gate
that every routed model has a serving host up behind the new worker before the next host.

One `fab gateway` at a time: a run takes the gateway's lock on a strict majority of the
gateway hosts (``hosts.lock``, in ``<data_root>/gateway/lock``: no model lives on a gateway
host), or ends with exit 4 naming the holder; ``--check`` and ``--diff`` only read. A
configuration that fails on any host (rendering, ``haproxy -c``) stops the run before any
live file changes (exit 1). A host whose new worker has a model with no serving host up gets
its previous files back and is reloaded on them (exit 2); when that also fails, exit 3.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from tfsdeploy.core.errors import ExitCode, HostUnreachable
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.core.inventory.load import Inventory
from tfsdeploy.core.render.gateway_proxy import (
    GatewayPlan,
    GatewayServer,
    carried_state,
    gateway_image,
    gateway_paths,
    plan_gateway,
    render_gateway_files,
    route_health,
)
from tfsdeploy.core.rollout.gates import Clock, GateFailed, SystemClock, Verdict, poll
from tfsdeploy.core.rollout.records import LockRecord
from tfsdeploy.hosts import gateway as gw
from tfsdeploy.hosts import lock as locks
from tfsdeploy.hosts.dockerapi import DockerFailed
from tfsdeploy.hosts.proxyadmin import ProxyRefused
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory, SshConnection
from tfsdeploy.run.jobs import Session

Say = Callable[[str], None]
FAILURES = (gw.GatewayRefused, ProxyRefused, DockerFailed, GateFailed, HostUnreachable,
            OSError)


@dataclass
class GatewayResult:
    """What a `fab gateway` run did, per host."""

    exit_code: ExitCode = ExitCode.OK
    hosts: dict[str, str] = field(default_factory=dict)  # host -> what happened
    diffs: dict[str, str] = field(default_factory=dict)  # host -> unified diff (--diff)


def files_for(plan: GatewayPlan) -> dict[str, dict[str, str]]:
    """Every gateway host's files (pure)."""
    return {h.name: render_gateway_files(plan, h) for h in plan.hosts}


def file_diff(host: str, live: dict[str, str], wanted: dict[str, str]) -> str:
    """A unified diff of the gateway's directory on ``host``: live against rendered."""
    lines: list[str] = []
    for name in sorted(set(live) | set(wanted)):
        lines += difflib.unified_diff(
            live.get(name, "").splitlines(keepends=True),
            wanted.get(name, "").splitlines(keepends=True),
            fromfile=f"{host}:live/gateway/{name}", tofile=f"{host}:rendered/gateway/{name}")
    return "".join(lines)


def roll_gateway(plan: GatewayPlan, *, say: Say, check: bool = False, diff: bool = False,
                 connect: ConnectionFactory = SshConnection,
                 clock: Clock | None = None) -> GatewayResult:
    """The whole run (see the module's docstring)."""
    result = GatewayResult()
    clock = clock or SystemClock()
    wanted = files_for(plan)
    conns: dict[str, Connection] = {}
    current = ""  # the host a failure before any live change is reported on
    held: tuple[list[locks.LockSite], LockRecord] | None = None
    try:
        for host in plan.hosts:
            conns[host.name] = connect(host)
        if not check:
            held = _take_lock(plan, conns, clock)
        lives = {}
        for host in plan.hosts:
            current = host.name
            conn, paths = conns[host.name], gateway_paths(host)
            lives[host.name] = gw.live_files(conn, paths)
            changed = lives[host.name] != wanted[host.name]
            if diff:
                result.diffs[host.name] = file_diff(host.name, lives[host.name],
                                                    wanted[host.name])
            if check:
                result.hosts[host.name] = "would change" if changed else "up to date"
                continue
            _prepare(conn, host, plan, wanted[host.name], say)
        if check:
            return result
        for host in plan.hosts:
            result.hosts[host.name] = _roll_host(conns[host.name], host, plan,
                                                 wanted[host.name], lives[host.name],
                                                 clock=clock, say=say)
    except _HostFailed as failure:
        result.hosts[failure.host] = failure.message
        result.exit_code = failure.code
        say(f"{failure.host}: FAILED: {failure.message}")
    except (locks.LockHeld, locks.LockQuorumLost) as refused:
        result.hosts["lock"] = str(refused)
        result.exit_code = refused.exit_code
        say(f"refused before any host changed: {refused}")
    except FAILURES as error:  # before any live file changed
        result.hosts[current] = f"refused: {error}"
        result.exit_code = ExitCode.INVALID
        say(f"{current}: refused before any host changed: {error}")
    finally:
        if held is not None:
            locks.release_sites(*held)
        for conn in conns.values():
            conn.close()
    return result


GATEWAY_LOCK = "gateway"  # the lock's home on a gateway host: <data_root>/gateway


def _take_lock(plan: GatewayPlan, conns: dict[str, Connection], clock: Clock
               ) -> tuple[list[locks.LockSite], LockRecord]:
    """The gateway's lock on a strict majority of its hosts (two `fab gateway` runs would
    each carry over drains the other is replacing); raises LockHeld naming the holder."""
    sites = [locks.LockSite(h.name, conns[h.name], HostPaths(
        root=gateway_paths(h).root, model=GATEWAY_LOCK)) for h in plan.hosts]
    record = locks.new_lock_record("gateway")
    taken = locks.acquire_majority(
        sites, record, wait_s=0.0, clock=clock, model="the gateway",
        fix="wait for it to end and run again; a run whose process is gone on this machine "
            "is broken by the next one; if none runs elsewhere either, remove "
            "<data_root>/gateway/lock on the gateway hosts")
    return taken, record


class _HostFailed(Exception):
    def __init__(self, host: str, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.host, self.message, self.code = host, message, code


def _prepare(conn: Connection, host: ResolvedHost, plan: GatewayPlan,
             files: dict[str, str], say: Say) -> None:
    """The image on the host, and the new configuration checked there (nothing live)."""
    image = gateway_image(plan, host)
    if not conn.docker.image_present(image):
        say(f"{host.name}: pulling {image}")
        conn.docker.pull(image, lambda _progress: None)
    gw.check_staged(conn, gateway_paths(host), files, image)
    say(f"{host.name}: configuration checked with haproxy -c in {image}")


def _roll_host(conn: Connection, host: ResolvedHost, plan: GatewayPlan,
               files: dict[str, str], live: dict[str, str], *, clock: Clock,
               say: Say) -> str:
    paths, image = gateway_paths(host), gateway_image(plan, host)
    if files == live and gw.running(conn):
        health = _health_line(plan, gw.stat(conn, paths))
        say(f"{host.name}: up to date; {health}")
        return f"up to date; {health}"
    before = gw.stat(conn, paths) if gw.running(conn) else ()
    try:
        gw.install(conn, paths, files)
        done = gw.start_or_reload(conn, paths, image, clock=clock)
        carried = carried_state(before, plan)
        if carried:
            gw.commands(conn, paths, carried)
        health = _wait_for_backends(conn, host, plan, clock=clock)
    except FAILURES as error:
        raise _HostFailed(host.name, str(error), _restore(conn, host, plan, live, clock)) \
            from error
    say(f"{host.name}: {done}; {health}")
    return f"{done}; {health}"


def _wait_for_backends(conn: Connection, host: ResolvedHost, plan: GatewayPlan, *,
                       clock: Clock) -> str:
    """Every routed model has a serving host up behind the new worker (its first checks
    passed: ``rise`` intervals), within a few intervals."""
    settle_s = (plan.gateway.rise + 3) * plan.gateway.check_interval_ms / 1000 + 5

    def ready() -> Verdict:
        health = route_health(plan, gw.stat(conn, gateway_paths(host)))
        dark = sorted(m for m, (up, _) in health.items() if up == 0)
        line = _health_text(health)
        return Verdict.wait(f"no serving host up for {', '.join(dark)} ({line})") if dark \
            else Verdict.ok(line)

    return poll(ready, step="gateway", expected="every routed model with a serving host up",
                deadline_s=settle_s, clock=clock, interval_s=0.2, max_interval_s=1.0).seen


def _restore(conn: Connection, host: ResolvedHost, plan: GatewayPlan,
             live: dict[str, str], clock: Clock) -> ExitCode:
    """The previous files back and the gateway reloaded on them: exit 2; none to go back to,
    or that fails too: exit 3."""
    if not live:
        return ExitCode.INCONSISTENT
    try:
        paths = gateway_paths(host)
        gw.install(conn, paths, live)
        gw.start_or_reload(conn, paths, gateway_image(plan, host), clock=clock)
    except FAILURES:
        return ExitCode.INCONSISTENT
    return ExitCode.ROLLED_BACK


def _health_text(health: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{m} {up}/{total} up" for m, (up, total) in health.items())


def _health_line(plan: GatewayPlan, servers: tuple[GatewayServer, ...]) -> str:
    return _health_text(route_health(plan, servers))


def drift_notes(inventory: Inventory, model: str, *,
                connect: ConnectionFactory = SshConnection,
                session: Session | None = None) -> list[str]:
    """One line per gateway host routing ``model`` whose live files differ from what the
    inventory renders now (or that cannot be read): what `fab status` and `fab deploy` say
    (a deploy reads them over its own ``session``)."""
    if inventory.gateway is None or inventory.gateway.route(model) is None:
        return []
    plan = plan_gateway(inventory)
    notes = []
    for host in plan.hosts:
        conn = session.connection(host) if session is not None else connect(host)
        try:
            live = gw.live_files(conn, gateway_paths(host))
        except FAILURES as error:
            notes.append(f"gateway {host.name}: its configuration could not be read ({error})")
            continue
        finally:
            if session is None:
                conn.close()
        if not live:
            notes.append(f"gateway {host.name}: no gateway configured there yet (run "
                         "`fab gateway`)")
        elif live != render_gateway_files(plan, host):
            notes.append(f"gateway {host.name}: its configuration no longer matches the "
                         "inventory (`fab gateway --diff` shows how; `fab gateway` rolls it)")
    return notes
