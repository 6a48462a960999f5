"""Running a step: drive its operation, apply each change to the host (or only list it under
``--check``), record what was applied in the host's audit log. The only module that turns a
``Change`` into an effect."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.render.gateway_proxy import (
    GatewayPaths,
    drain_commands,
    gateway_paths,
    ready_commands,
)
from tfsdeploy.core.rollout.gates import Clock, GateFailed, Verdict, poll
from tfsdeploy.core.rollout.records import AuditEntry, GatewayDrain, now_iso
from tfsdeploy.hosts import gateway as gateway_host
from tfsdeploy.hosts import gpu_reservation, proxyadmin, scratch
from tfsdeploy.hosts.commands.files import append_lines, write_tree
from tfsdeploy.hosts.dockerapi import DockerFailed
from tfsdeploy.hosts.lock import new_lock_record
from tfsdeploy.hosts.ssh import Connection
from tfsdeploy.run.changes import (
    Change,
    Check,
    ClearScratch,
    Command,
    GatewayState,
    LocalCommand,
    ProxyCommands,
    Publish,
    PullImage,
    PullModel,
    ReloadProxy,
    RemoveContainer,
    RemoveImage,
    ReserveGpu,
    RunContainer,
    StartContainer,
    StopContainer,
    Upload,
    WriteFile,
    WriteTree,
)
from tfsdeploy.run.jobs import GatewayLink, HostJob, RunContext
from tfsdeploy.run.operations.step import Operation

if TYPE_CHECKING:
    from tfsdeploy.hosts.dockerssh import PullProgress

ProgressSink = Callable[[str, "PullProgress"], None]


@dataclass
class StepOutcome:
    """What one step did (or, under ``--check``, would do)."""

    detail: str
    changes: list[Change] = field(default_factory=list)


def apply_change(job: HostJob, step: str, change: Change, on_progress: ProgressSink) -> str:
    """Make ``change`` on the job's host; returns what it saw (a check's verdict) or ''."""
    conn = job.conn
    try:
        if isinstance(change, Check):
            return change.run()
        if isinstance(change, Command):
            result = conn.run(list(change.argv), timeout=change.timeout, stdin=change.stdin)
            if result.code not in change.ok_codes:
                raise GateFailed(step, f"`{change.what}` to succeed",
                                 f"exit {result.code}: {result.tail()}")
        elif isinstance(change, LocalCommand):
            return run_local(change, step)
        elif isinstance(change, WriteFile):
            conn.put_bytes(change.data, change.path, mode=change.mode)
        elif isinstance(change, WriteTree):
            result = conn.run(write_tree(change.path, root=job.paths.root),
                              stdin=change.archive(), timeout=60)
            if not result.ok:
                raise GateFailed(step, f"`{change.describe()}` to succeed",
                                 f"exit {result.code}: {result.tail()}")
        elif isinstance(change, Upload):
            conn.put_file(change.source(), change.path)
        elif isinstance(change, PullImage):
            if change.if_missing and conn.docker.image_present(change.image):
                return f"{change.image} present"
            conn.docker.pull(change.image, lambda p: on_progress(job.name, p))
        elif isinstance(change, PullModel):
            with job.run.pull_slots:
                conn.docker.pull(change.reference, lambda p: on_progress(job.name, p))
        elif isinstance(change, Publish):
            return change.run()
        elif isinstance(change, RunContainer):
            conn.docker.run(change.spec)
        elif isinstance(change, StartContainer):
            conn.docker.start(change.name)
        elif isinstance(change, StopContainer):
            conn.docker.stop(change.name)
        elif isinstance(change, RemoveContainer):
            conn.docker.remove(change.name)
        elif isinstance(change, ClearScratch):
            return scratch.clear_left(conn, change.model, job.paths,
                                      new_lock_record(f"fab {job.run.verb} (removing what a "
                                                      "killed fab tune left)"))
        elif isinstance(change, RemoveImage):
            freed = conn.docker.remove_image(change.image)
            return f"{change.image}: {freed / (1 << 20):.1f} MiB ({freed} bytes) freed" \
                if freed else f"{change.image} kept (in use or absent)"
        elif isinstance(change, GatewayState):
            return gateway_state(job, change, step)
        elif isinstance(change, ProxyCommands):
            proxyadmin.send(conn, job.paths.admin_socket, change.commands)
        elif isinstance(change, ReloadProxy):
            return proxyadmin.reload(conn, job.paths.admin_socket, change.container,
                                     change.servers, clock=job.run.clock)
        elif isinstance(change, ReserveGpu):
            return reserve_gpu(job, change, step)
        else:
            raise TypeError(f"no way to apply {type(change).__name__}")
    except (DockerFailed, proxyadmin.ProxyRefused) as error:
        raise GateFailed(step, f"{change.describe()} to succeed", str(error)) from None
    return ""


def reserve_gpu(job: HostJob, change: ReserveGpu, step: str) -> str:
    """Take the window's host-wide GPU reservation, or fail the step naming the earlier
    window that holds the GPU (the new process is not started)."""
    taken = gpu_reservation.take(job.conn, job.paths, change.record, reclaim=change.reclaim)
    if taken.refusal is not None:
        raise GateFailed(step, "room on the GPU for the window beside the other runs' windows",
                         f"{taken.refusal.text()}; fix: deploy again once that window has "
                         "ended (its run finishes or fails), or roll this model with "
                         "strategy 'recreate'")
    others = len(taken.earlier)
    return (f"reserved as {taken.name}" + (f" beside {others} earlier window(s)"
                                           if others else ""))


GATEWAY_FAILURES = (proxyadmin.ProxyRefused, gateway_host.GatewayRefused, HostUnreachable,
                    OSError)


def run_label(run: RunContext) -> str:
    """The run as a drain record names it: ``deploy resnet50 <release>``."""
    return " ".join(p for p in (str(run.verb), run.model.name, run.release_id) if p)


def gateway_state(job: HostJob, change: GatewayState, step: str) -> str:
    """Set the host's state for its model on every gateway host that routes it. A drain is
    recorded there first (which run, why: ``GatewayDrain``), then made, then waited on until
    no request of the host is in flight there; a ready removes the record first, then puts
    the host back (a kill in between never leaves an unrecorded drain). A gateway host that
    refuses or cannot be reached fails the step: the host must not leave its rotation
    unannounced."""
    link = job.run.gateway
    if link is None:
        return "no gateway routes the model"
    for host in link.hosts:
        conn, paths = link.connections[host.name], gateway_paths(host)
        try:
            if change.state == "drain":
                gateway_host.record_drain(conn, paths, GatewayDrain(
                    model=change.model, host=change.host, reason=change.reason,
                    run=run_label(job.run), who=job.run.who, time=now_iso()))
                gateway_host.commands(conn, paths, drain_commands(change.model, change.host))
                _wait_drained(conn, paths, change, job.run.clock, step)
            else:
                gateway_host.forget_drain(conn, paths, change.model, change.host)
                gateway_host.commands(conn, paths, ready_commands(change.model, change.host))
        except GATEWAY_FAILURES as error:
            raise GateFailed(step, f"gateway {host.name} to {change.state} {change.host}",
                             str(error)) from None
    return f"{change.state} on {', '.join(h.name for h in link.hosts)}"


DEPARTED = "no longer among the model's hosts"


def reconcile_gateway(link: GatewayLink, run: RunContext, keep: set[str], *,
                      timeout_s: float, clock: Clock) -> list[str]:
    """Before a deploy's or rollback's roll, on every gateway host that routes the model
    (its backends matched by their exact names): each of the model's hosts (``keep``) that is
    drained or in maintenance there, or has a recorded drain, is put back in rotation (this
    run holds the model's lock, so the run that drained it has ended; a host that does not
    serve stays out by the gateway's health check); each serving host of its backends no
    longer among them is drained (recorded first; its requests finish), so that what leaves
    the inventory leaves the rotation before the roll. One line per gateway host that did
    something or could not; a gateway that cannot be read or refuses is said, and the run
    goes on (the gateway's configuration check at the end says it no longer matches)."""
    model, notes = run.model.name, []
    for host in link.hosts:
        conn, paths = link.connections[host.name], gateway_paths(host)
        try:
            servers = [s for s in gateway_host.stat(conn, paths) if s.of(model)]
            recorded = {d.host: d for d in gateway_host.drains(conn, paths) if d.model == model}
            present = {s.host for s in servers}
            back = sorted({s.host for s in servers if s.host in keep and not s.ready}
                          | {name for name in recorded if name in keep and name in present})
            for name in sorted(set(recorded) & keep):  # the reason no longer holds
                gateway_host.forget_drain(conn, paths, model, name)
            for name in back:
                gateway_host.commands(conn, paths, ready_commands(model, name))
            notes += [f"gateway {host.name}: {name} back in rotation for {model} ("
                      + (recorded[name].describe() if name in recorded else
                         "drained with no record: by hand, or by an older tfsdeploy")
                      + ")" for name in back]
            departed = sorted({s.host for s in servers if s.host not in keep and s.ready})
            for name in sorted({s.host for s in servers if s.host not in keep} - set(recorded)):
                gateway_host.record_drain(conn, paths, GatewayDrain(
                    model=model, host=name, reason=DEPARTED, run=run_label(run), who=run.who,
                    time=now_iso()))
            for name in departed:
                gateway_host.commands(conn, paths, drain_commands(model, name))
                _wait_drained(conn, paths, GatewayState(model, name, "drain", timeout_s),
                              clock, "gateway_departed")
        except (*GATEWAY_FAILURES, GateFailed) as error:
            notes.append(f"gateway {host.name}: the model's servers could not be set right "
                         f"({error}); `fab gateway` sets them from the records")
            continue
        if departed:
            listed = ",".join(departed)
            notes.append(f"gateway {host.name}: {', '.join(departed)} drained for {model}: no "
                         f"longer among its hosts (`fab gateway` takes "
                         f"{'it' if len(departed) == 1 else 'them'} out of the gateway, "
                         f"`fab retire --model {model} --hosts {listed}` off the host)")
    return notes


def _wait_drained(conn: Connection, paths: GatewayPaths, change: GatewayState, clock: Clock,
                  step: str) -> None:
    def idle() -> Verdict:
        busy = sum(s.sessions for s in gateway_host.stat(conn, paths)
                   if s.host == change.host and s.of(change.model))
        return Verdict.ok("none in flight") if busy == 0 else \
            Verdict.wait(f"{busy} request(s) in flight")

    poll(idle, step=step, expected=f"no request of {change.model} in flight to {change.host} "
         "at the gateway", deadline_s=change.timeout_s, clock=clock, interval_s=0.1,
         max_interval_s=0.5)


def run_local(change: LocalCommand, step: str) -> str:
    """Run a local command (stdin closed, its own process group, killed at the timeout)."""
    env = {**os.environ, **dict(change.env)}
    try:
        process = subprocess.Popen(list(change.argv), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    except OSError as error:
        raise GateFailed(step, f"`{change.argv[0]}` to run", str(error)) from None
    try:
        output, _ = process.communicate(timeout=change.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise GateFailed(step, f"`{' '.join(change.argv)}` within {change.timeout:g} s",
                         "timed out: " + output.decode(errors="replace")[-500:]) from None
    tail = output.decode(errors="replace").strip().splitlines()[-5:]
    if process.returncode not in change.ok_codes:
        raise GateFailed(step, f"`{' '.join(change.argv)}` to succeed",
                         f"exit {process.returncode}: " + "\n".join(tail))
    return tail[-1] if tail else ""


def audit_lines(job: HostJob, step: str, changes: list[Change], *, failed: str = ""
                ) -> list[str]:
    """The audit log's lines for the changes a step applied (and its failure, if any)."""
    def entry(event: str, details: dict[str, Any]) -> str:
        return AuditEntry(time=now_iso(), who=job.run.who, host=job.name,
                          model=job.model.name, release=job.run.release_id, event=event,
                          details=details).to_line()

    lines = [entry(step, {"change": c.describe(), "kind": c.kind}) for c in changes]
    if failed:
        lines.append(entry(step, {"failed": failed[:500]}))
    return lines


def run_step(job: HostJob, step: str, operation: Operation, params: dict[str, Any], *,
             check: bool, on_progress: ProgressSink, audit_later: bool = False
             ) -> StepOutcome:
    """Drive one operation: apply its changes in order (or only collect them when ``check``);
    the applied changes go to the host's audit log in one append, even when the step fails
    (``audit_later``: a step that went well appends while the next one runs, ``job.audit``;
    its caller waits for the last append)."""
    ops = operation(job, **params)
    applied: list[Change] = []
    seen: list[str] = []
    failure = ""
    try:
        while True:
            try:
                change = next(ops)
            except StopIteration as stop:
                detail = str(stop.value or "")
                break
            if check:
                applied.append(change)
                continue
            job.touched |= change.serving  # before: a half-made change counts too
            job.processes_changed |= change.processes
            result = apply_change(job, step, change, on_progress)
            if isinstance(change, Check):
                job.processes_changed |= change.process_ready
                seen.append(result)
            else:
                applied.append(change)
                if result:
                    seen.append(result)
    except BaseException as error:
        if not getattr(error, "benign", False):
            failure = str(error) or type(error).__name__
        raise
    finally:
        if not check:
            _audit(job, step, [c for c in applied if c.audited], failure, later=audit_later)
    return StepOutcome("; ".join(s for s in (*seen, detail) if s), applied)


def _audit(job: HostJob, step: str, changes: list[Change], failure: str, *,
           later: bool = False) -> None:
    lines = audit_lines(job, step, changes, failed=failure)
    if not lines:
        return
    if later and not failure:
        job.audit.later(job.conn, job.paths.audit_log, lines)
        return
    try:
        job.audit.wait()  # the earlier steps' lines first
        job.conn.run(append_lines(job.paths.audit_log, lines))
    except HostUnreachable:
        if not failure:
            raise  # the step itself went well: losing its record is a failure of the step
