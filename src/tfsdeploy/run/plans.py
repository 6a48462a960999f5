"""Each verb's whole run plan, built in one place: the playbook, the images whose presence the
facts must report, the lock policy, and the planner that turns every selected host's facts
into the run's context and one job per host.

A deploy renders and validates the release for each host first (its own image, ports, GPU
fraction): a config error touches no host. A rollback chooses the retained release to return
to from the hosts' records and rebuilds each host's job from the record and files that host
keeps of it (the files read through the run's session). Promote and abort finish a paused
canary; prune judges each host from its own facts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tfsdeploy.core.canary.steps import (
    CanaryState,
    PlanAction,
    fleet_state,
    plan_abort,
    plan_promote,
)
from tfsdeploy.core.errors import ConfigError, ExitCode, HostUnreachable, Problem, TfsDeployError
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gpu import InstancePlan, plan_instances
from tfsdeploy.core.inventory.layout import new_release_id
from tfsdeploy.core.render.files import FILE_NAMES, HostRender, RenderedFile, placements
from tfsdeploy.core.rollout.records import GOOD, ReleaseRecord, ReleaseStatus
from tfsdeploy.core.target import Target, render_release
from tfsdeploy.core.tfserving.golden import GoldenExample, load_golden
from tfsdeploy.core.who import current_user
from tfsdeploy.hosts import logins
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.run.jobs import (
    DEFAULT_MAX_PULLS,
    Facts,
    HostJob,
    InstanceJob,
    Planner,
    RunContext,
    Session,
    Verb,
)
from tfsdeploy.run.playbook import Playbook, load_playbook, project_dir


@dataclass
class RunPlan:
    """What a verb asks the engine to run."""

    verb: Verb
    target: Target
    playbook: Playbook
    planner: Planner  # facts of every selected host -> the run's context and jobs
    images: Sequence[str] = ()  # images whose presence the facts must report
    lock_wait: float = 0.0
    version: int | None = None  # known before the run (a deploy); a rollback's is chosen later
    release: str = ""
    take_over: bool = False  # promote/abort: take the lock a paused canary holds
    # a deploy: the inventory's hosts outside the model's that still hold it are said (and
    # joined to the result) before it is recorded
    note_orphans: bool = False
    # sees the run's context once the planner chose the release (under the lock, before any
    # host is changed); raising stops the run there (hooks: a pre-hook's refusal)
    on_planned: Callable[[RunContext], None] | None = None


class NothingReachable(TfsDeployError):
    """No selected host answered: a run that must restore a fleet could not act at all."""

    exit_code = ExitCode.INCONSISTENT


class GuardStops(TfsDeployError):
    """The guard does not roll back a release its own rollback made current: repeated
    breaches (an attack, a broken client) must not walk the fleet back through history."""

    exit_code = ExitCode.INCONSISTENT


class LiveChanged(TfsDeployError):
    """What is live is no longer what the guard judged: it acts only on what it judged."""

    exit_code = ExitCode.INCONSISTENT


def refuse_changed(model: str, facts: dict[str, HostFacts], judged: Mapping[str, str],
                   *, why: str = "") -> None:
    """Raise LiveChanged when a host serves another release than the one judged there (read
    under the lock, before any change): the guard never rolls back a release it did not
    judge (a fix deployed while it waited for the lock, a canary that moved)."""
    moved = {host: facts[host].serving_release for host, release in judged.items()
             if host in facts and facts[host].serving_release != release}
    if not moved:
        return
    lines = "; ".join(f"{host}: judged {judged[host]}, live now {live or 'no single release'}"
                      for host, live in sorted(moved.items()))
    raise LiveChanged(
        f"what is live changed since the guard judged {model}{f' ({why})' if why else ''}: "
        f"{lines}; the guard acts only on what it judged, so nothing was changed; a person "
        f"must look (`fab status --model {model}`), or let the guard judge the new release")


class NothingToDo(TfsDeployError):
    """The command's work is already done (a promote of a promoted canary): exit 0."""

    exit_code = ExitCode.OK


def default_playbook(name: str, given: str | None) -> Playbook:
    """``--playbook``, or the project's ``playbooks/<name>.yml``."""
    return load_playbook(given or project_dir() / "playbooks" / f"{name}.yml")


def strategy_playbook(target: Target, name: str, given: str | None) -> Playbook:
    """``--playbook``, or the project's playbook ``name`` for the model's strategy (dual-slot:
    ``<name>.yml``; recreate: ``<name>-recreate.yml``)."""
    recreate = target.model.rollout.strategy == "recreate"
    return default_playbook(f"{name}-recreate" if recreate else name, given)


def _source_dir(target: Target, version: int) -> Path:
    return Path(target.model.source) / str(version)


def deployable_source(target: Target, version: int) -> Path:
    """The version's directory in the model's source; it must hold a SavedModel."""
    model = target.model
    source = _source_dir(target, version)
    if not (source / "saved_model.pb").is_file():
        raise ConfigError(Problem(
            f"version {version} of {model.name} is not in its source ({source} has no "
            "saved_model.pb)", fix="pick a version that exists (see --version) or fix the "
            "model's source", file=target.inventory.path, field=f"models.{model.name}.source"))
    return source


def golden_of(target: Target, version: int) -> list[GoldenExample]:
    """The version's golden requests (none when the model names no golden file)."""
    model = target.model
    return load_golden(model.golden, version) if model.golden else []


def context_for(target: Target, session: Session, *, verb: Verb, version: int,
                release_id: str, golden: list[GoldenExample], source_dir: str,
                reason: str = "", canary: CanaryPolicy | None = None) -> RunContext:
    """The run's fleet-wide context, on the session's clock and TFServing clients."""
    return RunContext(verb=verb, model=target.model, version=version, release_id=release_id,
                      who=current_user(), clock=session.clock, golden=golden,
                      source_dir=source_dir, client_factory=session.client_factory,
                      reason=reason, canary=canary, gateway=session.gateway)


def job_for(context: RunContext, host: ResolvedHost, render: HostRender, session: Session,
            facts: Facts, image: str, *, instances: list[InstanceJob] | None = None
            ) -> HostJob:
    """One host's job, with its facts (or the reason they could not be read); its instances
    are the render's unless given."""
    job = HostJob(run=context, host=host, conn=session.connections[host.name], render=render,
                  image=image, instances=instances or [])
    seen = facts[host.name]
    if isinstance(seen, HostUnreachable):
        job.unreachable = seen
    else:
        job.facts = seen
        _leave_out_absent_gpus(job)
    return job


def _leave_out_absent_gpus(job: HostJob) -> None:
    """An instance whose GPU the host does not report (it fell off the bus, the host came
    back with a card less) is left out of the plan: the host serves on the GPUs it has (the
    proxy takes the instance out like one the inventory dropped), and the next run that sees
    the GPU again brings the instance back. A host that reports none of them keeps its plan:
    `check_gpu` refuses it."""
    if not job.host.gpus or len(job.instances) < 2:
        return
    present = {g.index for g in job.facts.gpus}
    kept = [i for i in job.instances if set(i.gpus) <= present]
    if not kept or len(kept) == len(job.instances):
        return
    job.absent_gpus = tuple(sorted({g for i in job.instances for g in i.gpus} - present))
    job.instances = kept
    job.instance = kept[0]


# -- deploy ------------------------------------------------------------------------------------

def check_transfer(target: Target) -> None:
    """Every selected host with ``model_transfer: pull`` names a ``model_registry``, and every
    pull login the hosts name can be read (a config error, before any connection,
    otherwise)."""
    for host in target.hosts:
        logins.check_references(host.vars.pull_logins)
    missing = sorted(h.name for h in target.hosts
                     if h.vars.model_transfer == "pull" and not h.vars.model_registry)
    if missing:
        raise ConfigError(Problem(
            f"model_transfer is 'pull' but no model_registry is set for "
            f"{', '.join(missing)}", fix="set model_registry (e.g. "
            "'registry:5000/tfsdeploy-models') where model_transfer is set, or use "
            "model_transfer 'push'", file=target.inventory.path, field="model_registry"))


def pull_slots(max_pulls: int | None) -> threading.BoundedSemaphore:
    """How many hosts pull a model version at once (``--max-pulls``)."""
    return threading.BoundedSemaphore(max_pulls or DEFAULT_MAX_PULLS)


def stage_plan(target: Target, *, version: int | str | None = None,
               playbook: str | None = None, lock_wait: float = 0.0,
               max_pulls: int | None = None) -> RunPlan:
    """A stage: the version put in place on every selected host ahead of a release (the
    deploy's stage step, alone); nothing serving is touched."""
    check_transfer(target)
    renders = render_release(target, version)
    chosen = renders[0].version
    source = deployable_source(target, chosen)

    def plan(facts: Facts, session: Session) -> tuple[RunContext, list[HostJob]]:
        context = context_for(target, session, verb=Verb.STAGE, version=chosen,
                              release_id="", golden=[], source_dir=str(source))
        context.pull_slots = pull_slots(max_pulls)
        return context, [job_for(context, r.host, r, session, facts, r.host.vars.image)
                         for r in renders]

    return RunPlan(verb=Verb.STAGE, target=target, playbook=default_playbook("stage", playbook),
                   planner=plan, lock_wait=lock_wait, version=chosen)


def deploy_plan(target: Target, *, version: int | str | None = None,
                playbook: str | None = None, lock_wait: float = 0.0,
                canary: CanaryPolicy | None = None, max_pulls: int | None = None) -> RunPlan:
    """A deploy: every host rolls the release rendered for it, with the image its own vars
    name. Everything is rendered and validated here, before any connection; the canary
    policy is ``canary`` (the command line's) or the model's."""
    check_transfer(target)
    renders = render_release(target, version)
    chosen = renders[0].version
    source = deployable_source(target, chosen)
    golden = golden_of(target, chosen)
    release_id = new_release_id(chosen)
    policy = canary or target.model.rollout.canary

    def plan(facts: Facts, session: Session) -> tuple[RunContext, list[HostJob]]:
        context = context_for(target, session, verb=Verb.DEPLOY, version=chosen,
                              release_id=release_id, golden=golden, source_dir=str(source),
                              canary=policy)
        context.pull_slots = pull_slots(max_pulls)
        return context, [job_for(context, r.host, r, session, facts, r.host.vars.image)
                         for r in renders]

    images = sorted({r.host.vars.image for r in renders}
                    | {r.host.vars.proxy_image for r in renders})
    return RunPlan(verb=Verb.DEPLOY, target=target,
                   playbook=strategy_playbook(target, "deploy", playbook), planner=plan,
                   images=images, lock_wait=lock_wait, version=chosen, release=release_id,
                   note_orphans=True)


# -- rollback ----------------------------------------------------------------------------------

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


def rollback_plan(target: Target, *, to: str | None = None, playbook: str | None = None,
                  lock_wait: float = 0.0, by_guard: bool = False,
                  judged: Mapping[str, str] | None = None) -> RunPlan:
    """A rollback: the release chosen from every reachable host's records (``to``, or the
    newest good on all of them); each host's job rebuilt from its own record and files of that
    release. ``by_guard``: the SLO guard's, which never rolls back its own rollback;
    ``judged``: the release the guard judged on each host (refused when another is live)."""
    def plan(facts: Facts, session: Session) -> tuple[RunContext, list[HostJob]]:
        reachable = {h: f for h, f in facts.items() if isinstance(f, HostFacts)}
        if not reachable:
            raise NothingReachable(
                "every selected host is unreachable: nothing was rolled back; a person must "
                "look (" + "; ".join(str(e) for e in facts.values()) + ")")
        if judged:
            refuse_changed(target.model.name, reachable, judged)
        if by_guard:
            _refuse_guards_own(reachable)
        release_id = to or choose_rollback(target, reachable, None)
        if to:
            choose_rollback(target, reachable, to)
        first = next(f.record(release_id) for f in reachable.values())
        assert first is not None
        version = first.version
        context = context_for(target, session, verb=Verb.ROLLBACK, version=version,
                              release_id=release_id, golden=golden_of(target, version),
                              source_dir=str(_source_dir(target, version)),
                              reason="guard" if by_guard else "")
        return context, [_rollback_job(target, context, host, session, facts)
                         for host in target.hosts]

    return RunPlan(verb=Verb.ROLLBACK, target=target,
                   playbook=strategy_playbook(target, "rollback", playbook), planner=plan,
                   images=sorted({h.vars.proxy_image for h in target.hosts}),
                   lock_wait=lock_wait)


def _refuse_guards_own(reachable: dict[str, HostFacts]) -> None:
    guarded = [h for h, f in reachable.items()
               if (r := f.record(f.current)) is not None and r.restored_by == "guard"]
    if guarded:
        raise GuardStops(
            f"the live release on {', '.join(sorted(guarded))} is itself the guard's "
            "rollback: the guard does not roll back again (it never walks the fleet "
            "back through its history); a person must look")


def _rollback_job(target: Target, context: RunContext, host: ResolvedHost, session: Session,
                  facts: Facts) -> HostJob:
    """A host's job of a rollback: from the record and files it keeps of the release (an
    unreachable host's job says so)."""
    seen = facts[host.name]
    if isinstance(seen, HostUnreachable):
        return job_for(context, host, HostRender(host, target.model, context.version, None, ()),
                       session, facts, "")
    record = seen.record(context.release_id)
    assert record is not None
    files = session.release_files(host, target.model, context.release_id)
    render = rollback_render(target, seen, record, files)
    return job_for(context, host, render, session, facts, record.image,
                   instances=recorded_instances(record))


# -- promote and abort of a paused canary ------------------------------------------------------

def paused_canary(facts: dict[str, HostFacts]) -> tuple[ReleaseRecord | None, CanaryState | None]:
    """The newest release a canary left on the hosts and the fleet's canary state
    (``canary.fleet_state``): a promoted one is done, and the older canaries behind it (an
    aborted one, say) are history, not something to promote or abort."""
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


def split_releases(facts: HostFacts, instance: int = 0) -> tuple[str, str] | None:
    """(old, new) release when the host's proxy shares an instance's new requests between two
    running releases (a canary's weights); None otherwise. The new one is the newer id (ids
    are UTC times), the old the other."""
    sharing = facts.taking_requests(instance)
    releases = sorted({c.release for c in sharing})
    if len(sharing) != 2 or len(releases) != 2:
        return None
    return releases[0], releases[1]


def interrupted_canary(facts: Mapping[str, HostFacts]
                       ) -> tuple[ReleaseRecord, dict[str, str]] | None:
    """A canary run killed at a split weight: hosts whose proxy shares the traffic between
    two releases while no host records the newer one's canary as paused (or promoting,
    aborting). Its release's record (as a host keeps it) and, per split host, the slot the
    canary serves from; None when there is none."""
    split: dict[str, dict[str, str]] = {}
    records: dict[str, ReleaseRecord] = {}
    for host, host_facts in facts.items():
        found = split_releases(host_facts)
        if found is None:
            continue
        new = found[1]
        record = host_facts.record(new)
        slot = next((c.slot for c in host_facts.taking_requests(0) if c.release == new), "")
        state = str((record.canary or {}).get("state")) if record else ""
        if record is None or state in {s.value for s in CanaryState} - {"running"}:
            continue
        records.setdefault(new, record)
        split.setdefault(new, {})[host] = slot
    if not split:
        return None
    newest = max(split)
    return records[newest], split[newest]


def canary_under_way(facts: Mapping[str, HostFacts]
                     ) -> tuple[ReleaseRecord | None, CanaryState | None, bool]:
    """The canary promote, abort and the guard act on: (its release's record, its state,
    whether it is an interrupted one). A recorded canary unless a newer release splits some
    host's traffic with no pause recorded: that one is then the canary, in state running (a
    killed run's steps: abort undoes it, promote finishes it)."""
    record, state = paused_canary(dict(facts))
    interrupted = interrupted_canary(facts)
    if interrupted is not None and (record is None or interrupted[0].id > record.id
                                    or state in (CanaryState.DONE, CanaryState.ABORTED)):
        return interrupted[0], CanaryState.RUNNING, True
    return record, state, False


OPEN_CANARY = frozenset({CanaryState.RUNNING, CanaryState.PAUSED, CanaryState.PROMOTING,
                         CanaryState.ABORTING})


def canary_open(facts: Mapping[str, HostFacts], release: str) -> list[str]:
    """The hosts where the canary of ``release`` is not finished: a record keeps it running,
    paused, promoting or aborting, or the proxy shares the traffic with it."""
    found = []
    for host, host_facts in facts.items():
        record = host_facts.record(release)
        state = str((record.canary or {}).get("state")) if record else ""
        split = split_releases(host_facts)
        if state in OPEN_CANARY or (split is not None and release in split):
            found.append(host)
    return sorted(found)


def canary_plan(verb: Verb, target: Target, *, lock_wait: float = 0.0,
                judged: str | None = None) -> RunPlan:
    """``fab promote`` (the paused release rolled on, from where it paused: its canary hosts
    switch fully, the other hosts roll in their batches) or ``fab abort`` (its hosts back on
    the old release at 100 %). Either takes the lock the paused canary holds. An interrupted
    canary (a killed run's split, no pause recorded) is finished or undone the same way.
    ``judged``: the canary release the guard judged (refused when another is under way)."""
    def plan(facts: Facts, session: Session) -> tuple[RunContext, list[HostJob]]:
        reachable = {h: f for h, f in facts.items() if isinstance(f, HostFacts)}
        if not reachable:
            raise NothingReachable(f"every host of {target.model.name} is unreachable: "
                                   f"nothing was {verb}d; a person must look")
        record, state, interrupted = canary_under_way(reachable)
        if judged is not None and (record is None or record.id != judged):
            raise LiveChanged(
                f"the guard judged the canary {judged} of {target.model.name}, but the canary "
                f"under way now is {record.id if record else 'none'}: the guard acts only on "
                "what it judged, so nothing was changed; a person must look "
                f"(`fab status --model {target.model.name}`)")
        decided = (plan_promote if verb is Verb.PROMOTE else plan_abort)(
            CanaryState.PAUSED if interrupted else state, model=target.model.name)
        if decided.action is PlanAction.REFUSE:
            raise ConfigError(decided.problem())
        if decided.action is PlanAction.NOTHING or record is None:
            raise NothingToDo(decided.message)
        source = deployable_source(target, record.version)
        # a promote rolls the paused release on as a deploy does
        context = context_for(target, session,
                              verb=Verb.DEPLOY if verb is Verb.PROMOTE else Verb.ABORT,
                              version=record.version, release_id=record.id,
                              golden=golden_of(target, record.version), source_dir=str(source))
        return context, [_canary_job(verb, target, context, render, record, session, facts)
                         for render in render_release(target, record.version)]

    playbook = (strategy_playbook(target, "deploy", None) if verb is Verb.PROMOTE
                else default_playbook("abort", None))
    return RunPlan(verb=verb, target=target, playbook=playbook, planner=plan,
                   images=sorted({h.vars.image for h in target.hosts}
                                 | {h.vars.proxy_image for h in target.hosts}),
                   lock_wait=lock_wait, take_over=True)


def _canary_job(verb: Verb, target: Target, context: RunContext, render: HostRender,
                record: ReleaseRecord, session: Session, facts: Facts) -> HostJob:
    """A host's job of a promote or abort, with the canary's steps its record kept; a promote
    refuses a host whose files the inventory now renders otherwise."""
    host = render.host
    job = job_for(context, host, render, session, facts, host.vars.image)
    live = job.facts.record(record.id) if job.unreachable is None else None
    if live is not None and live.files != job.file_hashes() and verb is Verb.PROMOTE:
        raise ConfigError(Problem(
            f"the inventory now renders other files for {host.name} than the "
            f"paused release {record.id} has", fix="restore the inventory as it was "
            f"when the canary paused, or `fab abort --model {target.model.name}` and "
            "deploy again", host=host.name, file=target.inventory.path))
    if live is not None and live.canary:
        job.canary_steps = list(live.canary.get("steps") or [])
        job.canary_comparison = live.canary.get("comparison")
    return job


# -- prune -------------------------------------------------------------------------------------

def prune_plan(target: Target, *, playbook: str | None = None, lock_wait: float = 0.0
               ) -> RunPlan:
    """A prune: every selected host's job, judged from its own facts (no release is
    rolled)."""
    def plan(facts: Facts, session: Session) -> tuple[RunContext, list[HostJob]]:
        context = context_for(target, session, verb=Verb.PRUNE, version=0, release_id="",
                              golden=[], source_dir="")
        return context, [job_for(context, host, HostRender(host, target.model, 0, None, ()),
                                 session, facts, "") for host in target.hosts]

    return RunPlan(verb=Verb.PRUNE, target=target, playbook=default_playbook("prune", playbook),
                   planner=plan, lock_wait=lock_wait)


# -- retire ------------------------------------------------------------------------------------

def retire_plan(target: Target, *, playbook: str | None = None, lock_wait: float = 0.0
                ) -> RunPlan:
    """A retirement: the model taken off every selected host (out of rotation, drained,
    containers and proxy removed, its files removed but the audit log), each host judged from
    its own facts; other models are never touched."""
    def plan(facts: Facts, session: Session) -> tuple[RunContext, list[HostJob]]:
        context = context_for(target, session, verb=Verb.RETIRE, version=0, release_id="",
                              golden=[], source_dir="")
        return context, [job_for(context, host, HostRender(host, target.model, 0, None, ()),
                                 session, facts, "") for host in target.hosts]

    return RunPlan(verb=Verb.RETIRE, target=target,
                   playbook=default_playbook("retire", playbook), planner=plan,
                   lock_wait=lock_wait)
