"""The verbs' planners: from every selected host's facts to the run's context and one job per
host. A deploy renders the release for each host (its own image, ports, GPU fraction); a
rollback chooses the retained release to return to and rebuilds each host's job from the
record that host keeps of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ConfigError, ExitCode, HostUnreachable, Problem, TfsDeployError
from tfsdeploy.core.gates import Clock
from tfsdeploy.core.layout import HostPaths, host_paths, new_release_id
from tfsdeploy.core.records import GOOD, ReleaseRecord, ReleaseStatus
from tfsdeploy.core.render import FILE_NAMES, HostRender, RenderedFile
from tfsdeploy.core.target import Target, render_release
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.hosts.lock import current_user
from tfsdeploy.hosts.ssh import Connection
from tfsdeploy.run.jobs import ClientFactory, HostJob, InstanceJob, Planner, RunContext
from tfsdeploy.run.playbook import Playbook

Facts = dict[str, HostFacts | HostUnreachable]


class NothingReachable(TfsDeployError):
    """No selected host answered: a run that must restore a fleet could not act at all."""

    exit_code = ExitCode.INCONSISTENT


def _source_dir(target: Target, version: int) -> Path:
    return Path(target.model.source) / str(version)


def deploy_context(target: Target, version: int, *, clock: Clock,
                   client_factory: ClientFactory | None = None) -> RunContext:
    """A deploy's fleet-wide context; the version directory must exist locally."""
    model = target.model
    source = _source_dir(target, version)
    if not (source / "saved_model.pb").is_file():
        raise ConfigError(Problem(
            f"version {version} of {model.name} is not in its source ({source} has no "
            "saved_model.pb)", fix="pick a version that exists (see --version) or fix the "
            "model's source", file=target.inventory.path, field=f"models.{model.name}.source"))
    from tfsdeploy.core.golden import load_golden

    golden = load_golden(model.golden, version) if model.golden else []
    return RunContext(verb="deploy", model=model, version=version,
                      release_id=new_release_id(version), who=current_user(), clock=clock,
                      golden=golden, source_dir=str(source), client_factory=client_factory)


def job_for(context: RunContext, render: HostRender, conns: dict[str, Connection],
            facts: Facts, image: str, *, instances: list[InstanceJob] | None = None
            ) -> HostJob:
    """One host's job, with its facts (or the reason they could not be read); its instances
    are the render's unless given."""
    job = HostJob(run=context, host=render.host, conn=conns[render.host.name], render=render,
                  image=image, instances=instances or [])
    seen = facts[render.host.name]
    if isinstance(seen, HostUnreachable):
        job.unreachable = seen
    else:
        job.facts = seen
    return job


def deploy_planner(target: Target, renders: list[HostRender], context: RunContext,
                   conns: dict[str, Connection]) -> Planner:
    """The planner of a deploy: every host rolls the release rendered for it, with the image
    its own vars name."""
    def plan(facts: Facts) -> tuple[RunContext, list[HostJob]]:
        return context, [job_for(context, r, conns, facts, r.host.vars.image) for r in renders]

    return plan


def choose_rollback(target: Target, facts: dict[str, HostFacts], to: str | None) -> str:
    """``--to``, checked on every reachable host, or the newest release that served well on
    all of them, was never rolled back from, and is not what every host already runs."""
    if to:
        missing = [h for h, f in facts.items() if f.record(to) is None]
        if missing:
            raise ConfigError(Problem(
                f"release {to!r} is not retained on {', '.join(sorted(missing))}",
                fix="pick a release listed by `fab history --model "
                    f"{target.model.name}` on every host, or narrow --hosts"))
        return to
    good = [{r.id for r in f.releases if r.status in GOOD} for f in facts.values()]
    rolled_back = {r.id for f in facts.values() for r in f.releases
                   if r.status == ReleaseStatus.ROLLED_BACK}
    # "what every host runs" is what each recorded as current: a rollback killed after some
    # switches (traffic moved, not recorded) is then finished by running it again
    live = [f.current for f in facts.values()]
    everywhere = set(live) if all(live) and len(set(live)) == 1 else set()
    candidates = set.intersection(*good) - everywhere - rolled_back if good else set()
    if not candidates:
        raise ConfigError(Problem(
            "no retained release served well on every selected host (besides the current one)",
            fix=f"see `fab history --model {target.model.name}` and pass --to RELEASE, or "
                "narrow --hosts"))
    return max(candidates)


def rollback_render(target: Target, facts: HostFacts, record: ReleaseRecord,
                    files: dict[str, str]) -> HostRender:
    """A host's render of a retained release: the files it keeps of it, and the instances
    its record lists (one per GPU it ran on; a record written before instances were recorded
    ran one)."""
    from tfsdeploy.core.gpu import InstancePlan, plan_instances
    from tfsdeploy.core.render import placements

    host = next(h for h in target.hosts if h.name == facts.host)
    inventory = target.inventory
    placed = placements(inventory)
    co_located = [inventory.models[m] for m, on in placed.items() if host.name in on]
    planned = {p.index: p for p in plan_instances(host, target.model, co_located)}
    instances = tuple(
        planned[i.index] if i.index in planned and planned[i.index].gpus == i.gpus
        else InstancePlan(i.index, i.gpus, None)
        for i in sorted(record.instances, key=lambda i: i.index)) or (planned[0],)
    return HostRender(host=host, model=target.model, version=record.version,
                      gpu=instances[0].plan,
                      files=tuple(RenderedFile(n, files[n]) for n in FILE_NAMES),
                      instances=instances)


def recorded_instances(record: ReleaseRecord) -> list[InstanceJob]:
    """The instances a retained release ran, each with the GPU fraction it ran with."""
    return [InstanceJob(i.index, tuple(i.gpus), i.gpu_fraction)
            for i in sorted(record.instances, key=lambda i: i.index)]


def read_release_files(conn: Connection, paths: HostPaths, release_id: str) -> dict[str, str]:
    """The rendered files a host keeps of a retained release."""
    from tfsdeploy.hosts.commands.files import read_files

    directory = paths.release_dir(release_id)
    result = conn.run(read_files(directory, FILE_NAMES))
    texts = split_files(result.stdout) if result.ok else {}
    missing = [n for n in FILE_NAMES if n not in texts]
    if missing:
        raise ConfigError(Problem(f"release {release_id} on {conn.host.name} lacks "
                                  f"{', '.join(missing)}", fix="pick another release "
                                  "(`fab history`)", host=conn.host.name, file=directory))
    return texts


def split_files(text: str) -> dict[str, str]:
    """``read_files`` output -> file name -> content."""
    from tfsdeploy.hosts.facts import parse_sections

    return {argument: body + "\n" for argument, body in parse_sections(text).get("file", [])}


class GuardStops(TfsDeployError):
    """The guard does not roll back a release its own rollback made current: repeated
    breaches (an attack, a broken client) must not walk the fleet back through history."""

    exit_code = ExitCode.INCONSISTENT


def rollback_planner(target: Target, to: str | None, *, clock: Clock,
                     client_factory: ClientFactory | None, conns: dict[str, Connection],
                     by_guard: bool = False) -> Planner:
    """The planner of a rollback: the target release chosen from every reachable host's
    records; each host's job rebuilt from its own record and files of that release."""
    def plan(facts: Facts) -> tuple[RunContext, list[HostJob]]:
        reachable = {h: f for h, f in facts.items() if isinstance(f, HostFacts)}
        if not reachable:
            raise NothingReachable(
                "every selected host is unreachable: nothing was rolled back; a person must "
                "look (" + "; ".join(str(e) for e in facts.values()) + ")")
        if by_guard:
            guarded = [h for h, f in reachable.items()
                       if (r := f.record(f.current)) is not None and r.restored_by == "guard"]
            if guarded:
                raise GuardStops(
                    f"the live release on {', '.join(sorted(guarded))} is itself the guard's "
                    "rollback: the guard does not roll back again (it never walks the fleet "
                    "back through its history); a person must look")
        release_id = to or choose_rollback(target, reachable, None)
        if to:
            choose_rollback(target, reachable, to)
        from tfsdeploy.core.golden import load_golden

        first = next(f.record(release_id) for f in reachable.values())
        assert first is not None
        version = first.version
        context = RunContext(
            verb="rollback", model=target.model, version=version, release_id=release_id,
            who=current_user(), clock=clock, reason="guard" if by_guard else "",
            golden=load_golden(target.model.golden, version) if target.model.golden else [],
            source_dir=str(_source_dir(target, version)), client_factory=client_factory)
        jobs = []
        for host in target.hosts:
            seen = facts[host.name]
            if isinstance(seen, HostUnreachable):
                job = HostJob(run=context, host=host, conn=conns[host.name],
                              render=HostRender(host, target.model, version, None, ()),
                              image="")
                job.unreachable = seen
                jobs.append(job)
                continue
            record = seen.record(release_id)
            assert record is not None
            files = read_release_files(conns[host.name], host_paths(host, target.model),
                                       release_id)
            render = rollback_render(target, seen, record, files)
            jobs.append(job_for(context, render, conns, facts, record.image,
                                instances=recorded_instances(record)))
        return context, jobs

    return plan


__all__ = ["NothingReachable", "Playbook", "choose_rollback", "deploy_context", "deploy_planner",
           "render_release", "rollback_planner"]


class NothingToDo(TfsDeployError):
    """The command's work is already done (a promote of a promoted canary): exit 0."""

    exit_code = ExitCode.OK


def paused_canary(facts: dict[str, HostFacts]) -> tuple[ReleaseRecord | None, Any]:
    """The newest release a canary left on the hosts and the fleet's canary state
    (``canary.fleet_state``): a promoted one is done, and the older canaries behind it (an
    aborted one, say) are history, not something to promote or abort."""
    from tfsdeploy.core.canary import CanaryState, fleet_state

    found: dict[str, ReleaseRecord] = {}
    for host_facts in facts.values():
        for record in host_facts.releases:
            if (record.canary or {}).get("state"):
                found.setdefault(record.id, record)
    if not found:
        return None, None
    release = found[max(found)]
    states: list[CanaryState | None] = []
    for host_facts in facts.values():
        held = host_facts.record(release.id)
        raw = str((held.canary or {}).get("state")) if held else ""
        states.append(CanaryState(raw) if raw in {s.value for s in CanaryState} else None)
    return release, fleet_state(states)


def canary_planner(verb: str, target: Target, *, clock: Clock,
                   client_factory: ClientFactory | None, conns: dict[str, Connection]
                   ) -> Planner:
    """The planner of ``fab promote`` (the paused release rolled on, from where it paused)
    and ``fab abort`` (its hosts back on the old release)."""
    from tfsdeploy.core.canary import PlanAction, plan_abort, plan_promote

    def plan(facts: Facts) -> tuple[RunContext, list[HostJob]]:
        reachable = {h: f for h, f in facts.items() if isinstance(f, HostFacts)}
        if not reachable:
            raise NothingReachable(f"every host of {target.model.name} is unreachable: "
                                   f"nothing was {verb}d; a person must look")
        record, state = paused_canary(reachable)
        decided = (plan_promote if verb == "promote" else plan_abort)(
            state, model=target.model.name)
        if decided.action is PlanAction.REFUSE:
            raise ConfigError(decided.problem())
        if decided.action is PlanAction.NOTHING or record is None:
            raise NothingToDo(decided.message)
        context = deploy_context(target, record.version, clock=clock,
                                 client_factory=client_factory)
        context.verb = "deploy" if verb == "promote" else "abort"
        context.release_id = record.id
        renders = render_release(target, record.version)
        jobs = []
        for render in renders:
            job = job_for(context, render, conns, facts, render.host.vars.image)
            live = job.facts.record(record.id) if job.unreachable is None else None
            if live is not None and live.files != job.file_hashes() and verb == "promote":
                raise ConfigError(Problem(
                    f"the inventory now renders other files for {render.host.name} than the "
                    f"paused release {record.id} has", fix="restore the inventory as it was "
                    f"when the canary paused, or `fab abort --model {target.model.name}` and "
                    "deploy again", host=render.host.name, file=target.inventory.path))
            if live is not None and live.canary:
                job.canary_steps = list(live.canary.get("steps") or [])
                job.canary_comparison = live.canary.get("comparison")
            jobs.append(job)
        return context, jobs

    return plan
