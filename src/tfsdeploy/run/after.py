"""A run's end, in one order whatever its verb: the notes read of the fleet (orphans, gateway
drift) join the result, within their own deadline (``engine.NOTES_DEADLINE_S``: a read still
going then, or at a Ctrl-C or SIGTERM, is one "not read" line); the result is recorded (the
JSON result, the textfile); only then do the after-passes run (the model's targets,
post-hooks, notifications), under one deadline, on the run's own session. An after-pass never
changes what was recorded, and a failure there is a line, never the run's exit code.

From the end of the roll to the process's exit, Ctrl-C, SIGTERM and SIGHUP are taken here,
each said ("the result stands as recorded"), and the command ends with the run's own exit code
(the engine's handlers, which stop a roll, are gone by then: without these a late signal would
kill the process before anything was recorded, or record a Ctrl-C as the run's end). Ctrl-C and
SIGTERM (cron's `timeout`, a systemd stop) ask to stop: the after-pass under way is left and
the others are skipped. SIGHUP only says that the operator's terminal is gone: the after-passes
go on (their hooks and notifications are still wanted).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tfsdeploy.run.signals import handled

if TYPE_CHECKING:
    from tfsdeploy.run.jobs import Session

# what a run's after-passes may take together: a filtered Prometheus host is given up on
AFTER_DEADLINE_S = 120.0


class Noting(Protocol):
    """Where an after-pass's lines go (the run's reporter)."""

    def note(self, text: str) -> None:
        """A fleet-level message."""


def warn(reporter: Noting, text: str) -> None:
    """A line about something that went wrong after the run: the reporter's ``warn`` when it
    has one (stderr), else its notes."""
    getattr(reporter, "warn", reporter.note)(text)


@dataclass(frozen=True)
class StepEvent:
    """One step of a run ended, typed for the run's listeners (the targets follow
    ``processes_changed``; nothing matches a step's name)."""

    host: str
    phase: str
    task: str
    status: str  # ok, failed, paused
    seconds: float
    detail: str
    # a serving process started, stopped, was removed or became AVAILABLE on the host
    processes_changed: bool = False
    gate: bool = False  # the step is a gate (its failure is a gate's verdict)


@dataclass(frozen=True)
class RunStarted:
    """The run has its lock and facts; its hosts are about to change."""

    version: int
    release: str


@dataclass(frozen=True)
class BatchStarted:
    """A batch of a serial phase starts (1-based ``batch`` of ``batches``)."""

    batch: int
    batches: int
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class HostRolled:
    """A host serves the run's release (``seconds``: its roll phase)."""

    host: str
    release: str
    seconds: float


@dataclass(frozen=True)
class HostGateFailed:
    """A gate's verdict failed the host's roll."""

    host: str
    gate: str
    message: str


@dataclass(frozen=True)
class CanaryPausedOn:
    """The canary paused at its last weight on these hosts."""

    hosts: tuple[str, ...]
    weight: int


@dataclass(frozen=True)
class GuardTriggered:
    """The guard judged an SLO broken on ``host`` and starts its ``action`` (rollback or
    abort)."""

    host: str
    message: str
    action: str


RunEvent = RunStarted | BatchStarted | HostRolled | HostGateFailed | CanaryPausedOn | GuardTriggered
"""What a run (or the guard) reports as it goes, typed for the reporters that take events
(notifications match on the type, never on a name)."""

Listener = Callable[[StepEvent, "Session"], None]
"""Told of every step of the run as it ends, with the run's session (the targets' writer)."""

NotePass = Callable[["Session"], list[str]]
"""A read of the fleet whose lines join the run's result before it is recorded."""


@dataclass(frozen=True)
class AfterPass:
    """Work after the run's result is recorded (targets, post-hooks, notifications)."""

    name: str
    run: Callable[[Any, Session | None], None]  # (the run's result, its session)


@dataclass(frozen=True)
class Epilogue:
    """What a command asks of its run's end."""

    notes: Sequence[NotePass] = ()
    # the verb's own summary of its result (a prune's freed bytes), before it is recorded
    summarize: Callable[[Any], Any] | None = None
    record: Callable[[Any], None] | None = None  # writes the result first
    after: Sequence[AfterPass] = ()
    deadline_s: float = AFTER_DEADLINE_S
    listeners: Sequence[Listener] = ()


NO_EPILOGUE = Epilogue()


@dataclass
class LateSignals:
    """The signals that arrived after the roll."""

    names: list[str] = field(default_factory=list)

    @property
    def stop(self) -> str:
        """The last signal that asks to stop (Ctrl-C, SIGTERM; '' when none did)."""
        return next((n for n in reversed(self.names) if n != "SIGHUP"), "")


@contextmanager
def late_signals(reporter: Noting) -> Iterator[LateSignals]:
    """Ctrl-C, SIGTERM and SIGHUP said and kept, never raised, for the block (the engine's
    own handlers take over inside it while it rolls)."""
    seen = LateSignals()

    def handler(signum: int) -> None:
        name = signal.Signals(signum).name
        seen.names.append(name)
        then = ("the after-passes go on (the terminal is gone)" if signum == signal.SIGHUP
                else "the after-passes left are skipped")
        reporter.note(f"{name} after the roll: its result stands as recorded; {then}")

    with handled(handler):
        yield seen


def ended_by(work: Callable[[], None], end: float, late: LateSignals, *, name: str) -> bool:
    """Run ``work`` in a thread of its own until it ends, ``end`` (``time.monotonic()``)
    passes or a late Ctrl-C or SIGTERM asks to stop; whether it ended. What it leaves goes on
    in its daemon thread (the run's close of its session ends what waits on a host)."""
    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    while worker.is_alive() and not late.stop and time.monotonic() < end:
        worker.join(timeout=0.1)
    return not worker.is_alive()


def run_after_passes(passes: Sequence[AfterPass], result: Any, session: Session | None, *,
                     deadline_s: float, late: LateSignals, reporter: Noting) -> list[str]:
    """Run ``passes`` one after another, each in a thread of its own so that the deadline and
    a late signal can leave it; returns what was cut short or skipped."""
    end = time.monotonic() + deadline_s
    code = getattr(result, "exit_code", None)
    recorded = f"after the run (exit code {int(code)}, already recorded)" if code is not None \
        else "after the run (its end already recorded)"
    cut: list[str] = []
    for index, chosen in enumerate(passes):
        if late.stop or time.monotonic() >= end:
            why = late.stop or f"the {deadline_s:g} s deadline"
            cut += [f"{p.name} skipped ({why})" for p in passes[index:]]
            break
        failure: list[BaseException] = []

        def body(step: AfterPass = chosen, errors: list[BaseException] = failure) -> None:
            try:
                step.run(result, session)
            except BaseException as error:  # a line, never the run's exit code
                errors.append(error)

        if not ended_by(body, end, late, name=f"after-{chosen.name}"):
            why = late.stop or f"the {deadline_s:g} s deadline"
            cut.append(f"{chosen.name} cut short ({why})")
        elif failure:
            warn(reporter, f"{recorded}: {type(failure[0]).__name__}: {failure[0]} (in "
                           f"{chosen.name})")
    for line in cut:
        warn(reporter, f"{recorded}: {line}")
    return cut
