"""Roll one host in its dual-version window: the release's files, its container in the free
slot beside the live one, the switch of the stable ports, the drain of the old slot, and the
record. The gates between them are in ``operations.gates``."""

from __future__ import annotations

import time
from typing import Literal

from tfsdeploy import proxyadmin
from tfsdeploy.changes import (
    Check,
    Command,
    ProxyCommands,
    RemoveContainer,
    RunContainer,
    StartContainer,
    WriteFile,
)
from tfsdeploy.commands.containers import proxy_spec, server_spec
from tfsdeploy.commands.files import mkdir, point_symlink, remove_tree
from tfsdeploy.facts import ProxyFact
from tfsdeploy.gates import GateFailed, Verdict, poll
from tfsdeploy.jobs import HostJob
from tfsdeploy.layout import SLOTS, proxy_name
from tfsdeploy.operations import Ops, operation
from tfsdeploy.proxy import parse_stat, render_proxy_config, set_state, switch_commands
from tfsdeploy.records import ReleaseStatus


@operation("upload_release")
def upload_release(job: HostJob) -> Ops:
    """Write the release's rendered files and its record into a new release directory."""
    directory = job.paths.release_dir(job.run.release_id)
    yield Command.of(mkdir(directory), f"create {directory}")
    job.uploaded = True
    for rendered in job.render.files:
        yield WriteFile(f"{directory}/{rendered.name}", rendered.text.encode())
    yield WriteFile(f"{directory}/manifest.json",
                    job.release_record(ReleaseStatus.STARTING).to_json())
    return directory


def _clear_free_slot(job: HostJob, step: str) -> Ops:
    """Remove what occupies the free slot: a leftover of an interrupted run, never the
    serving container."""
    if job.old and job.old.name == job.container:
        raise GateFailed(step, "the serving container to stay untouched",
                         f"{job.container} serves traffic and would be replaced")
    for container in job.facts.in_slot(job.new_slot):
        if container.name != job.container and (container.running or
                                                container.release == job.run.release_id):
            yield RemoveContainer(container.name)
    if any(c.name == job.container for c in job.facts.servers):
        yield RemoveContainer(job.container)
    return ""


def _run_new_container(job: HostJob) -> Ops:
    spec = server_spec(model=job.model.name, release_id=job.run.release_id, slot=job.new_slot,
                       version=job.run.version, image=job.image, paths=job.paths,
                       ports=job.ports, flags=job.flag_lines(), gpus=job.gpus)
    job.started = True  # from here on, restore removes it (removing nothing is harmless)
    yield RunContainer(spec, where=f"in slot {job.new_slot} "
                                  f"(:{job.ports.slot_grpc(job.new_slot)})")
    return f"{job.container} in {job.new_slot} (:{job.ports.slot_grpc(job.new_slot)})"


@operation("start_slot")
def start_slot(job: HostJob) -> Ops:
    """Start the new release in the free slot beside the old one."""
    yield from _clear_free_slot(job, "start_slot")
    return (yield from _run_new_container(job))


@operation("resume_release")
def resume_release(job: HostJob) -> Ops:
    """Bring a retained release back in the free slot: already running (warm), started
    again (stopped, same slot), or re-created from its record (its files are on the host)."""
    retained = [c for c in job.facts.of_release(job.run.release_id) if c.instance == 0]
    if retained and retained[0].slot == job.new_slot:
        if retained[0].running:
            job.warm = True
            return f"{retained[0].name} still running in {job.new_slot}: warm, no model load"
        job.resumed = True
        yield StartContainer(retained[0].name)
        return f"{retained[0].name} started again in {job.new_slot}"
    yield from _clear_free_slot(job, "resume_release")
    yield from _run_new_container(job)
    return f"{job.container} re-created from its record in {job.new_slot}"


def proxy_config(job: HostJob, active: str) -> WriteFile:
    """The host's proxy config with ``active`` serving (a restarted proxy comes back so)."""
    text = render_proxy_config(job.host, job.model, job.ports, {0: active})
    return WriteFile(f"{job.paths.proxy_dir}/haproxy.cfg", text.encode())


def wait_for_proxy(job: HostJob) -> Check:
    """A check that the proxy's admin socket answers (the proxy started)."""
    def run() -> str:
        def check() -> Verdict:
            try:
                proxyadmin.stat(job.conn, job.paths.admin_socket)
            except proxyadmin.ProxyRefused as error:
                return Verdict.wait(str(error))
            return Verdict.ok("answers")

        poll(check, step="switch_traffic", expected="the proxy's admin socket to answer",
             deadline_s=20, clock=job.run.clock, interval_s=0.2)
        return "the proxy answers"

    return Check("wait until the proxy's admin socket answers (20 s)", run)


@operation("switch_traffic")
def switch_traffic(job: HostJob, to: Literal["new", "old"] = "new") -> Ops:
    """Point the host's stable ports at the new slot (the proxy's runtime API, no reload);
    ``to: old`` points them back (restore)."""
    if to == "old":
        return (yield from _switch_back(job))
    if not job.facts.proxy.running:
        return (yield from _start_proxy(job))
    old = job.old.slot if job.old else None
    yield ProxyCommands(tuple(switch_commands(0, job.new_slot, old)),
                        f"proxy: new requests to {job.new_slot}"
                        + (f", drain {old}" if old else ""))
    job.switched = job.took_traffic = True
    yield proxy_config(job, job.new_slot)
    return f":{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}"


def _start_proxy(job: HostJob) -> Ops:
    paths = job.paths
    yield Command.of(mkdir(paths.proxy_dir), f"create {paths.proxy_dir}")
    yield Command.of(mkdir(paths.admin_dir, mode="0700"),
                     f"create {paths.admin_dir} (root only)")
    yield proxy_config(job, job.new_slot)
    if job.facts.proxy_container:
        yield RemoveContainer(job.facts.proxy_container.name)
    job.switched = job.took_traffic = True
    yield RunContainer(proxy_spec(model=job.model.name, image=job.host.vars.proxy_image,
                                  paths=paths),
                       where=f"on :{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}")
    yield wait_for_proxy(job)
    return f"proxy started on :{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}"


def _switch_back(job: HostJob) -> Ops:
    if not job.switched:
        return "traffic never moved"
    paths = job.paths
    if not job.old:  # first deploy on this host: nothing served here before
        yield RemoveContainer(proxy_name(job.model.name))
        if job.recorded:
            yield Command.of(remove_tree(paths.current, root=paths.home),
                             f"remove {paths.current}")
        job.switched = job.recorded = False
        return "proxy removed (nothing served here before)"
    old, new = job.old.slot, job.new_slot
    yield ProxyCommands(tuple(switch_commands(0, old, new)),
                        f"proxy: new requests back to {old}, drain {new}")
    yield proxy_config(job, old)
    job.switched = False
    if job.recorded:
        yield Command.of(point_symlink(f"releases/{job.old.release}", paths.current),
                         f"point {paths.current} back at {job.old.release}")
        job.recorded = False
    yield drain_check(job, new, job.model.rollout.drain_timeout_s, fail=False)
    yield ProxyCommands(tuple(set_state(0, new, "maint")), f"proxy: {new} in maintenance")
    return f"traffic back on {old}"


def drain_check(job: HostJob, slot: str, timeout_s: float, *, fail: bool = True) -> Check:
    """A check that ``slot`` has no request in flight (bounded by ``timeout_s``); with
    ``fail=False`` a slot still busy at the deadline is reported, not raised."""
    def run() -> str:
        started = time.monotonic()

        def check() -> Verdict:
            proxy = ProxyFact(True, parse_stat(proxyadmin.stat(job.conn, job.paths.admin_socket)),
                              True)
            busy = proxy.in_flight(slot)
            return Verdict.ok("0 in flight") if busy == 0 else Verdict.wait(f"{busy} in flight")

        try:
            poll(check, step="drain_old", expected=f"slot {slot} drained", deadline_s=timeout_s,
                 clock=job.run.clock, interval_s=0.1, max_interval_s=0.5)
        except GateFailed:
            if fail:
                raise
            return f"{slot} still busy after {timeout_s:g} s"
        return f"{slot} drained in {time.monotonic() - started:.1f} s"

    return Check(f"wait until slot {slot} has no request in flight ({timeout_s:g} s)", run)


@operation("drain_old")
def drain_old(job: HostJob, timeout_s: float | None = None) -> Ops:
    """Wait until the old slot has no request in flight, then put it in maintenance."""
    if not job.old:
        return "nothing to drain"
    slot = job.old.slot
    yield drain_check(job, slot, timeout_s or job.model.rollout.drain_timeout_s)
    yield ProxyCommands(tuple(set_state(0, slot, "maint")), f"proxy: {slot} in maintenance")
    return "in maintenance"


@operation("record_release")
def record_release(job: HostJob) -> Ops:
    """Write the release's record as serving and point ``current`` at it; a rollback marks
    the release it returned from as rolled back."""
    directory = job.paths.release_dir(job.run.release_id)
    yield WriteFile(f"{directory}/manifest.json",
                    job.release_record(ReleaseStatus.SERVING).to_json())
    yield Command.of(point_symlink(f"releases/{job.run.release_id}", job.paths.current),
                     f"point {job.paths.current} at {job.run.release_id}")
    job.recorded = True
    previous = job.previous_record
    if job.run.rollback and previous and previous.id != job.run.release_id:
        yield WriteFile(f"{job.paths.release_dir(previous.id)}/manifest.json",
                        previous.with_status(ReleaseStatus.ROLLED_BACK).to_json())
    return f"current -> {job.run.release_id}"


__all__ = ["SLOTS", "drain_check", "proxy_config", "wait_for_proxy"]
