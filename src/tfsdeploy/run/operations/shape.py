"""A host whose shape changes: the proxy's servers follow the plan's instances.

The proxy has two servers (blue, green) per instance. Its runtime API changes a server's
state and weight; a server added at run time would not survive the proxy's next restart
unless its configuration had it too, so the configuration stays the one description of the
servers: when the plan has an instance the running proxy lacks (a GPU added, ``placement`` host ->
per_gpu, a wider ``gpus`` list), ``reshape_proxy`` rewrites the proxy's configuration with the
servers of every instance, old and new, and reloads it seamlessly before the host's first
instance rolls: the instances serving now keep their slot, the new ones start in maintenance
until their own switch; it does the same when the running worker was not loaded on the
configuration the plan needs (a setting changed, or a run was stopped between writing a
configuration and reloading it: ``proxy/loaded`` records what each start or reload loaded).
An instance the plan drops (a GPU removed, per_gpu -> ``host``) keeps
serving its old release through the roll; ``remove_instances``, in finalize, once every batch
passed, drains it, takes it out of rotation and reloads the proxy without it; ``retire_old``
then stops its container (kept for rollback, which brings the instance back).
"""

from __future__ import annotations

from tfsdeploy.core.inventory.layout import parse_server_name, proxy_name
from tfsdeploy.core.render.host_proxy import (
    config_ports,
    proxy_instances,
    server_names,
    set_state,
    shape_digest,
)
from tfsdeploy.run.changes import ProxyCommands, ReloadProxy
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.preflight import live_server_ports, proxy_binds
from tfsdeploy.run.operations.roll import drain_check, mark_loaded, proxy_config, proxy_running
from tfsdeploy.run.operations.step import Ops, operation


def planned(job: HostJob) -> frozenset[int]:
    """The instances the plan runs on the host."""
    return frozenset(i.index for i in job.instances)


def _listed(indices: frozenset[int] | set[int]) -> str:
    return ", ".join(f"i{i}" for i in sorted(indices))


def reload_reasons(job: HostJob, text: str) -> list[str]:
    """Why the running proxy must load ``text`` (the configuration as the plan needs it) before
    traffic moves: servers it lacks, servers that forward elsewhere, ports it does not bind
    (none: the runtime API does the rest). Read from its running worker (``show stat``:
    servers and listeners), not from its configuration on the host: a run killed between
    writing that file and the reload left a file the worker does not run."""
    want = config_ports(text)
    live = live_server_ports(job)
    targets = {name: at for _, name in want.servers if (at := want.server(name)) is not None}
    reasons = []
    added = {parsed[0] for name in targets if name not in live
             and (parsed := parse_server_name(name)) is not None}
    if added:
        reasons.append(f"servers of {_listed(added)} added")
    moved = [f"{name} -> :{at[0]}" for name, at in sorted(targets.items())
             if name in live and live[name] != at]
    if moved:
        reasons.append(f"servers moved ({', '.join(moved)})")
    bound = proxy_binds(job)
    wanted_binds = set().union(*want.binds.values()) if want.binds else set()
    had = set().union(*bound.values()) if bound else set()
    if wanted_binds - had - job.facts.listening or (bound and wanted_binds != had):
        reasons.append(f"stable ports :{', :'.join(map(str, sorted(wanted_binds)))} bound")
    if not reasons and job.facts.proxy.loaded != shape_digest(text):
        reasons.append("its worker was not loaded on this configuration (a setting changed, "
                       "or a run stopped between writing it and the reload)"
                       if job.facts.proxy.loaded else
                       "no record of the configuration its worker was loaded on")
    return reasons


@operation("reshape_proxy")
def reshape_proxy(job: HostJob) -> Ops:
    """Before the host's first instance rolls: when the plan needs servers the running proxy
    lacks (instances added), servers elsewhere or other ports (ports moved), rewrite its
    configuration and reload it seamlessly (established connections finish on the old
    worker; the runtime state of the servers it keeps is applied again)."""
    if job.instance is not job.instances[0]:
        return "the proxy was made to follow the plan before the host's first instance"
    if not proxy_running(job) or not job.facts.proxy.answered:
        return "no proxy serving yet: its first start has every instance's servers"
    out = yield from _down_out_of_rotation(job)
    wanted = planned(job) | set(job.retiring)
    written = proxy_config(job)
    reasons = reload_reasons(job, written.data.decode())
    if not reasons:
        return out + f"the proxy has the servers and ports of {_listed(wanted)}"
    live = proxy_instances(job.facts.proxy.servers)
    yield written
    yield ReloadProxy(proxy_name(job.model.name), server_names(wanted),
                      f"reload the proxy seamlessly: {'; '.join(reasons)} (new servers in "
                      f"maintenance until their switch; {_listed(live & wanted)} kept as "
                      "they are)")
    yield mark_loaded(job, written)
    return out + f"proxy reloaded for {_listed(wanted)}: {'; '.join(reasons)}"


def _down_out_of_rotation(job: HostJob) -> Ops:
    """Servers in rotation whose health check fails (``discover``'s ``down_slots``) go to
    maintenance before any traffic moves: an instance that died is replaced by this run
    (or removed, when the plan drops it), never brought back by its restart policy while
    the host's traffic moves."""
    if not job.down_slots:
        return ""
    commands = tuple(c for index, slot in sorted(job.down_slots)
                     for c in set_state(index, slot, "maint"))
    names = ", ".join(f"i{index}-{slot}" for index, slot in sorted(job.down_slots))
    yield ProxyCommands(commands, f"proxy: {names} in maintenance (health check fails)")
    return f"{names} (down) in maintenance; "


@operation("remove_instances")
def remove_instances(job: HostJob) -> Ops:
    """Once every batch passed: each instance the plan no longer has is drained (its requests
    finish, the host's other instances take the new ones), put in maintenance, and the proxy
    reloaded without its servers; ``retire_old`` then stops its container."""
    if not job.retiring:
        return "no instance to remove"
    drain_s = job.model.rollout.drain_timeout_s
    gone = set(job.retiring)
    for index, slot in sorted(job.retiring.items()):
        if slot is None:
            continue
        yield ProxyCommands(tuple(set_state(index, slot, "drain")),
                            f"proxy: instance {index}: {slot} drains (the plan drops it)")
        yield drain_check(job, slot, drain_s, instance=index)
        yield ProxyCommands(tuple(set_state(index, slot, "maint")),
                            f"proxy: instance {index}: {slot} out of rotation")
    job.retiring = {}
    written = proxy_config(job)
    yield written
    yield ReloadProxy(proxy_name(job.model.name), server_names(planned(job)),
                      f"reload the proxy seamlessly without the servers of {_listed(gone)}")
    yield mark_loaded(job, written)
    return f"{_listed(gone)} drained and removed from the proxy"
