"""The engine owns a run, whatever its verb: the hosts' connections, the run's clock and its
cancellation (Ctrl-C/SIGTERM/SIGHUP), the fleet lock, the facts read once, the playbook's
phases, batches, rescue and the exit code. ``run`` is the one way a verb's run plan
(``plans``) is run; ``check`` plans it without changing anything.

The loop is explicit: every host's facts are read under the lock, the verb's planner turns them
into one job per host, then each phase runs its task list, on every host at once or batch by
batch. The first failure beyond the threshold stops the roll; the failed host runs the phase's
``rescue`` tasks, and the hosts already rolled run them too under ``on_failure: revert``. The
exit code says where the run stood: nothing serving changed (1), every host back on its
previous release (2), the fleet not consistent (3).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tfsdeploy.core.errors import ExitCode, HostUnreachable, TfsDeployError
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import host_paths
from tfsdeploy.core.rollout.batches import plan_batches, threshold_exceeded
from tfsdeploy.core.rollout.gates import Clock, GateFailed, SystemClock
from tfsdeploy.core.rollout.records import LockRecord, StepRecord
from tfsdeploy.core.target import Target
from tfsdeploy.hosts import lock
from tfsdeploy.hosts.facts import HostFacts, gather
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory, SshConnection
from tfsdeploy.run import executor, plans, survey
from tfsdeploy.run.after import (
    NO_EPILOGUE,
    BatchStarted,
    CanaryPausedOn,
    Epilogue,
    HostGateFailed,
    HostRolled,
    LateSignals,
    Listener,
    NotePass,
    RunEvent,
    RunStarted,
    StepEvent,
    ended_by,
    late_signals,
    run_after_passes,
)
from tfsdeploy.run.changes import Change
from tfsdeploy.run.executor import run_step
from tfsdeploy.run.jobs import (
    ClientFactory,
    Facts,
    GatewayLink,
    HostJob,
    InstanceJob,
    RunContext,
    Session,
    Verb,
)
from tfsdeploy.run.operations import is_gate, registry
from tfsdeploy.run.operations.canary import CanaryPaused
from tfsdeploy.run.plans import RunPlan
from tfsdeploy.run.playbook import Phase, Playbook, Task
from tfsdeploy.run.signals import handled


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP arrived, or the run's deadline passed: stop at the next step
    boundary and restore."""


class Stop(threading.Event):
    """A run's cancellation: set by a signal or by the run's deadline, with why (what the run's
    message says)."""

    def __init__(self) -> None:
        super().__init__()
        self.why = "interrupted"
        self.signal = ""  # the signal's name ("": the deadline, or not stopped)
        self._asked = threading.Lock()  # the signals' thread and the deadline's timer

    def stop(self, why: str, signal_name: str = "") -> bool:
        """Ask the run to stop, for ``why`` (kept from the first ask); whether this ask was
        the first."""
        with self._asked:
            if self.is_set():
                return False
            self.why, self.signal = why, signal_name
            self.set()
            return True

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
    # the canary's judged steps (StepResult.as_dict(): every metric's effect, interval,
    # p-value, classification) and its prediction comparison; None where none ran
    canary: dict[str, Any] | None = None


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


@dataclass
class RunState:
    """Everything the phases of one run share."""

    playbook: Playbook
    context: RunContext
    jobs: list[HostJob]
    reporter: Reporter
    cancel: Stop
    serial: Sequence[int | str]
    max_fail_percentage: float
    on_failure: str
    result: RunResult
    failed: set[str] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)  # hosts where what serves was changed
    listeners: Sequence[Listener] = ()
    session: Session | None = None

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

    def event(self, happened: RunEvent) -> None:
        """A run event (batch started, host rolled, gate failed) for reporters that take
        them (notifications)."""
        emit(self.reporter, happened)

    def step(self, job: HostJob, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """A step ended: the reporter's line, then the typed event to every listener (a
        listener's failure is a note, never the run's)."""
        self.reporter.step(job.name, phase, task, status, seconds, detail)
        event = StepEvent(job.name, phase, task, status, seconds, detail,
                          processes_changed=job.processes_changed, gate=is_gate(task))
        job.processes_changed = False
        for listen in self.listeners:
            try:
                assert self.session is not None, "listeners are given the run's session"
                listen(event, self.session)
            except Exception as error:
                self.reporter.note(f"a listener of the run failed on {task}: "
                                   f"{type(error).__name__}: {error}")


def emit(reporter: Reporter, happened: RunEvent) -> None:
    """Give ``reporter`` a run event if it takes events; a reporter's failure never stops the
    run."""
    take = getattr(reporter, "event", None)
    if take is not None:
        try:
            take(happened)
        except Exception:  # notifications are best effort by design
            return


def run_tasks(state: RunState, job: HostJob, phase: str, tasks: Sequence[Task]) -> None:
    """Run a task list on one host, recording each step; raise on the first failure. Each
    step's audit lines are appended while the next step runs; the last append has ended
    when this returns (or raises)."""
    try:
        _run_tasks(state, job, phase, tasks)
    except BaseException:
        with contextlib.suppress(Exception):  # what the failure says comes first
            job.audit.wait()
        raise
    job.audit.wait()


def _run_tasks(state: RunState, job: HostJob, phase: str, tasks: Sequence[Task]) -> None:
    operations = registry()
    if job.unreachable is not None:
        raise job.unreachable
    for task in tasks:
        if state.cancel.is_set():
            raise Interrupted()
        started = time.monotonic()
        try:
            outcome = run_step(job, task.action, operations[task.action], task.params,
                               check=False, on_progress=state.progress, audit_later=True)
        except BaseException as error:
            seconds = time.monotonic() - started
            pause = is_pause(error)  # the canary holds its last weight: not a failure
            detail = pause_detail(state, error) if pause else describe(error)
            _record_step(job, phase, task.action, pause, seconds, detail)
            state.step(job, phase, task.action, "paused" if pause else "failed", seconds, detail)
            if not pause and is_gate(task.action):
                state.event(HostGateFailed(job.name, task.action, detail))
            raise
        finally:
            if job.touched:
                state.touched.add(job.name)
        seconds = time.monotonic() - started
        _record_step(job, phase, task.action, True, seconds, outcome.detail)
        state.step(job, phase, task.action, "ok", seconds, outcome.detail)


def pause_detail(state: RunState, pause: BaseException) -> str:
    """A paused canary's progress line: the weight it holds, and how to finish it."""
    model = state.context.model.name
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


def roll_host(state: RunState, job: HostJob, phase: str, tasks: Sequence[Task]) -> None:
    """Run a batch phase's tasks on one host, instance by instance (the host's other
    instances keep serving meanwhile); raise on the first failure, with ``job.instance`` the
    instance that failed. A canary host's instances move together up to the end of the
    canary steps (``instance_passes``): a failure until then restores all of them."""
    passes = instance_passes(job, tasks)
    job.together = len(passes) > len(job.instances)
    for number, (instance, chunk) in enumerate(passes):
        if number > len(job.instances):  # past the canary: each instance on its own again
            job.together = False
        run_tasks(state, job.on(instance), phase, chunk)


def instance_passes(job: HostJob, tasks: Sequence[Task]
                    ) -> list[tuple[InstanceJob, Sequence[Task]]]:
    """The tasks each instance runs, in order: all of them instance by instance, except on a
    canary host with several instances: a canary weight is the share of the host's requests,
    so every instance runs the tasks before ``canary_steps``, the steps run once for the
    whole host (on its last instance, every instance at each weight together), then every
    instance runs the rest."""
    actions = [task.action for task in tasks]
    if len(job.instances) < 2 or not job.canary_host or "canary_steps" not in actions:
        return [(instance, tasks) for instance in job.instances]
    at = actions.index("canary_steps")
    return ([(instance, tasks[:at]) for instance in job.instances]
            + [(job.instances[-1], tasks[at:at + 1])]
            + [(instance, tasks[at + 1:]) for instance in job.instances])


def run_parallel(state: RunState, phase: Phase, jobs: list[HostJob], tasks: Sequence[Task]
                 ) -> dict[str, BaseException | None]:
    """Run ``tasks`` on ``jobs`` at once (at most ``forks``), per instance in a batch phase;
    Ctrl-C cancels cleanly."""
    errors: dict[str, BaseException | None] = {}
    if not jobs:
        return errors
    body = roll_host if phase.mode == "batches" else run_tasks
    with ThreadPoolExecutor(max_workers=max(1, min(state.playbook.forks, len(jobs)))) as pool:
        futures: dict[Future[None], HostJob] = {
            pool.submit(body, state, job, phase.name, tasks): job for job in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                errors[futures[future].name] = future.exception()
    return errors


def run_phases(state: RunState) -> RunResult:
    """Run the playbook's phases; the exit code follows the README's table."""
    active = list(state.jobs)
    for phase in state.playbook.phases:
        if phase.mode == "batches":
            for job in active:
                if job.unchanged:
                    state.outcome(job).status = "unchanged"
            if not roll_batches(state, phase, [j for j in active if not j.unchanged]):
                return state.result
            # unchanged hosts go on too: a later phase retires what a killed run left behind
            active = [j for j in active if j.name not in state.failed]
            continue
        passed = run_fleet_phase(state, phase, active)
        if passed is None:
            return state.result
        active = passed
    for job in active:
        if state.outcome(job).status == "pending":
            state.outcome(job).status = "rolled"
    if state.failed:
        finish(state, ExitCode.INCONSISTENT,
               f"{len(state.failed)} host(s) failed within the allowed threshold and still "
               f"serve their previous release: {', '.join(sorted(state.failed))}")
    elif state.context.verb is Verb.STAGE:
        finish(state, ExitCode.OK, f"version {state.context.version} staged on every host; "
               "nothing serving was changed")
    elif state.context.verb is Verb.ABORT:  # the release in the context is the one aborted
        finish(state, ExitCode.OK, f"canary {state.context.release_id} aborted: every host "
               "serves the release it served before the canary")
    else:
        finish(state, ExitCode.OK, f"every host serves {state.context.release_id}")
    return state.result


def _stopped_code(state: RunState) -> ExitCode:
    """A stop before anything serving changed is 'nothing changed' (1), after it 3."""
    return ExitCode.INCONSISTENT if state.touched else ExitCode.INVALID


def run_fleet_phase(state: RunState, phase: Phase, jobs: list[HostJob]) -> list[HostJob] | None:
    """A parallel phase; returns the hosts that passed, or None when the run must stop."""
    errors = run_parallel(state, phase, jobs, phase.tasks)
    failed = [j for j in jobs if errors.get(j.name)]
    for job in failed:
        error = errors[job.name]
        state.outcome(job).status = "unreachable" if isinstance(error, HostUnreachable) \
            else "failed"
        state.outcome(job).error = describe(error) if error else ""
        state.outcome(job).diagnosis = job.diagnosis.as_dict() if job.diagnosis else None
        state.failed.add(job.name)
    if state.cancel.is_set():
        code = _stopped_code(state)
        finish(state, code, f"{state.cancel.why} during {phase.name}; "
               + ("no serving container was changed" if code == ExitCode.INVALID
                  else "the fleet may be mixed: look at the hosts"))
        return None
    if failed and state.touched:
        finish(state, ExitCode.INCONSISTENT, f"{phase.name} failed on "
               + ", ".join(j.name for j in failed) + " after serving containers changed")
        return None
    if threshold_exceeded(len(state.failed), len(state.jobs), state.max_fail_percentage):
        finish(state, ExitCode.INVALID, f"{phase.name} failed on "
               f"{', '.join(sorted(state.failed))}; nothing serving was changed")
        return None
    return [j for j in jobs if j.name not in state.failed]


def roll_batches(state: RunState, phase: Phase, jobs: list[HostJob]) -> bool:
    """Roll batch by batch; on a stop, rescue and apply the policy. True to go on."""
    rolled: list[HostJob] = []
    batches = plan_batches(jobs, state.serial)
    state.context.canary_hosts = frozenset(j.name for j in batches[0]) if batches else frozenset()
    for number, batch in enumerate(batches, start=1):
        state.reporter.note(f"batch {number}/{len(batches)}: "
                           + ", ".join(j.name for j in batch))
        state.event(BatchStarted(number, len(batches), tuple(j.name for j in batch)))
        errors = run_parallel(state, phase, batch, phase.tasks)
        paused = [j for j in batch if is_pause(errors.get(j.name))]
        for job in paused:
            state.outcome(job).status = "paused"
            rolled.append(job)
        for job in batch:
            error = errors.get(job.name)
            if is_pause(error):
                continue
            if error is None:
                rolled.append(job)
                state.outcome(job).status = "rolled"
                state.event(HostRolled(job.name, state.context.release_id,
                                       sum(s.seconds for s in job.steps
                                           if s.phase == phase.name)))
                continue
            state.failed.add(job.name)
            state.outcome(job).error = describe(error)
            state.outcome(job).diagnosis = job.diagnosis.as_dict() if job.diagnosis else None
            # revert: the whole host goes back; stay: only the instance that failed (every
            # instance while a canary host's instances move together)
            state.outcome(job).status = rescue_host(
                state, phase, job, every=state.on_failure == "revert" or job.together)
        stop = state.cancel.is_set() or threshold_exceeded(
            len(state.failed), len(state.jobs), state.max_fail_percentage)
        if stop:
            stop_roll(state, phase, rolled, batches[number:])
            return False
        if paused:
            pause_roll(state, paused, batches[number:])
            return False
    return True


def is_pause(error: BaseException | None) -> bool:
    """Whether a host's roll ended holding a paused canary (not a failure)."""
    return isinstance(error, CanaryPaused)


def pause_roll(state: RunState, paused: list[HostJob], untouched: list[list[HostJob]]) -> None:
    """The canary holds at its last weight: the run ends, the lock stays with the paused
    release, the hosts not reached stay ``pending`` until ``fab promote`` rolls them."""
    for batch in untouched:
        for job in batch:
            state.outcome(job).status = "pending"
    policy = state.context.canary
    weight = policy.weights[-1] if policy else 0
    state.event(CanaryPausedOn(tuple(j.name for j in paused), weight))
    finish(state, ExitCode.PAUSED,
           f"canary paused at {weight}% on {', '.join(j.name for j in paused)}: "
           f"`fab promote --model {state.context.model.name}` finishes the roll, "
           f"`fab abort --model {state.context.model.name}` returns them to the old release")


def stop_roll(state: RunState, phase: Phase, rolled: list[HostJob],
              untouched: list[list[HostJob]]) -> None:
    """After a stop: revert or keep the rolled hosts, and set the exit code."""
    for batch in untouched:
        for job in batch:
            state.outcome(job).status = "skipped"
    reverted_ok = True
    if state.on_failure == "revert":
        for job in rolled:
            status = rescue_host(state, phase, job, every=True)
            state.outcome(job).status = status
            reverted_ok &= status == "reverted"
    restored_ok = all(state.result.hosts[n].status in ("restored", "reverted")
                      for n in state.failed if n in state.result.hosts)
    why = state.cancel.why if state.cancel.is_set() else "a gate failed"
    if state.on_failure == "revert" and reverted_ok and restored_ok:
        finish(state, ExitCode.ROLLED_BACK, f"{why}; every host serves its previous release")
    else:
        finish(state, ExitCode.INCONSISTENT,
               f"{why}; the fleet is mixed or a host could not be restored: look at the hosts")


def rescue_host(state: RunState, phase: Phase, job: HostJob, *, every: bool = False) -> str:
    """Run the phase's rescue tasks for the host's current instance (the one that failed) or,
    with ``every``, for each instance the run changed, last rolled first; returns the host's
    final status."""
    if not phase.rescue:
        return "failed"
    started = time.monotonic()
    had_traffic = job.took_any_traffic
    chosen = [job.instance] + ([i for i in reversed(job.instances)
                            if i is not job.instance and i.touched] if every else [])
    try:
        for instance in chosen:
            job.on(instance)
            for task in phase.rescue:  # never cancelled: a second Ctrl-C cannot cut a restore
                begun = time.monotonic()
                outcome = run_step(job, task.action, registry()[task.action], task.params,
                                   check=False, on_progress=state.progress)
                _record_step(job, "restore", task.action, True, time.monotonic() - begun,
                             outcome.detail)
    except Exception as error:  # the host may be unreachable: a person must look
        state.reporter.step(job.name, "restore", "restore", "failed",
                            time.monotonic() - started, describe(error))
        return "unknown"
    first = job.instances[0]
    previous = first.old.release if first.old else "no release (first deploy)"
    restored = "" if len(job.instances) == 1 else \
        f" ({len(chosen)} of {len(job.instances)} instance(s) restored)"
    state.reporter.step(job.name, "restore", "restore", "ok", time.monotonic() - started,
                        f"back on {previous}{restored}")
    return "reverted" if had_traffic else "restored"


def finish(state: RunState, code: ExitCode, message: str) -> None:
    """Set the run's result; every host appears in it, even those never reached (a paused
    run's are still to roll: they stay ``pending``)."""
    state.result.exit_code = code
    state.result.message = message
    for job in state.jobs:
        outcome = state.outcome(job)
        outcome.steps = [s.model_dump() | {"gate": is_gate(s.step)} for s in job.steps]
        if job.canary_steps or job.canary_comparison is not None:
            outcome.canary = {"steps": job.canary_steps, "comparison": job.canary_comparison}
        if outcome.status == "pending" and code != ExitCode.PAUSED:
            outcome.status = "skipped"


# -- a run: connections, lock, facts, signals ---------------------------------------------

# what a run says at its first stop signal, and at any later one
RUN_STOPPING = ("finishing the current steps, then restoring; the lock is released at the end",
                "already stopping: restoring, then releasing the lock")


@contextmanager
def interrupts_cancel(cancel: Stop, note: Callable[[str], None],
                      saying: tuple[str, str] = RUN_STOPPING) -> Iterator[None]:
    """Ctrl-C, SIGTERM (cron, systemd) and SIGHUP (the operator's SSH session dropped) ask the
    run to stop: the current steps finish, the hosts are restored, the lock is released (what
    the run does then is ``saying``: after the first signal's name, and at a later one). The
    handler never raises, so a second signal cannot cut a restore or the release short."""
    first, again = saying

    def handler(signum: int) -> None:
        if cancel.stop("interrupted", signal.Signals(signum).name):
            note(f"{signal.Signals(signum).name}: {first}")
        else:
            note(again)

    with handled(handler):
        yield


@contextmanager
def deadline_stops(cancel: Stop, note: Callable[[str], None], deadline_s: float | None,
                   *, setting: str = "rollout.deadline_s",
                   saying: tuple[str, str] = RUN_STOPPING) -> Iterator[None]:
    """The run's overall deadline (``setting`` in the inventory; None: none): once it passes,
    the run stops as at a signal (the current steps finish, the hosts are restored, the lock is
    released; what it does then is ``saying``'s first), and its message says that the
    deadline stopped it."""
    if deadline_s is None:
        yield
        return

    def passed() -> None:
        if cancel.stop(f"stopped at its {deadline_s:g} s deadline ({setting})"):
            note(f"the run's {deadline_s:g} s deadline passed: {saying[0]}")

    timer = threading.Timer(deadline_s, passed)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # a deadline passing right now is said before the run goes on


def gather_facts(target: Target, conns: Mapping[str, Connection], images: Sequence[str],
                 forks: int, ended: threading.Event | None = None) -> Facts:
    """Every selected host's facts, read at once (an unreachable host gives its error); once
    ``ended`` is set (a look's end), a host not yet begun is not read."""
    def one(host: ResolvedHost) -> HostFacts | HostUnreachable:
        if ended is not None and ended.is_set():  # its connection is closed: never reopen it
            return HostUnreachable(f"{host.name}: not read (the look ended first)")
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


def open_session(target: Target, connect: ConnectionFactory, clock: Clock,
                 client_factory: ClientFactory | None) -> Session:
    """One connection per host of the model (the lock spans them) and per selected host."""
    conns = {h.name: connect(h) for h in target.model_hosts}
    for host in target.hosts:
        conns.setdefault(host.name, connect(host))
    return Session(connections=conns, clock=clock, client_factory=client_factory,
                   gateway=gateway_link(target, connect), connect=connect)


def gateway_link(target: Target, connect: ConnectionFactory) -> GatewayLink | None:
    """The gateway hosts routing the model, each with its connection (None: no gateway
    routes it)."""
    gateway = target.inventory.gateway
    if gateway is None or gateway.route(target.model.name) is None:
        return None
    hosts = target.inventory.gateway_hosts
    return GatewayLink(hosts=hosts, connections={h.name: connect(h) for h in hosts})


def close_session(session: Session) -> None:
    """Close every connection of the run."""
    for conn in session.connections.values():
        conn.close()
    for conn in (session.gateway.connections.values() if session.gateway else ()):
        conn.close()
    with session.opening:  # a pass still opening one (a look left at its end) waits
        opened = list(session.opened.values())
    for conn in opened:
        conn.close()


def run(plan: RunPlan, *, reporter: Reporter, connect: ConnectionFactory = SshConnection,
        clock: Clock | None = None, client_factory: ClientFactory | None = None,
        before: Callable[[RunPlan], None] | None = None,
        epilogue: Epilogue = NO_EPILOGUE) -> RunResult:
    """Run a verb's plan: ``before`` sees it first, before any connection (a pre-hook may
    refuse the run there); then the engine opens the connections, takes the lock, reads the
    facts, plans the jobs and runs the phases, on ``clock`` (the system's by default) made
    cancellable by Ctrl-C, SIGTERM and SIGHUP; the lock is released whatever happens. Then,
    on the same connections, the ``epilogue``: its notes join the result (within their own
    deadline, NOTES_DEADLINE_S), the result is recorded, and only then do its after-passes
    run, under its deadline; from the roll's end on, a signal is said and ends the notes and
    the after-passes, never the recorded result (``run.after``); the connections are closed
    at the very end."""
    if before is not None:
        before(plan)
    cancel = Stop()
    session = open_session(plan.target, connect,
                           CancellableClock(clock or SystemClock(), cancel), client_factory)
    started = time.monotonic()
    try:
        with late_signals(reporter) as late:
            with interrupts_cancel(cancel, reporter.note), \
                    deadline_stops(cancel, reporter.note, plan.target.model.rollout.deadline_s):
                result = _locked(plan, session, reporter, cancel, epilogue.listeners)
                if epilogue.summarize is not None:
                    result = epilogue.summarize(result)
            _add_notes(result, _notes(plan, epilogue), session, reporter, late)
            result.seconds = time.monotonic() - started
            if epilogue.record is not None:
                epilogue.record(result)
            run_after_passes(epilogue.after, result, session, deadline_s=epilogue.deadline_s,
                             late=late, reporter=reporter)
    finally:
        close_session(session)
    return result


def _notes(plan: RunPlan, epilogue: Epilogue) -> Sequence[NotePass]:
    """The reads of the fleet whose lines join the result: the plan's own (a deploy's
    orphans), then the epilogue's (gateway drift)."""
    orphans: tuple[NotePass, ...] = (
        (lambda session: survey.orphan_notes(plan.target, session)),) if plan.note_orphans \
        else ()
    return (*orphans, *epilogue.notes)


# what a run's notes (orphans, gateway drift) may take together: the result is recorded after
# them, so a host that hangs there must not hold the record back
NOTES_DEADLINE_S = 30.0


def _add_notes(result: RunResult, notes: Sequence[NotePass], session: Session,
               reporter: Reporter, late: LateSignals) -> None:
    """The reads of the fleet (orphans, gateway drift), said and added to the result's
    message before it is recorded; a read that fails, or that is still going at the
    notes' deadline or at a Ctrl-C or SIGTERM (said by ``late_signals``), is one note, and
    the result is recorded without waiting for it."""
    end = time.monotonic() + NOTES_DEADLINE_S
    for read in notes:
        lines = _read_note(read, session, end, late)
        for line in lines:
            reporter.note(line)
        if lines:
            result.message += "; " + "; ".join(lines)


def _read_note(read: NotePass, session: Session, end: float, late: LateSignals) -> list[str]:
    """One note's lines, read as an after-pass runs (``ended_by``: the deadline and a signal
    can leave it)."""
    got: list[list[str]] = []

    def body() -> None:
        try:
            got.append(list(read(session)))
        except Exception as error:
            got.append([f"not read ({type(error).__name__}: {error})"])

    ended_by(body, end, late, name="note")
    if got:
        return got[0]
    why = f"{late.stop} came" if late.stop else f"the {NOTES_DEADLINE_S:g} s deadline passed"
    return [f"not read ({why} first; recorded without it)"]


LOOK_DEADLINE_S = 300.0  # a look at the fleet (status, history, lock, exec, logs) ends by then

Looked = TypeVar("Looked")


class LookStopped(TfsDeployError):
    """A look at the fleet was stopped (Ctrl-C, SIGTERM, SIGHUP) or outlived its deadline (its
    message says what it left: a read changes nothing; a publish of targets replaces files
    whole)."""

    exit_code = ExitCode.INCONSISTENT

    def __init__(self, message: str, signal_name: str | None = None) -> None:
        super().__init__(message)
        self.signal_name = signal_name  # the signal that stopped it; None: the deadline


def look(target: Target, body: Callable[[Session], Looked], *,
         connect: ConnectionFactory = SshConnection,
         deadline_s: float | None = LOOK_DEADLINE_S,
         left: str = "nothing was changed",
         whole: bool = False) -> Looked:
    """A read of the fleet on the engine's own session (status, history, lock, logs, exec,
    a check): the connections ``body`` asks for are opened on first use (``whole``: the
    session of a run, one connection per host of the model and per selected host, and the
    gateway's) and closed at the end, and the read ends at Ctrl-C, SIGTERM or SIGHUP, or at
    ``deadline_s`` (None: none), with LookStopped saying which (exit 3: what was read is not
    whole) and what it ``left``."""
    cancel = Stop()
    clock = CancellableClock(SystemClock(), cancel)
    session = open_session(target, connect, clock, None) if whole else \
        Session(connections={}, clock=clock, connect=connect)
    session.ended = cancel  # set at a signal, at the deadline, or when the look is over
    outcome: list[Any] = []

    def handler(signum: int) -> None:
        cancel.stop("interrupted", signal.Signals(signum).name)

    def work() -> None:
        try:
            outcome.append(("ok", body(session)))
        except BaseException as error:
            outcome.append(("error", error))

    worker = threading.Thread(target=work, name="look", daemon=True)
    end = None if deadline_s is None else time.monotonic() + deadline_s
    try:
        with handled(handler):
            worker.start()
            while worker.is_alive() and not cancel.is_set() and (
                    end is None or time.monotonic() < end):
                worker.join(timeout=0.1)
    finally:
        unfinished = worker.is_alive()  # before the close frees it with a partial result
        stopped_before = not cancel.stop("over")  # a signal or the deadline came first: kept
        close_session(session)  # a read still blocked on a host is freed by its close
    if unfinished or not outcome or stopped_before:
        signal_name = cancel.signal or None
        why = signal_name or f"its {deadline_s:g} s deadline"
        raise LookStopped(f"the look at {target.model.name}'s hosts ended at {why} before "
                          f"every host answered; {left}", signal_name)
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]


Done = TypeVar("Done")


def operate(body: Callable[[Session, Stop], Done], *, note: Callable[[str], None],
            connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
            saying: tuple[str, str] = RUN_STOPPING, deadline_s: float | None = None,
            setting: str = "") -> Done:
    """A pass outside a model's run (``fab gateway``, ``fab tune``, the guard's watch) on the
    engine's own session: the connections ``body`` asks for (``session.connection``) are
    opened on first use and closed at the end, whatever happens. Ctrl-C, SIGTERM and SIGHUP
    stop it as they stop a run (``saying``: what it then does): ``Stop`` is set, with why, and
    the session's clock raises Interrupted at its next wait; ``body`` finishes or restores what
    it was changing (its restores wait on a clock of their own: a second signal cannot cut
    them) and returns. The handler never raises. Past ``deadline_s`` (the inventory's
    ``setting``; None: none) it stops the same way, its ``why`` naming the deadline."""
    cancel = Stop()
    session = Session(connections={}, clock=CancellableClock(clock or SystemClock(), cancel),
                      connect=connect)
    try:
        with interrupts_cancel(cancel, note, saying), \
                deadline_stops(cancel, note, deadline_s, setting=setting, saying=saying):
            return body(session, cancel)
    finally:
        session.ended.set()
        close_session(session)


def _take_lock(plan: RunPlan, session: Session, reporter: Reporter, record: LockRecord,
               sites: list[lock.LockSite], cancel: Stop) -> list[lock.LockSite]:
    """The fleet lock on a majority of the model's hosts (a promote or abort takes the one
    its paused canary holds)."""
    target = plan.target
    try:
        return (lock.take_over_paused(sites, record, reporter.note) if plan.take_over
                else []) or \
            lock.acquire_majority(sites, record, wait_s=plan.lock_wait, clock=session.clock,
                                  model=target.model.name, on_stale=reporter.note)
    except lock.LockQuorumLost as error:
        if plan.verb is Verb.ROLLBACK:  # a fleet that must be restored cannot be
            error.exit_code = ExitCode.INCONSISTENT
        raise
    except Interrupted:
        raise TfsDeployError(f"{cancel.why} while waiting for the lock; nothing was "
                             "changed") from None


def clear_finished_canary_parts(plan: RunPlan, rest: list[lock.LockSite], facts: Facts,
                                reporter: Reporter) -> None:
    """The paused canary's parts left on hosts this run did not take (a host that was down
    when a promote or abort ended): removed when that canary is finished on every host of the
    model (no record keeps it open, no proxy shares traffic with it), else the run is refused
    as the paused canary's lock refuses it (exit 4: `fab promote` or `fab abort`)."""
    model = plan.target.model.name
    reachable = {h: f for h, f in facts.items() if isinstance(f, HostFacts)}
    every_host = all(h.name in reachable for h in plan.target.model_hosts)
    for site, holder in lock.paused_parts(rest):
        if not every_host or plans.canary_open(reachable, holder.paused):
            raise lock.LockHeld(lock.paused_message(model, site.host, holder))
        removed, _ = lock.remove(site, holder.token)
        if removed:
            reporter.note(f"cleared the lock part that the finished canary {holder.paused} "
                          f"left on {site.host}")


def _locked(plan: RunPlan, session: Session, reporter: Reporter, cancel: Stop,
            listeners: Sequence[Listener] = ()) -> RunResult:
    """Under the lock: the facts, the plan, the phases; the lock given back (or handed to a
    paused canary) and the version archive removed, whatever happens."""
    target = plan.target
    record = lock.new_lock_record(f"{plan.verb} {target.model.name}")
    sites = [lock.LockSite(h.name, session.connections[h.name], host_paths(h, target.model))
             for h in target.model_hosts]
    paused = next((h.paused for _, h in lock.paused_parts(sites)), "") if plan.take_over \
        else ""
    taken = _take_lock(plan, session, reporter, record, sites, cancel)
    outcome: RunResult | None = None
    context: RunContext | None = None
    try:
        facts = gather_facts(target, session.connections, plan.images, plan.playbook.forks)
        clear_finished_canary_parts(plan, [s for s in sites if s not in taken], facts,
                                    reporter)
        context, jobs = plan.planner(facts, session)
        context.lock_token = record.token  # what the run's GPU reservations live by
        if plan.on_planned is not None:
            plan.on_planned(context)
        what = (f" version {context.version} as {context.release_id}"
                if context.release_id else "")
        reporter.note(f"{plan.verb} {target.model.name}{what} on {len(jobs)} host(s); "
                      f"lock on {', '.join(s.host for s in taken)}")
        emit(reporter, RunStarted(context.version, context.release_id))
        for job in jobs:
            _facts_step(job, reporter)
        if session.gateway is not None and plan.verb in (Verb.DEPLOY, Verb.ROLLBACK):
            for note in executor.reconcile_gateway(
                    session.gateway, context, {h.name for h in target.model_hosts},
                    timeout_s=target.model.rollout.drain_timeout_s, clock=session.clock):
                reporter.note(note)
        outcome = run_roll(plan, context, jobs, reporter, cancel, listeners, session)
    finally:
        keeps = _kept_for(plan, outcome, context, paused, sys.exc_info()[1])
        if keeps:  # a paused release keeps it
            unreleased = lock.hand_to_paused(taken, record, keeps)
        else:
            unreleased = lock.release_sites(taken, record)
        if context is not None and context.archive is not None:
            context.archive.discard()
    if unreleased:
        outcome.exit_code = max(outcome.exit_code, ExitCode.INCONSISTENT)
        outcome.message += (f"; the lock could not be released on "
                            f"{', '.join(unreleased)}: check with "
                            f"`fab lock --model {target.model.name}`")
    return outcome


def _kept_for(plan: RunPlan, outcome: RunResult | None, context: RunContext | None,
              paused: str, error: BaseException | None) -> str:
    """The paused release the lock is handed to as the run ends ("": it is released): the
    run's own canary when it paused; the canary a promote or abort took it from when that run
    changed nothing (exit 1: a host unreachable at preflight; or stopped before its phases:
    a refusal, what the guard judged is no longer under way), so the canary keeps its lock.
    Only "nothing to do" (the canary is finished) releases it: its leftovers go with it."""
    if outcome is not None and context is not None and outcome.exit_code == ExitCode.PAUSED:
        return context.release_id
    if not (plan.take_over and paused):
        return ""
    if outcome is not None:
        return paused if outcome.exit_code == ExitCode.INVALID else ""
    finished = isinstance(error, TfsDeployError) and error.exit_code == ExitCode.OK
    return "" if finished else paused


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
             cancel: Stop, listeners: Sequence[Listener] = (),
             session: Session | None = None) -> RunResult:
    """The phases over the planned jobs, under the playbook's policy (or the model's);
    ``listeners`` are told of every step, with the run's ``session``."""
    rollout, playbook = context.model.rollout, plan.playbook
    state = RunState(playbook=playbook, context=context, jobs=jobs, reporter=reporter,
                     cancel=cancel, serial=playbook.serial or rollout.serial,
                     max_fail_percentage=(playbook.max_fail_percentage
                                          if playbook.max_fail_percentage is not None
                                          else rollout.max_fail_percentage),
                     on_failure=playbook.on_failure or rollout.on_failure,
                     result=RunResult(context.model.name, context.version, context.release_id),
                     listeners=listeners, session=session)
    try:
        return run_phases(state)
    except Exception as error:  # a defect of ours: the exit code still says where we stood
        finish(state, _stopped_code(state),
               f"unexpected {type(error).__name__}: {error} (a defect of tfsdeploy)")
        return state.result


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
        for instance in job.instances if phase.mode == "batches" else [job.instance]:
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


def check(plan: RunPlan, *, connect: ConnectionFactory = SshConnection, diff: bool = False
          ) -> tuple[RunContext | None, dict[str, list[PlannedStep] | HostUnreachable],
                     list[HostJob]]:
    """``--check``: read the facts, plan the jobs, list every host's steps (with ``diff``, read
    the live release's files of each host, kept as ``job.live_files``); no lock is taken and
    nothing is changed. It is a look (``look``, with no deadline: ``--diff`` reads each host's
    files in turn): its connections are closed at its end, and Ctrl-C, SIGTERM or SIGHUP end
    it with LookStopped; a host not yet read then is not read."""
    def body(session: Session) -> tuple[RunContext | None,
                                        dict[str, list[PlannedStep] | HostUnreachable],
                                        list[HostJob]]:
        facts = gather_facts(plan.target, session.connections, plan.images,
                             plan.playbook.forks, session.ended)
        if session.ended.is_set():
            raise Interrupted
        context, jobs = plan.planner(facts, session)
        context.check = True
        plans: dict[str, list[PlannedStep] | HostUnreachable] = {}
        for job in jobs:
            seen = facts[job.name]
            plans[job.name] = seen if isinstance(seen, HostUnreachable) else \
                plan_host(plan.playbook, job)
            if diff and not isinstance(seen, HostUnreachable):
                if session.ended.is_set():
                    raise Interrupted
                job.live_files = live_files(session, job)
        return context, plans, jobs

    return look(plan.target, body, connect=connect, whole=True, deadline_s=None)


def live_files(session: Session, job: HostJob) -> dict[str, str]:
    """The files of the release the host serves (none on a first deploy, or when the live
    release lacks them: every file is then new)."""
    if not job.old:
        return {}
    try:
        return session.release_files(job.host, job.model, job.old.release)
    except (TfsDeployError, HostUnreachable):
        return {}
