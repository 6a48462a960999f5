"""Finalize, once every batch passed: stop the drained old releases (kept for rollback, or
left running for the rollback window) and prune releases beyond ``keep_releases``."""

from __future__ import annotations

from tfsdeploy.core.inventory.layout import container_name
from tfsdeploy.core.render.host_proxy import set_state
from tfsdeploy.core.rollout.records import GOOD, ReleaseStatus
from tfsdeploy.hosts.commands.files import point_symlink, remove_tree
from tfsdeploy.hosts.dockerapi import ContainerFact
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.run.changes import (
    Command,
    ProxyCommands,
    RemoveContainer,
    StopContainer,
    WriteFile,
)
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.roll import drain_check
from tfsdeploy.run.operations.step import Ops, operation


@operation("retire_old")
def retire_old(job: HostJob) -> Ops:
    """Stop the releases running outside the serving slot and prune old releases.

    On a host that a killed run had already rolled (``unchanged`` now), the old release it
    never retired is found the same way: running, but not in the slot that serves; a run
    killed between its switch and its drain left that slot draining, so it is drained and
    put in maintenance first, as ``drain_old`` does.
    """
    serving = {i.index: (i.old.slot if job.unchanged and i.old else i.new_slot)
               for i in job.instances}
    new = {i.index: container_name(job.model.name, job.run.release_id, i.index)
           for i in job.instances}
    leftovers = [c for c in job.facts.servers
                 if c.running and c.slot != serving.get(c.instance) and c.name != new.get(
                     c.instance)]
    window = job.model.rollout.window_s
    notes = []
    for container in leftovers:
        if window > 0:
            notes.append(f"{container.name} kept running (drained) for the {window:g} s "
                         "rollback window; the next deploy stops it")
            continue
        yield from _out_of_rotation(job, container)
        yield StopContainer(container.name)
        notes.append(f"stopped {container.name}")
    for container in _dead(job):
        yield RemoveContainer(container.name)
        notes.append(f"removed {container.name} ({container.state}: its instance was down; "
                     "its release's files stay for a rollback)")
    first = job.instances[0]
    if job.unchanged and first.old and job.facts.current != first.old.release:
        notes.append((yield from _finish_interrupted_record(job, first.old.release)))
    stopped = {c.name for c in leftovers} if window <= 0 else set()
    notes.append((yield from prune_releases(job, stopped)))
    return "; ".join(n for n in notes if n) or "nothing to retire"


def _dead(job: HostJob) -> list[ContainerFact]:
    """The containers, not running, of the servers the run found down (``discover``): left
    there, a restart policy could start one into ports or a GPU its replacement holds."""
    return [c for c in job.facts.servers
            if not c.running and (c.instance, c.slot) in job.down_slots]


def _out_of_rotation(job: HostJob, container: ContainerFact) -> Ops:
    """On a host a killed run had rolled (``unchanged``), a leftover's slot the proxy still
    had in rotation (draining) when this run read it: no request in flight there, then
    maintenance, before its container stops. Elsewhere this run's own steps took it out
    (``drain_old``; ``remove_instances`` for an instance the plan drops), and the facts read
    at the start no longer say how the proxy is."""
    proxy = job.facts.proxy
    kept = {i.index for i in job.instances}
    if not (job.unchanged and proxy.running and proxy.answered and container.slot
            and container.instance in kept):
        return ""
    states = {s.status.upper() for s in proxy.servers
              if s.slot == container.slot and s.instance == container.instance}
    if not states or all(s.startswith("MAINT") for s in states):
        return ""
    yield drain_check(job, container.slot, job.model.rollout.drain_timeout_s,
                      instance=container.instance, step="retire_old")
    yield ProxyCommands(tuple(set_state(container.instance, container.slot, "maint")),
                        f"proxy: {container.slot} of instance {container.instance} in "
                        "maintenance (left draining by an interrupted run)")
    return ""


def _finish_interrupted_record(job: HostJob, serving: str) -> Ops:
    """A killed run switched traffic but never recorded it: point ``current`` at the release
    that serves (the proxy's truth) and mark it serving; a rollback marks the release it
    returned from."""
    paths = job.paths
    record = job.facts.record(serving)
    if record is not None and record.status != ReleaseStatus.SERVING:
        yield WriteFile(f"{paths.release_dir(serving)}/manifest.json",
                        record.with_status(ReleaseStatus.SERVING).to_json())
    previous = job.facts.record(job.facts.current)
    if job.run.rollback and previous is not None and previous.id != serving:
        yield WriteFile(f"{paths.release_dir(previous.id)}/manifest.json",
                        previous.with_status(ReleaseStatus.ROLLED_BACK).to_json())
    yield Command.of(point_symlink(f"releases/{serving}", paths.current),
                     f"point {paths.current} at {serving}")
    return f"current -> {serving} (recorded after an interrupted run)"


def protected_releases(facts: HostFacts, *, window: bool = True) -> dict[str, str]:
    """The releases no prune may remove, whatever their containers' state, each with why
    (pure): the one ``current`` names; those whose containers sit in a slot the proxy serves
    (its runtime state, when it answers) or that its haproxy.cfg enables (what it serves
    after a restart); a paused canary; and, with ``window``, the rollback window: the release
    each of these replaced (a rollback's first target). A deploy's or rollback's own prune
    passes ``window=False``: once it rolled, its window is the release it replaced, which it
    keeps anyway."""
    why: dict[str, str] = {}
    if facts.current:
        why[facts.current] = "the `current` pointer names it"
    served = {(s.instance, s.slot) for s in facts.proxy.servers
              if s.takes_new_requests} if facts.proxy.answered else set()
    for place, reason in ((p, "the proxy serves its slot") for p in sorted(served)):
        for release in _in_slot(facts, place):
            why.setdefault(release, reason)
    for place in sorted(facts.configured_slots):
        for release in _in_slot(facts, place):
            why.setdefault(release, "the proxy's haproxy.cfg serves its slot")
    why.update({r.id: "a paused canary" for r in facts.releases
                if r.status == ReleaseStatus.PAUSED and r.id not in why})
    for live in list(why) if window else []:
        record = facts.record(live)
        if record is not None and record.previous and record.previous not in why:
            why[record.previous] = f"the rollback window ({live} replaced it)"
    return why


def _in_slot(facts: HostFacts, place: tuple[int, str]) -> list[str]:
    """The releases serving one (instance, slot) of the proxy: its running container; when
    none runs, the ``current`` release's if it sits there, else every container there (an
    old release's stopped container shares the slot with the one that replaced it)."""
    here = [c for c in facts.servers if (c.instance, c.slot) == place]
    chosen = ([c for c in here if c.running]
              or [c for c in here if c.release == facts.current] or here)
    return [c.release for c in chosen]


def doomed_releases(job: HostJob, stopped: set[str]) -> list[str]:
    """The releases beyond ``keep_releases`` that no rollback needs (pure).

    Only releases that served count: failed, reverted or interrupted attempts never push a
    rollback target out. Running releases, the one this run replaced, the one the live
    release replaced and every ``protected_releases`` (live, served, window: whatever their
    containers' state) are always kept; attempts newer than the oldest kept good release stay
    for post-mortems.
    """
    keep = job.model.rollout.keep_releases
    facts, run = job.facts, job.run
    status = {r.id: r.status for r in facts.releases}
    if not job.unchanged and run.verb == "deploy":
        status[run.release_id] = ReleaseStatus.SERVING
    this_run = {run.release_id} if run.release_id else set()  # a prune run rolls nothing
    releases = sorted(set(status) | {c.release for c in facts.servers} | this_run)
    good = [r for r in releases if status.get(r) in GOOD]
    running = {c.release for c in facts.servers if c.running and c.name not in stopped}
    kept = set(good[-keep:]) | running | this_run
    kept |= {i.old.release for i in job.instances if i.old}
    if not run.release_id:  # a prune: the release the live one replaced is a rollback's
        live = facts.record(job.old.release if job.old else facts.current)  # first target
        kept |= {live.previous} if live and live.previous else set()
    kept |= set(protected_releases(facts, window=not run.release_id))
    newest_good = good[-keep] if len(good) >= keep else ""
    return [r for r in releases if r not in kept and r < newest_good]


def prune_releases(job: HostJob, stopped: set[str]) -> Ops:
    """Remove the doomed releases' containers and directories."""
    doomed = doomed_releases(job, stopped)
    for release_id in doomed:
        for container in job.facts.of_release(release_id):
            yield RemoveContainer(container.name)
        yield Command.of(remove_tree(job.paths.release_dir(release_id), root=job.paths.home),
                         f"remove release {release_id}")
    return f"pruned {len(doomed)} old release(s)" if doomed else ""
