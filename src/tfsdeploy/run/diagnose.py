"""`fab diagnose`: read each selected host's live instance over a window and name the stage
that limits it (core/tuning/bottleneck.py). Read-only, on the engine's look (run/survey.py's
pass over its session: its connections, Ctrl-C, SIGTERM and SIGHUP, and a deadline of the window
plus the look's own): the serving container's metrics page (its slot's REST port), its CPU time
and the host's (``/proc/stat``) at the window's ends, and its proxy's requests in flight every
second in between."""

from __future__ import annotations

from typing import Any

from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import host_paths, model_ports
from tfsdeploy.core.render.host_proxy import parse_stat
from tfsdeploy.core.rollout.gates import Clock
from tfsdeploy.core.target import Target
from tfsdeploy.core.tuning.bottleneck import Evidence, diagnose, release_config
from tfsdeploy.core.tuning.stages import parse_totals, stage_window
from tfsdeploy.hosts import probes, proxyadmin
from tfsdeploy.hosts.facts import HostFacts, read_release_files
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory, SshConnection
from tfsdeploy.loadtest.hostcpu import CpuTicks, busy_share, parse_proc_stat
from tfsdeploy.run import engine, survey
from tfsdeploy.run.jobs import Session

SAMPLE_S = 1.0


def diagnose_hosts(target: Target, window_s: float, *,
                   connect: ConnectionFactory = SshConnection) -> list[dict[str, Any]]:
    """One row per selected host: its finding (``diagnosis``) or why there is none."""
    def read(session: Session) -> list[dict[str, Any]]:
        def look(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
                 ) -> dict[str, Any]:
            live = facts.serving(0)
            if live is None:
                return {"diagnosis": None, "note": f"nothing of {target.model.name} serves here"}
            evidence = _read_window(target, host, conn, live.name, live.slot, live.release,
                                    window_s, clock=session.clock)
            return {"container": live.name, "release": live.release,
                    "diagnosis": diagnose(evidence).as_json()}

        return survey.each_host(target, look, session=session)

    return engine.look(target, read, connect=connect,
                       deadline_s=window_s + engine.LOOK_DEADLINE_S)


def _read_window(target: Target, host: ResolvedHost, conn: Connection, name: str, slot: str,
                 release: str, window_s: float, *, clock: Clock) -> Evidence:
    """The instance's evidence over ``window_s`` of ``clock`` (the look's: a signal ends its
    waits)."""
    model = target.model
    paths = host_paths(host, model)
    batching, threads = release_config(read_release_files(conn, paths, release))
    rest = model_ports(host, model).slot_rest(slot, 0)
    path = host.vars.monitoring_path
    cpus = _host_cpus(conn)
    before = parse_totals(probes.metrics(host.address, rest, path), model.name)
    host_before = _host_ticks(conn)
    cpu_before, started = conn.docker.cpu_seconds(name), clock.now()
    in_flight = _in_flight(conn, paths.admin_socket, slot)
    while clock.now() - started < window_s:
        clock.sleep(min(SAMPLE_S, max(0.0, window_s - (clock.now() - started))))
        now = _in_flight(conn, paths.admin_socket, slot)
        in_flight = max(in_flight, now) if now is not None and in_flight is not None else \
            (now if in_flight is None else in_flight)
    after = parse_totals(probes.metrics(host.address, rest, path), model.name)
    cpu_after, elapsed = conn.docker.cpu_seconds(name), clock.now() - started
    host_after = _host_ticks(conn)
    host_busy = busy_share(host_before, host_after) \
        if host_before is not None and host_after is not None else None
    user = system = None
    if cpu_before is not None and cpu_after is not None:
        user, system = cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1]
    return Evidence(host=host.name, window_s=elapsed, stages=stage_window(before, after),
                    batching=batching, threads=threads, slo_ms=model.latency_slo_ms,
                    host_cpus=cpus, cpu_user_s=user, cpu_system_s=system,
                    max_in_flight=in_flight, host_busy=host_busy)


def _in_flight(conn: Connection, socket: str, slot: str) -> int | None:
    """Requests in flight at instance 0's slot, as its proxy counts them (None: no answer)."""
    try:
        servers = parse_stat(proxyadmin.stat(conn, socket))
    except Exception:  # a proxy that does not answer: the gRPC rule has no figure
        return None
    found = [s.sessions for s in servers if s.backend == "grpc" and s.slot == slot
             and s.instance == 0]
    return found[0] if found else None


def _host_ticks(conn: Connection) -> CpuTicks | None:
    """The host's busy and total CPU ticks so far (None: unreadable)."""
    result = conn.run(["head", "-n", "1", "/proc/stat"], timeout=30)
    return parse_proc_stat(result.stdout) if result.ok else None


def _host_cpus(conn: Connection) -> int:
    result = conn.run(["nproc"], timeout=30)
    text = result.stdout.strip()
    return int(text) if result.ok and text.isascii() and text.isdigit() else 1
