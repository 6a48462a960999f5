"""`fab gateway`: render every gateway host's HAProxy configuration from the inventory, check
it on every host in the gateway's own image, then roll it host by host: files written, a
seamless reload (or the first start), the drains the old worker held and those recorded on
the host (``<data_root>/gateway/drains``) set again, and a gate that every routed model has a
serving host UP behind the new worker before the next host.

A host counts as current only when its files are the rendered ones and its running worker was
loaded on them (the files' digest, recorded in ``<data_root>/gateway/loaded`` once the new
worker answered): the same command run again after a kill -9 at any step converges.

One `fab gateway` at a time: a run takes the gateway's lock on a strict majority of the
gateway hosts (``hosts.lock``, in ``<data_root>/gateway/lock``: no model lives on a gateway
host), or ends with exit 4 naming the holder; ``--check`` and ``--diff`` only read. A
configuration that fails on any host (rendering, ``haproxy -c``) stops the run before any
live file changes (exit 1). A host whose new worker has a model with no serving host up gets
its previous files back and is reloaded on them (exit 2); when that also fails, or when an
earlier host already took the new configuration, exit 3.

The run is the engine's (``engine.operate``): its connections, and Ctrl-C, SIGTERM and SIGHUP,
which stop it as they stop a deploy, as does the gateway's ``deadline_s`` when it passes. A
signal while a host rolls ends that host's wait, and the host gets its previous files back, as
for a failed gate; one while the hosts are read, checked or prepared, or between two hosts,
stops before the next. Either way: exit 1 when no host was
changed, 2 when the one changing was put back and none before it changed, else 3 (the gateway
hosts run different configurations until `fab gateway` runs again, which converges).
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
    GATEWAY_FILE,
    GatewayPlan,
    GatewayServer,
    carried_state,
    configured,
    files_digest,
    gateway_image,
    gateway_paths,
    missing_drains,
    plan_gateway,
    render_gateway_files,
    route_health,
    stale_drains,
)
from tfsdeploy.core.rollout.gates import Clock, GateFailed, SystemClock, Verdict, poll
from tfsdeploy.core.rollout.records import GatewayDrain, LockRecord
from tfsdeploy.hosts import gateway as gw
from tfsdeploy.hosts import lock as locks
from tfsdeploy.hosts.dockerapi import DockerFailed
from tfsdeploy.hosts.proxyadmin import ProxyRefused
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory, SshConnection
from tfsdeploy.run import engine
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
    """The whole run (see the module's docstring), on the engine's session."""
    steady = clock or SystemClock()
    return engine.operate(
        lambda session, stop: _run(plan, session, _Roll(stop, steady, say), check=check,
                                   diff=diff),
        note=say, connect=connect, clock=steady, deadline_s=plan.gateway.deadline_s,
        setting="gateway.deadline_s")


@dataclass(frozen=True)
class _Roll:
    """What a roll needs beside the session: the engine's stop, a clock for restores (never
    cancelled) and where its lines go."""

    stop: engine.Stop
    steady: Clock
    say: Say


def _run(plan: GatewayPlan, session: Session, roll: _Roll, *, check: bool,
         diff: bool) -> GatewayResult:
    result = GatewayResult()
    wanted = files_for(plan)
    current = ""  # the host a failure before any live change is reported on
    held: tuple[list[locks.LockSite], LockRecord] | None = None
    changed: list[str] = []  # the hosts rolled so far
    say = roll.say
    try:
        conns = {host.name: session.connection(host) for host in plan.hosts}
        if not check:
            held = _take_lock(plan, conns, session.clock)
        lives = {}
        for host in plan.hosts:
            current = host.name
            if roll.stop.is_set():  # nothing changed yet
                _stopped(result, roll, [], host.name)
                return result
            conn, paths = conns[host.name], gateway_paths(host)
            lives[host.name] = gw.live_files(conn, paths)
            differs = lives[host.name] != wanted[host.name]
            if diff:
                result.diffs[host.name] = file_diff(host.name, lives[host.name],
                                                    wanted[host.name])
            if check:
                result.hosts[host.name] = "would change" if differs else "up to date"
                continue
            _prepare(conn, host, plan, wanted[host.name], say)
        if check:
            return result
        for host in plan.hosts:
            if roll.stop.is_set():
                _stopped(result, roll, changed, host.name)
                return result
            result.hosts[host.name], touched = _roll_host(
                conns[host.name], host, plan, wanted[host.name], lives[host.name],
                clock=session.clock, roll=roll)
            if touched:
                changed.append(host.name)
    except _HostFailed as failure:
        result.hosts[failure.host] = failure.message
        # hosts before it already run the new configuration: not every host is back
        result.exit_code = max(failure.code, ExitCode.INCONSISTENT) if changed \
            else failure.code
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
    return result


def _stopped(result: GatewayResult, roll: _Roll, changed: list[str], next_host: str) -> None:
    """A signal or the deadline came between two hosts: the roll ends before ``next_host``."""
    if changed:
        result.exit_code = ExitCode.INCONSISTENT
        what = (f"{', '.join(changed)} {'runs' if len(changed) == 1 else 'run'} the new "
                f"configuration, {next_host} and the hosts after it the previous one: run "
                "`fab gateway` again")
    else:
        result.exit_code = ExitCode.INVALID
        what = "no gateway host was changed"
    result.hosts[next_host] = f"not rolled: {roll.stop.why}"
    roll.say(f"{roll.stop.why} before {next_host}: {what}")


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
               roll: _Roll) -> tuple[str, bool]:
    """One gateway host: current only when its files are the rendered ones AND its running
    worker was loaded on them (the digest recorded once it answered: a run killed between
    writing the files and the reload leaves equal files and the old worker); else written
    (when they differ), started or reloaded, the digest recorded, the drains set again, the
    gate. Recorded drains the worker lacks are set in either case. A stop (a signal, its wait
    ended by ``clock``) restores the host as a failed gate does. Returns what happened and
    whether the host's worker was changed (False: it was up to date)."""
    say = roll.say
    paths, image = gateway_paths(host), gateway_image(plan, host)
    digest, recorded, running = files_digest(files), gw.drains(conn, paths), gw.running(conn)
    if files == live and running and gw.loaded_digest(conn, paths) == digest:
        return _up_to_date(conn, host, plan, recorded, say), False
    if files == live and running:
        say(f"{host.name}: its worker was not loaded on these files (a run stopped before "
            "its reload): reloading")
    before = gw.stat(conn, paths) if running else ()
    try:
        if files != live:
            gw.install(conn, paths, files)
            say(f"{host.name}: files written ({', '.join(sorted(files))})")
        done = gw.start_or_reload(conn, paths, image, files[GATEWAY_FILE], clock=clock)
        gw.mark_loaded(conn, paths, digest)
        say(f"{host.name}: {done}")
        _carry(conn, host, before, recorded, configured(plan), say)
        health = _wait_for_backends(conn, host, plan, clock=clock)
    except (*FAILURES, engine.Interrupted) as error:
        why = roll.stop.why if isinstance(error, engine.Interrupted) else str(error)
        code = _restore(conn, host, plan, live, before, recorded, roll.steady)
        raise _HostFailed(host.name, why, code) from error
    _forget_stale(conn, host, plan, recorded, say)
    say(f"{host.name}: serving: {health}")
    return f"{done}; {health}", True


def _up_to_date(conn: Connection, host: ResolvedHost, plan: GatewayPlan,
                recorded: list[GatewayDrain], say: Say) -> str:
    paths = gateway_paths(host)
    servers = gw.stat(conn, paths)
    again = missing_drains(servers, plan, recorded)
    if again:
        gw.commands(conn, paths, again)
        say(f"{host.name}: recorded drains set again: {'; '.join(again)}")
        servers = gw.stat(conn, paths)
    _forget_stale(conn, host, plan, recorded, say)
    health = _health_line(plan, servers)
    say(f"{host.name}: up to date; {health}")
    return f"up to date; {health}"


def _carry(conn: Connection, host: ResolvedHost, before: tuple[GatewayServer, ...],
           recorded: list[GatewayDrain], present: set[tuple[str, str]], say: Say) -> None:
    """The drains the old worker held and the recorded ones, set on the new worker."""
    carried = carried_state(before, present, recorded)
    if carried:
        gw.commands(conn, gateway_paths(host), carried)
        say(f"{host.name}: set again on the new worker: {'; '.join(carried)}")


def _forget_stale(conn: Connection, host: ResolvedHost, plan: GatewayPlan,
                  recorded: list[GatewayDrain], say: Say) -> None:
    """The records of drains whose server the configuration no longer has."""
    for drain in stale_drains(plan, recorded):
        gw.forget_drain(conn, gateway_paths(host), drain.model, drain.host)
        say(f"{host.name}: {drain.host} is no longer a server of {drain.model}: its drain "
            f"record removed ({drain.describe()})")


def _wait_for_backends(conn: Connection, host: ResolvedHost, plan: GatewayPlan, *,
                       clock: Clock) -> str:
    """Every routed model has a serving host UP behind the new worker (a draining one takes
    no request and does not count), within a few check intervals."""
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
             live: dict[str, str], before: tuple[GatewayServer, ...],
             recorded: list[GatewayDrain], clock: Clock) -> ExitCode:
    """The previous files back and the gateway reloaded on them, the drains set again:
    exit 2; none to go back to, or that fails too: exit 3."""
    if not live:
        return ExitCode.INCONSISTENT
    try:
        paths = gateway_paths(host)
        gw.install(conn, paths, live)
        gw.start_or_reload(conn, paths, gateway_image(plan, host), live[GATEWAY_FILE],
                            clock=clock)
        gw.mark_loaded(conn, paths, files_digest(live))
        present = {(s.backend, s.host) for s in gw.stat(conn, paths)}
        carried = carried_state(before, present, recorded)
        if carried:
            gw.commands(conn, paths, carried)
    except FAILURES:
        return ExitCode.INCONSISTENT
    return ExitCode.ROLLED_BACK


def _health_text(health: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{m} {up}/{total} up" for m, (up, total) in health.items())


def _health_line(plan: GatewayPlan, servers: tuple[GatewayServer, ...]) -> str:
    return _health_text(route_health(plan, servers))


def drift_notes(inventory: Inventory, model: str, *, session: Session) -> list[str]:
    """One line per gateway host routing ``model`` whose live files differ from what the
    inventory renders now (or that cannot be read): what `fab status` and `fab deploy` say,
    read over the engine's ``session`` (the look's, or the deploy's)."""
    if inventory.gateway is None or inventory.gateway.route(model) is None:
        return []
    plan = plan_gateway(inventory)
    notes = []
    for host in plan.hosts:
        try:
            live = gw.live_files(session.connection(host), gateway_paths(host))
        except FAILURES as error:
            notes.append(f"gateway {host.name}: its configuration could not be read ({error})")
            continue
        if not live:
            notes.append(f"gateway {host.name}: no gateway configured there yet (run "
                         "`fab gateway`)")
        elif live != render_gateway_files(plan, host):
            notes.append(f"gateway {host.name}: its configuration no longer matches the "
                         "inventory (`fab gateway --diff` shows how; `fab gateway` rolls it)")
    return notes
