"""What surrounds a run for runbooks: its hooks (a pre-hook may stop it before any host is
changed; post-hooks report) and its event notifications (sent in the background, reported at
the end). See docs/hooks.md.

A deploy's release is known before any connection, so ``pre-deploy`` runs before the lock. A
rollback's, promote's or abort's release is chosen from the hosts' records, under the lock:
their pre-hook runs once it is chosen (``RunPlan.on_planned``), before any host is changed, so
that every hook and every event names the release and its version. `fab guard` runs the hooks
and sends the events of what it does (a rollback, or the abort of a paused canary), after a
``guard_triggered`` event.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfsdeploy.core.errors import ExitCode, TfsDeployError
from tfsdeploy.core.target import Target
from tfsdeploy.core.who import current_user
from tfsdeploy.run import canary as cli_canary
from tfsdeploy.run import rollback as cli_rollback
from tfsdeploy.run.after import (
    BatchStarted,
    CanaryPausedOn,
    GuardTriggered,
    HostGateFailed,
    HostRolled,
    RunEvent,
    RunStarted,
)
from tfsdeploy.run.jobs import Verb
from tfsdeploy.runbook import hooks, notify

if TYPE_CHECKING:
    from tfsdeploy.run.engine import RunResult
    from tfsdeploy.run.jobs import RunContext
    from tfsdeploy.run.plans import RunPlan

NOTIFY_CLOSE_S = 0.8  # the most a dead receiver may add to a run at its end
# A host in any other state failed. A paused run's hosts are paused (the canary hosts) or
# pending (`fab promote` rolls them): neither failed.
NOT_FAILED = frozenset({"rolled", "unchanged", "skipped", "paused", "pending"})
ON_THE_RELEASE = ("rolled", "unchanged")  # a host's results once it serves the run's aim


@dataclass
class Around:
    """A run's hooks, notifier and facts.

    ``command`` is what the hooks and events name (``TFSDEPLOY_COMMAND``); ``verb`` is whose
    hooks run: the command's own, or, for `fab guard`, what it does once it acts (empty
    until then)."""

    command: str
    found: hooks.Hooks
    notifier: notify.Notifier
    facts: hooks.RunFacts
    verb: str = ""
    pre_passed: bool = False  # the pre-hook let the run go on (or the verb has none)
    refused: bool = False  # the pre-hook stopped the run: no other hook runs
    outcome: RunResult | None = None  # the guard's action, once it ran
    results: list[dict[str, Any]] = field(default_factory=list)

    def chosen(self, version: int | None, release: str) -> None:
        """The release the run deploys, returns to, promotes or aborts, once known: every
        hook and event from now on names it."""
        self.facts = dataclasses.replace(self.facts, version=version, release=release)
        self.notifier.facts = self.facts


def prepare(command: str, target: Target, *, hooks_dir: str | None,
            notify_urls: Sequence[str], version: int | None = None,
            release: str = "") -> Around:
    """Check the hooks directory and the receivers (before any connection)."""
    found = hooks.find_hooks(hooks_dir, inventory=target.inventory.path)
    facts = hooks.RunFacts(command=command, model=target.model.name, version=version,
                           release=release, hosts=tuple(h.name for h in target.hosts),
                           addresses=tuple(h.address for h in target.hosts),
                           who=current_user(), inventory=target.inventory.path,
                           run_id=uuid.uuid4().hex[:16])
    urls = [*target.inventory.notify, *notify_urls]
    return Around(command, found, notify.Notifier(urls, facts), facts,
                  verb="" if command == "guard" else command)


def surround(shown: EventReporter, command: str, target: Target, *, hooks_dir: str | None,
             notify_urls: Sequence[str]) -> Callable[[RunPlan], None]:
    """The ``before`` of a command's run: once its plan is validated, check the hooks and
    receivers, then run the pre-hook when it is due."""
    def before(plan: RunPlan) -> None:
        shown.around = prepare(command, target, hooks_dir=hooks_dir, notify_urls=notify_urls,
                               version=plan.version, release=plan.release)
        hook_plan(shown.around, shown, plan)

    return before


def hook_plan(around: Around, reporter: Any, plan: RunPlan) -> None:
    """Hook ``around`` into ``plan``: the pre-hook now when the release is already known (a
    deploy), else once the engine has chosen it."""
    def planned(context: RunContext) -> None:
        around.chosen(context.version, context.release_id)
        if not around.pre_passed:
            pre_hook(around, reporter)

    plan.on_planned = planned
    if plan.release:
        pre_hook(around, reporter)


def pre_hook(around: Around, reporter: Any) -> None:
    """Run the verb's pre-hook: a refusal (HookRefused, exit 1, the hook's output in it)
    stops the run before any host is changed."""
    moment = hooks.moment_before(around.verb)
    if moment is not None and around.found.path_for(moment) is not None:
        refusal = run_hook(around, moment, reporter, hooks.hook_env(around.facts)).refusal()
        if refusal is not None:
            around.refused = True
            raise refusal
    around.pre_passed = True


def run_hook(around: Around, moment: hooks.Moment, reporter: Any, env: dict[str, str]
             ) -> hooks.HookResult:
    """Run one hook, its output printed line by line as it comes (prefixed with its name),
    its result recorded and described."""
    result = hooks.run_hook(around.found, moment, env,
                            on_line=lambda line: reporter.note(f"{moment} | {line}"))
    around.results.append(result.as_dict())
    reporter.note(f"hook {result.describe()}")
    return result


def guard_actions(shown: EventReporter, target: Target, *, lock_wait: float
                  ) -> tuple[Callable[[Mapping[str, str]], RunResult],
                             Callable[[str], RunResult]]:
    """What `fab guard` runs when it acts: a rollback of the releases it judged (per host)
    and the abort of the canary it judged, each with the hooks and events `fab rollback` and
    `fab abort` have."""
    def act(verb: str, run: Callable[[Callable[[RunPlan], None]], RunResult]) -> RunResult:
        around = shown.around
        assert around is not None, "the guard's runbook is prepared before it watches"
        around.verb = verb

        def before_run(plan: RunPlan) -> None:
            hook_plan(around, shown, plan)

        around.outcome = run(before_run)  # the targets follow once the guard's end is recorded
        return around.outcome

    def rollback(judged: Mapping[str, str]) -> RunResult:
        return act("rollback", lambda before_run: cli_rollback.rollback(
            target, lock_wait=lock_wait, reporter=shown, by_guard=True, before=before_run,
            judged=judged))

    def abort(judged: str) -> RunResult:
        return act("abort", lambda before_run: cli_canary.finish_canary(
            Verb.ABORT, target, lock_wait=lock_wait, reporter=shown, before=before_run,
            judged=judged))

    return rollback, abort


class EventReporter:
    """The run's reporter, whose run events also go out as notifications."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.around: Around | None = None  # set once the run is prepared
        self.events: list[dict[str, Any]] = getattr(inner, "events", [])

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """As the inner reporter."""
        self.inner.step(host, phase, task, status, seconds, detail)

    def note(self, text: str) -> None:
        """As the inner reporter."""
        self.inner.note(text)

    def warn(self, text: str) -> None:
        """As the inner reporter (its notes when it has no warnings)."""
        getattr(self.inner, "warn", self.inner.note)(text)

    def progress(self, host: str, update: Any) -> None:
        """As the inner reporter."""
        show = getattr(self.inner, "progress", None)
        if show is not None:
            show(host, update)

    def event(self, happened: RunEvent) -> None:
        """An engine (or guard) event as a notification."""
        if self.around is None:
            return
        event = engine_event(happened)
        if event is not None:
            self.around.notifier.send(event)


def engine_event(happened: RunEvent) -> notify.Event | None:
    """The notification of an event the engine or the guard reports (None: not one)."""
    match happened:
        case RunStarted():
            return notify.run_started()
        case BatchStarted(batch=batch, batches=batches, hosts=hosts):
            return notify.batch_started(batch, batches, list(hosts))
        case HostRolled(host=host, release=release, seconds=seconds):
            return notify.host_rolled(host, release=release, seconds=seconds)
        case HostGateFailed(host=host, gate=gate, message=message):
            return notify.gate_failed(host, gate, message)
        case CanaryPausedOn(hosts=hosts, weight=weight):
            return notify.paused(list(hosts), weight=weight)
        case GuardTriggered(host=host, message=message, action=action):
            return notify.guard_triggered(host, message, action=action)
    return None


def failed_hosts(result: RunResult) -> list[str]:
    """The hosts of ``result`` that failed (not rolled, unchanged, skipped, paused, pending)."""
    return [name for name, o in result.hosts.items() if o.status not in NOT_FAILED]


def outcome_event(verb: str, result: RunResult | None) -> notify.Event | None:
    """``rollback``, ``promoted`` or ``aborted`` after such a run that succeeded, naming the
    hosts on the release it chose (None for other verbs and for a failed run: ``finished``
    says what happened)."""
    if result is None or int(result.exit_code) != 0:
        return None
    hosts = [name for name, o in result.hosts.items() if o.status in ON_THE_RELEASE]
    if verb == "rollback":
        return notify.rollback(hosts, result.release_id)
    if verb == "promote":
        return notify.promoted(hosts)
    if verb == "abort":
        return notify.aborted(hosts)
    return None


def after(around: Around, reporter: Any, *, result: RunResult | None, exit_code: int,
          seconds: float, message: str, data: dict[str, Any], json_file: str | None
          ) -> dict[str, Any]:
    """The run's end, however it ended: the ``rollback``/``promoted``/``aborted``
    notification (``result``: the run of the verb), ``finished`` with the command's exit
    code, the post-hooks (unless the pre-hook stopped the run: also when the run ended before
    its pre-hook was due, the lock held or no host reachable), then the delivery report.
    Returns what to add to the JSON result."""
    done = outcome_event(around.verb, result)
    if done is not None:
        around.notifier.send(done)
    failed = failed_hosts(result) if result is not None else []
    statuses = [(name, o.status) for name, o in result.hosts.items()] if result else []
    around.notifier.send(notify.finished(exit_code, seconds, message, failed, statuses))
    if not around.refused:
        with hooks.result_file(data, json_file) as path:
            end = hooks.RunEnd(exit_code=exit_code, seconds=seconds, result_file=path,
                               message=message, failed_hosts=tuple(failed))
            for moment in hooks.moments_after(around.verb, exit_code):
                if around.found.has(moment):
                    run_hook(around, moment, reporter, hooks.hook_env(around.facts, end))
    delivery = around.notifier.close(NOTIFY_CLOSE_S)
    for line in delivery.lines():
        reporter.note(f"notifications: {line}")
    return {"hooks": around.results, "notifications": delivery.as_dict()}


def ended_early(around: Around, reporter: Any, error: TfsDeployError, *, command: str,
                seconds: float) -> None:
    """The end of a run that raised instead of returning a result (the lock held, exit 4; no
    host reachable, exit 3; ...): ``finished``, the post-hooks and ``on-failure`` as after any
    run, unless the pre-hook refused it or it was invalid input found before its pre-hook
    was due (nothing was attempted); then the notifier is closed."""
    code = int(error.exit_code)
    if around.refused or (code == ExitCode.INVALID and not around.pre_passed):
        close(around)
        return
    data = {"command": command, "model": around.facts.model, "exit_code": code,
            "result": hooks.result_name(code), "message": str(error), "hosts": {}}
    after(around, reporter, result=None, exit_code=code, seconds=seconds, message=str(error),
          data=data, json_file=None)


def close(around: Around) -> None:
    """Stop the notifier of a run that ends without a result (a pre-hook's refusal, an
    error) or without events (a guard that never acted)."""
    around.notifier.close(NOTIFY_CLOSE_S)
