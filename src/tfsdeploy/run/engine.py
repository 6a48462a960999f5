"""The engine owns a run: the hosts' connections, the fleet lock, Ctrl-C/SIGTERM/SIGHUP, the
facts read once, the playbook's phases, batches, rescue and the exit code.

The loop is explicit: every host's facts are read under the lock, the verb's planner turns them
into one job per host, then each phase runs its task list, on every host at once or batch by
batch. The first failure beyond the threshold stops the roll; the failed host runs the phase's
``rescue`` tasks, and the hosts already rolled run them too under ``on_failure: revert``. The
exit code says where the run stood: nothing serving changed (1), every host back on its
previous release (2), the fleet not consistent (3).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from tfsdeploy.core.batches import plan_batches, threshold_exceeded
from tfsdeploy.core.errors import ExitCode, HostUnreachable, TfsDeployError
from tfsdeploy.core.fleet import ResolvedHost
from tfsdeploy.core.gates import Clock, GateFailed
from tfsdeploy.core.layout import host_paths
from tfsdeploy.core.records import StepRecord
from tfsdeploy.core.target import Target
from tfsdeploy.hosts import lock
from tfsdeploy.hosts.facts import HostFacts, gather
from tfsdeploy.hosts.ssh import Connection
from tfsdeploy.run.changes import Change
from tfsdeploy.run.executor import run_step
from tfsdeploy.run.jobs import HostJob, Planner, RunContext
from tfsdeploy.run.operations import registry
from tfsdeploy.run.playbook import Phase, Playbook, Task


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP arrived: stop at the next step boundary and restore."""

if TYPE_CHECKING:
    from tfsdeploy.hosts.dockerssh import PullProgress


class Reporter(Protocol):
    """Where progress goes (the CLI prints it; tests record it)."""

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """One step finished (status: ok, failed, restored ...)."""

    def note(self, text: str) -> None:
        """A fleet-level message."""


class CancellableClock:
    """A clock whose sleep raises Interrupted once the run is cancelled."""

    def __init__(self, inner: Clock, cancel: threading.Event) -> None:
        self._inner, self._cancel = inner, cancel

    def now(self) -> float:
        """The inner clock's time."""
        return self._inner.now()

    def sleep(self, seconds: float) -> None:
        """Sleep, unless cancelled."""
        if self._cancel.is_set():
            raise Interrupted()
        self._inner.sleep(seconds)
        if self._cancel.is_set():
            raise Interrupted()


@dataclass
class HostOutcome:
    """How one host ended."""

    host: str
    status: str  # rolled, unchanged, failed, restored, reverted, unreachable, skipped, unknown
    error: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    release: str = ""
    diagnosis: dict[str, str] | None = None  # a failed gate's known failure: cause and fix


@dataclass
class RunResult:
    """The whole run, for people and machines."""

    model: str
    version: int
    release_id: str
    exit_code: ExitCode = ExitCode.OK
    message: str = ""
    hosts: dict[str, HostOutcome] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"model": self.model, "version": self.version, "release": self.release_id,
                "exit_code": int(self.exit_code), "result": self.exit_code.name.lower(),
                "message": self.message, "seconds": round(self.seconds, 3),
                "hosts": {n: o.__dict__ for n, o in self.hosts.items()}}


DeployResult = RunResult


@dataclass
class Roll:
    """Everything the phases of one run share."""

    playbook: Playbook
    context: RunContext
    jobs: list[HostJob]
    reporter: Reporter
    cancel: threading.Event
    serial: Sequence[int | str]
    max_fail_percentage: float
    on_failure: str
    result: RunResult
    failed: set[str] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)  # hosts where what serves was changed

    def outcome(self, job: HostJob) -> HostOutcome:
        """The host's outcome record (created on first use)."""
        if job.name not in self.result.hosts:
            self.result.hosts[job.name] = HostOutcome(job.name, "pending",
                                                      release=self.context.release_id)
        return self.result.hosts[job.name]

    def progress(self, host: str, update: PullProgress) -> None:
        """Pull progress goes to the reporter when it shows progress."""
        show = getattr(self.reporter, "progress", None)
        if show is not None:
            show(host, update)

    def event(self, kind: str, **data: Any) -> None:
        """A run event (batch started, host rolled, gate failed) for reporters that take
        them (notifications)."""
        emit(self.reporter, kind, **data)


def emit(reporter: Reporter, kind: str, **data: Any) -> None:
    """Give ``reporter`` a run event if it takes events; a reporter's failure never stops the
    run."""
    take = getattr(reporter, "event", None)
    if take is not None:
        try:
            take(kind, **data)
        except Exception:  # notifications are best effort by design
            return


def run_tasks(roll: Roll, job: HostJob, phase: str, tasks: Sequence[Task]) -> None:
    """Run a task list on one host, recording each step; raise on the first failure."""
    operations = registry()
    if job.unreachable is not None:
        raise job.unreachable
    for task in tasks:
        if roll.cancel.is_set():
            raise Interrupted()
        started = time.monotonic()
        try:
            outcome = run_step(job, task.action, operations[task.action], task.params,
                               check=False, on_progress=roll.progress)
        except BaseException as error:
            seconds = time.monotonic() - started
            pause = is_pause(error)  # the canary holds its last weight: not a failure
            detail = pause_detail(roll, error) if pause else describe(error)
            _record_step(job, phase, task.action, pause, seconds, detail)
            roll.reporter.step(job.name, phase, task.action, "paused" if pause else "failed",
                               seconds, detail)
            if not pause and is_gate(task.action):
                roll.event("gate_failed", host=job.name, gate=task.action, message=detail)
            raise
        finally:
            if job.touched:
                roll.touched.add(job.name)
        seconds = time.monotonic() - started
        _record_step(job, phase, task.action, True, seconds, outcome.detail)
        roll.reporter.step(job.name, phase, task.action, "ok", seconds, outcome.detail)


def is_gate(step: str) -> bool:
    """Whether a failure of ``step`` is a gate's verdict: a ``gate_*`` step, or a canary step
    judged on live traffic."""
    return step.startswith("gate_") or step == "canary_steps"


def pause_detail(roll: Roll, pause: BaseException) -> str:
    """A paused canary's progress line: the weight it holds, and how to finish it."""
    model = roll.context.model.name
    return (f"{pause}: `fab promote --model {model}` finishes the roll, "
            f"`fab abort --model {model}` returns it to the old release")


def describe(error: BaseException) -> str:
    """An error in one line for people: its message, or its kind when it has none (a defect
    of ours, named as such)."""
    if isinstance(error, (TfsDeployError, GateFailed, Interrupted)):
        return str(error) or type(error).__name__
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _record_step(job: HostJob, phase: str, step: str, ok: bool, seconds: float,
                 detail: str) -> None:
    job.steps.append(StepRecord(phase=phase, step=step, ok=ok, seconds=round(seconds, 3),
                                detail=detail[:2000]))


def roll_host(roll: Roll, job: HostJob, phase: str, tasks: Sequence[Task]) -> None:
    """Run a batch phase's tasks on one host, instance by instance (the host's other
    instances keep serving meanwhile); raise on the first failure, with ``job.inst`` the
    instance that failed."""
    for instance in job.instances:
        run_tasks(roll, job.on(instance), phase, tasks)


def run_parallel(roll: Roll, phase: Phase, jobs: list[HostJob], tasks: Sequence[Task]
                 ) -> dict[str, BaseException | None]:
    """Run ``tasks`` on ``jobs`` at once (at most ``forks``), per instance in a batch phase;
    Ctrl-C cancels cleanly."""
    errors: dict[str, BaseException | None] = {}
    if not jobs:
        return errors
    body = roll_host if phase.mode == "batches" else run_tasks
    with ThreadPoolExecutor(max_workers=max(1, min(roll.playbook.forks, len(jobs)))) as pool:
        futures: dict[Future[None], HostJob] = {
            pool.submit(body, roll, job, phase.name, tasks): job for job in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                errors[futures[future].name] = future.exception()
    return errors


def run_phases(roll: Roll) -> RunResult:
    """Run the playbook's phases; the exit code follows the README's table."""
    active = list(roll.jobs)
    for phase in roll.playbook.phases:
        if phase.mode == "batches":
            for job in active:
                if job.unchanged:
                    roll.outcome(job).status = "unchanged"
            if not roll_batches(roll, phase, [j for j in active if not j.unchanged]):
                return roll.result
            # unchanged hosts go on too: a later phase retires what a killed run left behind
            active = [j for j in active if j.name not in roll.failed]
            continue
        passed = run_fleet_phase(roll, phase, active)
        if passed is None:
            return roll.result
        active = passed
    for job in active:
        if roll.outcome(job).status == "pending":
            roll.outcome(job).status = "rolled"
    if roll.failed:
        finish(roll, ExitCode.INCONSISTENT,
               f"{len(roll.failed)} host(s) failed within the allowed threshold and still "
               f"serve their previous release: {', '.join(sorted(roll.failed))}")
    elif roll.context.verb == "abort":  # the release in the context is the one aborted
        finish(roll, ExitCode.OK, f"canary {roll.context.release_id} aborted: every host "
               "serves the release it served before the canary")
    else:
        finish(roll, ExitCode.OK, f"every host serves {roll.context.release_id}")
    return roll.result


def _stopped_code(roll: Roll) -> ExitCode:
    """A stop before anything serving changed is 'nothing changed' (1), after it 3."""
    return ExitCode.INCONSISTENT if roll.touched else ExitCode.INVALID


def run_fleet_phase(roll: Roll, phase: Phase, jobs: list[HostJob]) -> list[HostJob] | None:
    """A parallel phase; returns the hosts that passed, or None when the run must stop."""
    errors = run_parallel(roll, phase, jobs, phase.tasks)
    failed = [j for j in jobs if errors.get(j.name)]
    for job in failed:
        error = errors[job.name]
        roll.outcome(job).status = "unreachable" if isinstance(error, HostUnreachable) \
            else "failed"
        roll.outcome(job).error = describe(error) if error else ""
        roll.outcome(job).diagnosis = job.diagnosis.as_dict() if job.diagnosis else None
        roll.failed.add(job.name)
    if roll.cancel.is_set():
        code = _stopped_code(roll)
        finish(roll, code, f"interrupted during {phase.name}; "
               + ("no serving container was changed" if code == ExitCode.INVALID
                  else "the fleet may be mixed: look at the hosts"))
        return None
    if failed and roll.touched:
        finish(roll, ExitCode.INCONSISTENT, f"{phase.name} failed on "
               + ", ".join(j.name for j in failed) + " after serving containers changed")
        return None
    if threshold_exceeded(len(roll.failed), len(roll.jobs), roll.max_fail_percentage):
        finish(roll, ExitCode.INVALID, f"{phase.name} failed on "
               f"{', '.join(sorted(roll.failed))}; nothing serving was changed")
        return None
    return [j for j in jobs if j.name not in roll.failed]


def roll_batches(roll: Roll, phase: Phase, jobs: list[HostJob]) -> bool:
    """Roll batch by batch; on a stop, rescue and apply the policy. True to go on."""
    rolled: list[HostJob] = []
    batches = plan_batches(jobs, roll.serial)
    roll.context.canary_hosts = frozenset(j.name for j in batches[0]) if batches else frozenset()
    for number, batch in enumerate(batches, start=1):
        roll.reporter.note(f"batch {number}/{len(batches)}: "
                           + ", ".join(j.name for j in batch))
        roll.event("batch_started", batch=number, batches=len(batches),
                   hosts=[j.name for j in batch])
        errors = run_parallel(roll, phase, batch, phase.tasks)
        paused = [j for j in batch if is_pause(errors.get(j.name))]
        for job in paused:
            roll.outcome(job).status = "paused"
            rolled.append(job)
        for job in batch:
            error = errors.get(job.name)
            if is_pause(error):
                continue
            if error is None:
                rolled.append(job)
                roll.outcome(job).status = "rolled"
                roll.event("host_rolled", host=job.name, release=roll.context.release_id,
                           seconds=sum(s.seconds for s in job.steps if s.phase == phase.name))
                continue
            roll.failed.add(job.name)
            roll.outcome(job).error = describe(error)
            roll.outcome(job).diagnosis = job.diagnosis.as_dict() if job.diagnosis else None
            # revert: the whole host goes back; stay: only the instance that failed
            roll.outcome(job).status = rescue_host(roll, phase, job,
                                                   every=roll.on_failure == "revert")
        stop = roll.cancel.is_set() or threshold_exceeded(
            len(roll.failed), len(roll.jobs), roll.max_fail_percentage)
        if stop:
            stop_roll(roll, phase, rolled, batches[number:])
            return False
        if paused:
            pause_roll(roll, paused, batches[number:])
            return False
    return True


def is_pause(error: BaseException | None) -> bool:
    """Whether a host's roll ended holding a paused canary (not a failure)."""
    from tfsdeploy.run.operations.canary import CanaryPaused

    return isinstance(error, CanaryPaused)


def pause_roll(roll: Roll, paused: list[HostJob], untouched: list[list[HostJob]]) -> None:
    """The canary holds at its last weight: the run ends, the lock stays with the paused
    release, the hosts not reached stay ``pending`` until ``fab promote`` rolls them."""
    for batch in untouched:
        for job in batch:
            roll.outcome(job).status = "pending"
    policy = roll.context.canary
    weight = policy.weights[-1] if policy else 0
    roll.event("paused", hosts=[j.name for j in paused], weight=weight)
    finish(roll, ExitCode.PAUSED,
           f"canary paused at {weight}% on {', '.join(j.name for j in paused)}: "
           f"`fab promote --model {roll.context.model.name}` finishes the roll, "
           f"`fab abort --model {roll.context.model.name}` returns them to the old release")


def stop_roll(roll: Roll, phase: Phase, rolled: list[HostJob],
              untouched: list[list[HostJob]]) -> None:
    """After a stop: revert or keep the rolled hosts, and set the exit code."""
    for batch in untouched:
        for job in batch:
            roll.outcome(job).status = "skipped"
    reverted_ok = True
    if roll.on_failure == "revert":
        for job in rolled:
            status = rescue_host(roll, phase, job, every=True)
            roll.outcome(job).status = status
            reverted_ok &= status == "reverted"
    restored_ok = all(roll.result.hosts[n].status in ("restored", "reverted")
                      for n in roll.failed if n in roll.result.hosts)
    why = "interrupted" if roll.cancel.is_set() else "a gate failed"
    if roll.on_failure == "revert" and reverted_ok and restored_ok:
        finish(roll, ExitCode.ROLLED_BACK, f"{why}; every host serves its previous release")
    else:
        finish(roll, ExitCode.INCONSISTENT,
               f"{why}; the fleet is mixed or a host could not be restored: look at the hosts")


def rescue_host(roll: Roll, phase: Phase, job: HostJob, *, every: bool = False) -> str:
    """Run the phase's rescue tasks for the host's current instance (the one that failed) or,
    with ``every``, for each instance the run changed, last rolled first; returns the host's
    final status."""
    if not phase.rescue:
        return "failed"
    started = time.monotonic()
    had_traffic = job.took_any_traffic
    chosen = [job.inst] + ([i for i in reversed(job.instances)
                            if i is not job.inst and i.touched] if every else [])
    try:
        for instance in chosen:
            job.on(instance)
            for task in phase.rescue:  # never cancelled: a second Ctrl-C cannot cut a restore
                begun = time.monotonic()
                outcome = run_step(job, task.action, registry()[task.action], task.params,
                                   check=False, on_progress=roll.progress)
                _record_step(job, "restore", task.action, True, time.monotonic() - begun,
                             outcome.detail)
    except Exception as error:  # the host may be unreachable: a person must look
        roll.reporter.step(job.name, "restore", "restore", "failed",
                           time.monotonic() - started, describe(error))
        return "unknown"
    first = job.instances[0]
    previous = first.old.release if first.old else "no release (first deploy)"
    restored = "" if len(job.instances) == 1 else \
        f" ({len(chosen)} of {len(job.instances)} instance(s) restored)"
    roll.reporter.step(job.name, "restore", "restore", "ok", time.monotonic() - started,
                       f"back on {previous}{restored}")
    return "reverted" if had_traffic else "restored"


def finish(roll: Roll, code: ExitCode, message: str) -> None:
    """Set the run's result; every host appears in it, even those never reached (a paused
    run's are still to roll: they stay ``pending``)."""
    roll.result.exit_code = code
    roll.result.message = message
    for job in roll.jobs:
        outcome = roll.outcome(job)
        outcome.steps = [s.model_dump() for s in job.steps]
        if outcome.status == "pending" and code != ExitCode.PAUSED:
            outcome.status = "skipped"


# -- a run: connections, lock, facts, signals ---------------------------------------------

@contextmanager
def interrupts_cancel(cancel: threading.Event, reporter: Reporter) -> Iterator[None]:
    """Ctrl-C, SIGTERM (cron, systemd) and SIGHUP (the operator's SSH session dropped) ask the
    run to stop: the current steps finish, the hosts are restored, the lock is released. The
    handler never raises, so a second signal cannot cut a restore or the release short."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if cancel.is_set():
            reporter.note("already stopping: restoring, then releasing the lock")
            return
        cancel.set()
        reporter.note(f"{signal.Signals(signum).name}: finishing the current steps, then "
                      "restoring; the lock is released at the end")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


ConnectionFactory = Callable[[ResolvedHost], Connection]


@dataclass
class RunPlan:
    """What a verb asks the engine to run."""

    verb: str
    target: Target
    playbook: Playbook
    planner: Planner  # facts of every selected host -> the run's context and jobs
    images: Sequence[str] = ()  # images whose presence the facts must report
    lock_wait: float = 0.0
    version: int | None = None  # known before the run (a deploy); a rollback's is chosen later
    release: str = ""
    take_over: bool = False  # promote/abort: take the lock a paused canary holds
    # sees the run's context once the planner chose the release (under the lock, before any
    # host is changed); raising stops the run there (hooks: a pre-hook's refusal)
    on_planned: Callable[[RunContext], None] | None = None


def gather_facts(target: Target, conns: dict[str, Connection], images: Sequence[str],
                 forks: int) -> dict[str, HostFacts | HostUnreachable]:
    """Every selected host's facts, read at once (an unreachable host gives its error)."""
    def one(host: ResolvedHost) -> HostFacts | HostUnreachable:
        try:
            return gather(conns[host.name], target.model.name, host_paths(host, target.model),
                          images=images)
        except HostUnreachable as error:
            return error
        except Exception as error:  # a host that answers nonsense is not usable either
            return HostUnreachable(f"{host.name}: {type(error).__name__}: {error}")

    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(target.hosts)))) as pool:
        return dict(zip((h.name for h in target.hosts), pool.map(one, target.hosts),
                        strict=True))


def execute(plan: RunPlan, *, reporter: Reporter, connect: ConnectionFactory,
            clock: Clock, cancel: threading.Event) -> RunResult:
    """Take the fleet lock, read the facts, plan the jobs, run the phases; always release the
    lock and close the connections."""
    target = plan.target
    conns = {h.name: connect(h) for h in target.model_hosts}
    for host in target.hosts:
        conns.setdefault(host.name, connect(host))
    sites = [lock.LockSite(h.name, conns[h.name], host_paths(h, target.model))
             for h in target.model_hosts]
    started = time.monotonic()
    context: RunContext | None = None
    try:
        with interrupts_cancel(cancel, reporter):
            record = lock.new_lock_record(f"{plan.verb} {target.model.name}")
            try:
                taken = (lock.take_over_paused(sites, record) if plan.take_over else []) or \
                    lock.acquire_majority(sites, record, wait_s=plan.lock_wait, clock=clock,
                                          model=target.model.name, on_stale=reporter.note)
            except lock.LockQuorumLost as error:
                if plan.verb == "rollback":  # a fleet that must be restored cannot be
                    error.exit_code = ExitCode.INCONSISTENT
                raise
            except Interrupted:
                raise TfsDeployError("interrupted while waiting for the lock; nothing was "
                                     "changed") from None
            outcome: RunResult | None = None
            try:
                facts = gather_facts(target, conns, plan.images, plan.playbook.forks)
                context, jobs = plan.planner(facts)
                if plan.on_planned is not None:
                    plan.on_planned(context)
                what = (f" version {context.version} as {context.release_id}"
                        if context.release_id else "")
                reporter.note(f"{plan.verb} {target.model.name}{what} on {len(jobs)} host(s); "
                              f"lock on {', '.join(s.host for s in taken)}")
                emit(reporter, "run_started", version=context.version,
                     release=context.release_id)
                for job in jobs:
                    _facts_step(job, reporter)
                outcome = run_roll(plan, context, jobs, reporter, cancel)
            finally:
                if outcome is not None and context is not None and \
                        outcome.exit_code == ExitCode.PAUSED:  # the paused release keeps it
                    unreleased = lock.hand_to_paused(taken, record, context.release_id)
                else:
                    unreleased = lock.release_sites(taken, record)
            result = outcome
            if unreleased:
                result.exit_code = max(result.exit_code, ExitCode.INCONSISTENT)
                result.message += (f"; the lock could not be released on "
                                   f"{', '.join(unreleased)}: check with "
                                   f"`fab lock --model {target.model.name}`")
    finally:
        for conn in conns.values():
            conn.close()
        if context is not None and context.archive is not None:
            context.archive.discard()
    result.seconds = time.monotonic() - started
    return result


def _facts_step(job: HostJob, reporter: Reporter) -> None:
    """The facts read of a host, shown and recorded as its first step."""
    if job.unreachable is not None:
        return
    facts = job.facts
    proxy = (f"proxy serving {facts.proxy.serving_slot(0) or '?'}" if facts.proxy.running
             else "no proxy running")
    detail = (f"{len(facts.servers)} container(s), {len(facts.releases)} release record(s), "
              f"{proxy}")
    _record_step(job, "preflight", "read_facts", True, facts.seconds, detail)
    reporter.step(job.name, "preflight", "read_facts", "ok", facts.seconds, detail)


def run_roll(plan: RunPlan, context: RunContext, jobs: list[HostJob], reporter: Reporter,
             cancel: threading.Event) -> RunResult:
    """The phases over the planned jobs, under the playbook's policy (or the model's)."""
    rollout, playbook = context.model.rollout, plan.playbook
    roll = Roll(playbook=playbook, context=context, jobs=jobs, reporter=reporter,
                cancel=cancel, serial=playbook.serial or rollout.serial,
                max_fail_percentage=(playbook.max_fail_percentage
                                     if playbook.max_fail_percentage is not None
                                     else rollout.max_fail_percentage),
                on_failure=playbook.on_failure or rollout.on_failure,
                result=RunResult(context.model.name, context.version, context.release_id))
    try:
        return run_phases(roll)
    except Exception as error:  # a defect of ours: the exit code still says where we stood
        finish(roll, _stopped_code(roll),
               f"unexpected {type(error).__name__}: {error} (a defect of tfsdeploy)")
        return roll.result


# -- --check: the same operations, listed instead of applied ----------------------------

@dataclass
class PlannedStep:
    """One step of a host's plan."""

    phase: str
    step: str
    changes: list[Change]
    detail: str = ""
    error: str = ""


def plan_host(playbook: Playbook, job: HostJob) -> list[PlannedStep]:
    """What a run would do on one host: every phase's steps and their changes, up to the
    first step that would fail."""
    operations = registry()
    steps: list[PlannedStep] = []
    for phase in playbook.phases:
        if phase.mode == "batches" and job.unchanged:
            continue
        # a batch phase runs instance by instance, as the roll does
        for instance in job.instances if phase.mode == "batches" else [job.inst]:
            job.on(instance)
            for task in phase.tasks:
                try:
                    outcome = run_step(job, task.action, operations[task.action],
                                       task.params, check=True, on_progress=lambda h, p: None)
                except Exception as error:
                    steps.append(PlannedStep(phase.name, task.action, [], error=str(error)))
                    return steps
                steps.append(PlannedStep(phase.name, task.action, outcome.changes,
                                         outcome.detail))
        job.on(job.instances[0])
    return steps


def check(plan: RunPlan, *, connect: ConnectionFactory
          ) -> tuple[RunContext | None, dict[str, list[PlannedStep] | HostUnreachable],
                     list[HostJob]]:
    """``--check``: read the facts, plan the jobs, list every host's steps; no lock is taken
    and nothing is changed."""
    target = plan.target
    conns = {h.name: connect(h) for h in target.hosts}
    try:
        facts = gather_facts(target, conns, plan.images, plan.playbook.forks)
        context, jobs = plan.planner(facts)
        context.check = True
        plans: dict[str, list[PlannedStep] | HostUnreachable] = {}
        for job in jobs:
            seen = facts[job.name]
            plans[job.name] = seen if isinstance(seen, HostUnreachable) else \
                plan_host(plan.playbook, job)
        return context, plans, jobs
    finally:
        for conn in conns.values():
            conn.close()
