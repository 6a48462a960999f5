"""What surrounds a run for runbooks: its hooks (a pre-hook may stop it before any host is
touched; post-hooks report) and its event notifications (sent in the background, reported at
the end). See docs/hooks.md."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfsdeploy import hooks, notify
from tfsdeploy.lock import current_user
from tfsdeploy.target import Target

NOTIFY_CLOSE_S = 0.8  # the most a dead receiver may add to a run at its end


@dataclass
class Around:
    """A run's hooks, notifier and facts."""

    command: str
    found: hooks.Hooks
    notifier: notify.Notifier
    facts: hooks.RunFacts
    results: list[dict[str, Any]] = field(default_factory=list)


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
    return Around(command, found, notify.Notifier(urls, facts), facts)


def before(around: Around, reporter: Any) -> None:
    """Run the pre-hook: a refusal stops the run here (exit 1, its output shown)."""
    moment = hooks.moment_before(around.command)
    if moment is None or around.found.path_for(moment) is None:
        return
    result = hooks.run_hook(around.found, moment, hooks.hook_env(around.facts))
    around.results.append(result.as_dict())
    reporter.note(f"hook {result.describe()}")
    refusal = result.refusal()
    if refusal is not None:
        around.notifier.close(NOTIFY_CLOSE_S)
        raise refusal


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

    def progress(self, host: str, update: Any) -> None:
        """As the inner reporter."""
        show = getattr(self.inner, "progress", None)
        if show is not None:
            show(host, update)

    def event(self, kind: str, **data: Any) -> None:
        """An engine event as a notification."""
        if self.around is None:
            return
        send = self.around.notifier.send
        if kind == "run_started":
            send(notify.run_started())
        elif kind == "batch_started":
            send(notify.batch_started(data["batch"], data["batches"], data["hosts"]))
        elif kind == "host_rolled":
            send(notify.host_rolled(data["host"], release=data["release"],
                                    seconds=data["seconds"]))
        elif kind == "gate_failed":
            send(notify.gate_failed(data["host"], data["gate"], data["message"]))


def after(around: Around, reporter: Any, *, exit_code: int, seconds: float, message: str,
          failed_hosts: Sequence[str], data: dict[str, Any], json_file: str | None
          ) -> dict[str, Any]:
    """The run's end: the ``finished`` (and ``rollback``) notification, the post-hooks with
    the result, then the delivery report. Returns what to add to the JSON result."""
    if around.command == "rollback":
        around.notifier.send(notify.rollback(list(around.facts.hosts), around.facts.release,
                                             message))
    around.notifier.send(notify.finished(exit_code, seconds, message, list(failed_hosts)))
    with hooks.result_file(data, json_file) as path:
        end = hooks.RunEnd(exit_code=exit_code, seconds=seconds, result_file=path,
                           message=message, failed_hosts=tuple(failed_hosts))
        for moment in hooks.moments_after(around.command, exit_code):
            if around.found.path_for(moment) is None:
                continue
            result = hooks.run_hook(around.found, moment, hooks.hook_env(around.facts, end))
            around.results.append(result.as_dict())
            reporter.note(f"hook {result.describe()}")
    delivery = around.notifier.close(NOTIFY_CLOSE_S)
    for line in delivery.lines():
        reporter.note(f"notifications: {line}")
    return {"hooks": around.results, "notifications": delivery.as_dict()}
