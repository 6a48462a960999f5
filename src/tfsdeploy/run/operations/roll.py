"""Roll one instance of a host: the release's files (once per host), its container in the
free slot beside the live one (or in the same slot, out of rotation, with ``recreate``), the
switch of the stable ports, the drain of the old slot, and the record (once the host's last
instance rolled). The gates between them are in ``operations.gates``.

The engine runs the roll task list once per instance of the host (``HostJob.instance``); the
host's other instances keep serving meanwhile.
"""

from __future__ import annotations

import time
from typing import Literal

from tfsdeploy.core.inventory.layout import proxy_name, server_name
from tfsdeploy.core.render.host_proxy import (
    FULL_WEIGHT,
    parse_stat,
    render_proxy_config,
    set_state,
    shape_digest,
    switch_commands,
    weight_commands,
)
from tfsdeploy.core.rollout.gates import GateFailed, Verdict, poll
from tfsdeploy.core.rollout.records import ReleaseStatus
from tfsdeploy.hosts import proxyadmin
from tfsdeploy.hosts.commands.containers import proxy_spec, server_spec
from tfsdeploy.hosts.commands.files import mkdir, point_symlink, remove_tree
from tfsdeploy.hosts.facts import ProxyFact
from tfsdeploy.run.changes import (
    Check,
    Command,
    GatewayState,
    ProxyCommands,
    RemoveContainer,
    RunContainer,
    StartContainer,
    StopContainer,
    WriteFile,
    WriteTree,
)
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.preflight import live_server_ports
from tfsdeploy.run.operations.step import Ops, operation


def _where(job: HostJob) -> str:
    """The current instance, for details (empty on a host with one instance)."""
    return f"instance {job.instance.index}: " if len(job.instances) > 1 else ""


@operation("upload_release")
def upload_release(job: HostJob) -> Ops:
    """Write the release's rendered files and its record into a new release directory (once
    per host)."""
    directory = job.paths.release_dir(job.run.release_id)
    if job.uploaded:
        return f"{directory} (written for the host's first instance)"
    job.uploaded = True
    yield WriteTree(directory, (*((r.name, r.text.encode()) for r in job.render.files),
                                ("manifest.json",
                                 job.release_record(ReleaseStatus.STARTING).to_json())))
    return directory


def _clear_free_slot(job: HostJob, step: str) -> Ops:
    """Remove what occupies the instance's free slot: a leftover of an interrupted run, never
    the serving container (nor, with ``recreate``, the old one it replaces: kept, stopped)."""
    if job.old and job.old.name == job.container:
        raise GateFailed(step, "the serving container to stay untouched",
                         f"{job.container} serves traffic and would be replaced")
    keep = {job.container, job.old.name if job.old else ""}
    down = job.instance.down.name if job.instance.down else ""
    for container in job.facts.in_slot(job.new_slot, job.instance.index):
        if container.name not in keep and (container.running or container.name == down
                                           or container.release == job.run.release_id):
            yield RemoveContainer(container.name)
    if any(c.name == job.container for c in job.facts.servers):
        yield RemoveContainer(job.container)
    return ""


def _run_new_container(job: HostJob) -> Ops:
    index = job.instance.index
    spec = server_spec(model=job.model.name, release_id=job.run.release_id, slot=job.new_slot,
                       version=job.run.version, image=job.image, paths=job.paths,
                       ports=job.ports, flags=job.flag_lines(), gpus=job.gpus, instance=index)
    job.started = True  # from here on, restore removes it (removing nothing is harmless)
    port = job.ports.slot_grpc(job.new_slot, index)
    yield RunContainer(spec, where=f"in slot {job.new_slot} (:{port})")
    return f"{_where(job)}{job.container} in {job.new_slot} (:{port})"


@operation("start_slot")
def start_slot(job: HostJob) -> Ops:
    """Start the instance's new release in its free slot beside the old one (a paused
    canary's container, already running there, is kept: warm)."""
    running = [c for c in job.facts.in_slot(job.new_slot, job.instance.index)
               if c.running and c.release == job.run.release_id]
    if running and job.old and running[0].name != job.old.name:
        # it already shares the traffic; a failed promote removes it like a new container
        job.warm = job.switched = job.took_traffic = job.started = True
        return f"{_where(job)}{running[0].name} already runs in {job.new_slot}: warm"
    yield from _clear_free_slot(job, "start_slot")
    return (yield from _run_new_container(job))


def _on_other_ports(job: HostJob) -> bool:
    """Whether the container in the instance's new slot listens elsewhere than the plan's
    ports (made before the model's ports moved): it is re-created, not started again."""
    index, slot = job.instance.index, job.new_slot
    live = live_server_ports(job).get(server_name(slot, index))
    return live is not None and live != (job.ports.slot_grpc(slot, index),
                                         job.ports.slot_rest(slot, index))


@operation("resume_release")
def resume_release(job: HostJob) -> Ops:
    """Bring a retained release back in the free slot: already running (warm), started
    again (stopped, same slot), or re-created from its record (its files are on the host)."""
    retained = [c for c in job.facts.of_release(job.run.release_id)
                if c.instance == job.instance.index]
    if retained and retained[0].slot == job.new_slot and not _on_other_ports(job):
        if retained[0].running:
            job.warm = True
            return (f"{_where(job)}{retained[0].name} still running in {job.new_slot}: warm, "
                    "no model load")
        job.resumed = True
        yield StartContainer(retained[0].name)
        return f"{_where(job)}{retained[0].name} started again in {job.new_slot}"
    yield from _clear_free_slot(job, "resume_release")
    yield from _run_new_container(job)
    return f"{_where(job)}{job.container} re-created from its record in {job.new_slot}"


def serving_slots(job: HostJob) -> dict[int, str | None]:
    """Each instance's slot that takes traffic now, as this run left it (the instances the
    plan drops serve on until finalize removes them)."""
    return {**job.retiring, **{i.index: i.new_slot if i.switched else
                               (i.old.slot if i.old else None) for i in job.instances}}


def proxy_config(job: HostJob) -> WriteFile:
    """The host's proxy config as traffic flows now (a restarted proxy comes back so)."""
    text = render_proxy_config(job.host, job.model, job.ports, serving_slots(job),
                               job.port_move)
    return WriteFile(f"{job.paths.proxy_dir}/haproxy.cfg", text.encode())


def mark_loaded(job: HostJob, written: WriteFile) -> WriteFile:
    """The record that the proxy's running worker was started or reloaded on ``written``
    (its shape digest), written once it answered: a run killed between writing a
    configuration and loading it leaves the record of the one before, and the next run
    reloads (``shape.reload_reasons``)."""
    return WriteFile(job.paths.proxy_loaded,
                     f"{shape_digest(written.data.decode())}\n".encode())


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
        return ""

    return Check("wait until the proxy's admin socket answers (20 s)", run)


def proxy_running(job: HostJob) -> bool:
    """Whether the model's proxy runs (as read, or started by this run)."""
    return job.facts.proxy.running or job.proxy_started


@operation("switch_traffic")
def switch_traffic(job: HostJob, to: Literal["new", "old"] = "new") -> Ops:
    """Point the instance's share of the stable ports at its new slot (the proxy's runtime
    API, no reload); ``to: old`` points it back (restore)."""
    if to == "old":
        return (yield from _switch_back(job))
    if not proxy_running(job):
        return (yield from _start_proxy(job))
    old = job.old.slot if job.old else None
    yield ProxyCommands(tuple(_full_weights(job) + switch_commands(job.instance.index,
                                                                   job.new_slot, old)),
                        f"proxy: {_where(job)}new requests to {job.new_slot}"
                        + (f", drain {old}" if old else ""))
    job.switched = job.took_traffic = True
    yield proxy_config(job)
    return f"{_where(job)}:{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}"


def _start_proxy(job: HostJob) -> Ops:
    paths = job.paths
    yield Command.of(mkdir(paths.proxy_dir), f"create {paths.proxy_dir}")
    yield Command.of(mkdir(paths.admin_dir, mode="0700"),
                     f"create {paths.admin_dir} (root only)")
    job.switched = job.took_traffic = True
    written = proxy_config(job)
    yield written
    if job.facts.proxy_container:
        yield RemoveContainer(job.facts.proxy_container.name)
    job.proxy_started = True
    yield RunContainer(proxy_spec(model=job.model.name, image=job.host.vars.proxy_image,
                                  paths=paths),
                       where=f"on :{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}")
    yield wait_for_proxy(job)
    yield mark_loaded(job, written)
    return f"proxy started on :{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}"


def _full_weights(job: HostJob) -> list[str]:
    """After canary steps, both slots' weights back to full (a switch moves all traffic)."""
    if not job.weighted:
        return []
    job.weighted = False
    return [*weight_commands(job.instance.index, job.new_slot, FULL_WEIGHT),
            *(weight_commands(job.instance.index, job.old.slot, FULL_WEIGHT) if job.old else [])]


def _switch_back(job: HostJob) -> Ops:
    if job.instance.out_of_rotation:  # recreate: its old release comes back in the same slot
        return (yield from _back_in_rotation(job))
    if not job.switched:
        return "traffic never moved"
    paths = job.paths
    if not job.old and all(not i.old for i in job.instances) and job.proxy_started:
        # first deploy on this host: nothing served here before
        yield RemoveContainer(proxy_name(job.model.name))
        job.proxy_started = False
        if job.recorded:
            yield Command.of(remove_tree(paths.current, root=paths.home),
                             f"remove {paths.current}")
        job.switched = job.recorded = False
        return "proxy removed (nothing served here before)"
    new, old = job.new_slot, job.old.slot if job.old else None
    commands = _full_weights(job) + (switch_commands(job.instance.index, old, new) if old
                                     else set_state(job.instance.index, new, "maint"))
    yield ProxyCommands(tuple(commands), f"proxy: {_where(job)}new requests back to {old}, "
                        f"drain {new}" if old else f"proxy: {_where(job)}{new} out")
    job.switched = False
    yield proxy_config(job)
    if job.recorded and job.previous_record:
        yield Command.of(point_symlink(f"releases/{job.previous_record.id}", paths.current),
                         f"point {paths.current} back at {job.previous_record.id}")
        job.recorded = False
    if old:
        yield drain_check(job, new, job.model.rollout.drain_timeout_s, fail=False)
        yield ProxyCommands(tuple(set_state(job.instance.index, new, "maint")),
                            f"proxy: {_where(job)}{new} in maintenance")
    return f"{_where(job)}traffic back on {old}"


def drain_check(job: HostJob, slot: str, timeout_s: float, *, fail: bool = True,
                instance: int | None = None, step: str = "drain_old") -> Check:
    """A check that the instance's ``slot`` has no request in flight (bounded by
    ``timeout_s``); with ``fail=False`` a slot still busy at the deadline is reported.
    ``instance``: another instance than the current one; ``step``: the one it runs in."""
    index = job.instance.index if instance is None else instance

    def run() -> str:
        started = time.monotonic()

        def check() -> Verdict:
            proxy = ProxyFact(True, parse_stat(proxyadmin.stat(job.conn, job.paths.admin_socket)),
                              True)
            busy = proxy.in_flight(slot, index)
            return Verdict.ok("0 in flight") if busy == 0 else Verdict.wait(f"{busy} in flight")

        try:
            poll(check, step=step, expected=f"slot {slot} drained", deadline_s=timeout_s,
                 clock=job.run.clock, interval_s=0.1, max_interval_s=0.5)
        except GateFailed:
            if fail:
                raise
            return f"{server_name(slot, index)} still busy after {timeout_s:g} s"
        return f"{server_name(slot, index)} drained in {time.monotonic() - started:.1f} s"

    return Check(f"wait until {server_name(slot, index)} has no request in flight "
                 f"({timeout_s:g} s)", run)


@operation("drain_old")
def drain_old(job: HostJob, timeout_s: float | None = None) -> Ops:
    """Wait until the instance's old slot has no request in flight, then put it in
    maintenance."""
    if not job.old:
        return "nothing to drain"
    slot = job.old.slot
    yield drain_check(job, slot, timeout_s or job.model.rollout.drain_timeout_s)
    yield ProxyCommands(tuple(set_state(job.instance.index, slot, "maint")),
                        f"proxy: {_where(job)}{slot} in maintenance")
    return "in maintenance"


# -- recreate: the new release in the same slot, the instance out of rotation meanwhile ---

@operation("take_out_of_rotation")
def take_out_of_rotation(job: HostJob, timeout_s: float | None = None) -> Ops:
    """Drain the instance's serving server (its requests finish; the host's other instances
    take the new ones), then put it in maintenance: ``recreate`` replaces it in place."""
    if not job.old:
        return "nothing serving this instance"
    slot = job.old.slot
    job.instance.out_of_rotation = True
    keeps = f"the host keeps {len(job.instances) - 1} of {len(job.instances)} instance(s) serving"
    yield from gateway_drain(job, timeout_s or job.model.rollout.drain_timeout_s,
                             reason="recreate: its last serving instance is replaced in place")
    yield ProxyCommands(tuple(set_state(job.instance.index, slot, "drain")),
                        f"proxy: {_where(job)}{slot} drains")
    yield drain_check(job, slot, timeout_s or job.model.rollout.drain_timeout_s)
    yield ProxyCommands(tuple(set_state(job.instance.index, slot, "maint")),
                        f"proxy: {_where(job)}{slot} out of rotation ({keeps})")
    return keeps


def gateway_drain(job: HostJob, timeout_s: float, *, reason: str,
                  whole_host: bool = False) -> Ops:
    """Before the host's last serving instance leaves the rotation (``whole_host``: the
    model leaves the host): every gateway host that routes the model stops sending it
    requests, and those in flight there finish; the drain is recorded there with
    ``reason`` (the next run reads it)."""
    if job.run.gateway is None or job.gateway_drained:
        return "no gateway to drain"
    if not whole_host and any(not i.out_of_rotation for i in job.instances
                              if i is not job.instance):
        return "another instance keeps the host serving"
    yield GatewayState(job.model.name, job.name, "drain", timeout_s, reason)
    job.gateway_drained = True
    return "drained at the gateway"


def gateway_ready(job: HostJob) -> Ops:
    """The host serves again: back in the gateway hosts' rotation."""
    if job.run.gateway is None or not job.gateway_drained:
        return "not drained at the gateway"
    yield GatewayState(job.model.name, job.name, "ready")
    job.gateway_drained = False
    return "back in the gateway's rotation"


@operation("stop_old")
def stop_old(job: HostJob) -> Ops:
    """Stop the instance's old release (kept for rollback) to free its GPU memory and ports."""
    if not job.old:
        return "nothing to stop"
    yield StopContainer(job.old.name)
    return f"stopped {job.old.name}"


@operation("put_in_rotation")
def put_in_rotation(job: HostJob) -> Ops:
    """Put the instance back in rotation, now served by its new release."""
    if not proxy_running(job):
        return (yield from _start_proxy(job))
    yield ProxyCommands(tuple(set_state(job.instance.index, job.new_slot, "ready")),
                        f"proxy: {_where(job)}{job.new_slot} back in rotation")
    job.switched = job.took_traffic = True
    job.instance.out_of_rotation = False
    yield proxy_config(job)
    yield from gateway_ready(job)
    return f"{_where(job)}{job.new_slot} serves again"


def _back_in_rotation(job: HostJob) -> Ops:
    """Restore of a recreated instance: its old release started again, back in rotation."""
    if job.old:
        yield StartContainer(job.old.name)
        yield ProxyCommands(tuple(set_state(job.instance.index, job.old.slot, "ready")),
                            f"proxy: {_where(job)}{job.old.slot} back in rotation")
    job.instance.out_of_rotation = job.switched = False
    yield proxy_config(job)
    yield from gateway_ready(job)
    return f"{_where(job)}old release serving again"


@operation("record_release")
def record_release(job: HostJob) -> Ops:
    """Once the host's last instance rolled: write the release's record as serving and point
    ``current`` at it; a rollback marks the release it returned from as rolled back."""
    if not job.last_instance:
        return "recorded once the host's last instance has rolled"
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

