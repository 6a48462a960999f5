"""`fab retire`: a model taken off a host, under its lock. Every server it has in the proxy goes
out of rotation and drains (its requests in flight finish), then its proxy and serving
containers are removed, then its files: releases, ``current``, the proxy's directories, the
version digests and the staged versions. The audit log stays, and records the retirement
(every change is appended to it as it is applied). Everything touched is the model's own:
containers labelled with its name, its proxy ``tfs-proxy-<model>``, directories named after
it; another model on the host is never touched.
"""

from __future__ import annotations

from tfsdeploy.core.render.host_proxy import set_state
from tfsdeploy.hosts.commands.files import remove_tree
from tfsdeploy.hosts.commands.gpu import forget_model
from tfsdeploy.run.changes import Command, ProxyCommands, RemoveContainer
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.roll import drain_check, gateway_drain
from tfsdeploy.run.operations.step import Ops, operation


@operation("drain_model")
def drain_model(job: HostJob) -> Ops:
    """Every server of the model's proxy that takes requests: drain (in-flight requests
    finish), wait until none is in flight (bounded by ``drain_timeout_s``), maintenance."""
    proxy = job.facts.proxy
    if not proxy.running or not proxy.answered:
        return "no proxy serving here" if job.facts.holds_model else "nothing of the model here"
    live = sorted({(s.instance, s.slot) for s in proxy.servers if s.takes_new_requests})
    if not live:
        return "no server in rotation"
    yield from gateway_drain(job, job.model.rollout.drain_timeout_s, whole_host=True,
                             reason="retire: the model leaves the host")
    yield ProxyCommands(tuple(c for i, slot in live for c in set_state(i, slot, "drain")),
                        "proxy: every server of the model drains (out of rotation)")
    for index, slot in live:
        yield drain_check(job, slot, job.model.rollout.drain_timeout_s, fail=False,
                          instance=index)
    yield ProxyCommands(tuple(c for i, slot in live for c in set_state(i, slot, "maint")),
                        "proxy: every server of the model in maintenance")
    return f"{len(live)} server(s) drained and out of rotation"


@operation("remove_containers")
def remove_containers(job: HostJob) -> Ops:
    """The model's proxy first (its stable ports close), then every serving container."""
    facts = job.facts
    if not facts.holds_model:
        return "nothing of the model here"
    removed = 0
    if facts.proxy_container:
        yield RemoveContainer(facts.proxy_container.name)
        removed += 1
    for container in facts.servers:
        yield RemoveContainer(container.name)
        removed += 1
    return f"{removed} container(s) removed" if removed else "no container"


@operation("remove_files")
def remove_files(job: HostJob) -> Ops:
    """Releases, ``current``, the proxy's directories, version digests, staged versions, the
    model's host-wide GPU records; the audit log (and the lock, held by this run) stay."""
    if not job.facts.holds_model:
        return "nothing of the model here"
    paths = job.paths
    for path in (paths.current, paths.releases, paths.proxy_dir, paths.admin_dir,
                 paths.digests):
        yield Command.of(remove_tree(path, root=paths.home), f"remove {path}")
    yield Command.of(remove_tree(paths.model_dir, root=paths.root),
                     f"remove {paths.model_dir}")
    if job.host.gpus:  # what its processes held is no longer the next plan's business
        yield Command.of(forget_model(paths.gpu_dir, job.model.name),
                         f"remove the model's GPU records under {paths.gpu_dir}")
    return f"files removed; {paths.audit_log} kept"
