"""Event notifications: one JSON POST per event to each receiver, never holding the run up.

``send`` only puts the event on each receiver's bounded queue (microseconds; when a queue is
full the oldest event is dropped, so the newest, such as ``finished``, still goes out). One
background worker per receiver posts its events in order, with a per-request timeout and
retries with capped exponential backoff and jitter (tenacity) over httpx; a receiver that is
down or slow delays only its own queue. ``close(deadline_s)`` waits at most that long and
returns what was delivered, failed, dropped or left unsent, per receiver. Delivery is at least
once: a retry after a timeout may repeat an event, which receivers can spot by its ``id``.
The ``text`` field is a Slack-compatible message (``&``, ``<``, ``>`` escaped as Slack
requires); the other fields carry the same facts for machines.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_any,
    stop_when_event_set,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.runbook.hooks import RunFacts, result_name

SCHEMA = "tfsdeploy.event/1"
MAX_MESSAGE_CHARS = 4000
MAX_TEXT_HOSTS = 10


class EventKind(StrEnum):
    """What happened; the value is the payload's ``event`` field."""

    RUN_STARTED = "run_started"
    BATCH_STARTED = "batch_started"
    HOST_ROLLED = "host_rolled"
    GATE_FAILED = "gate_failed"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ABORTED = "aborted"
    FINISHED = "finished"
    ROLLBACK = "rollback"
    GUARD_TRIGGERED = "guard_triggered"


@dataclass(frozen=True)
class Event:
    """One event of a run; fields that do not apply stay unset and are left out of the payload."""

    kind: EventKind
    host: str = ""
    hosts: tuple[str, ...] = ()
    batch: int | None = None  # 1-based
    batches: int | None = None
    gate: str = ""
    release: str = ""  # the release a host now serves (host_rolled) or returned to (rollback)
    exit_code: int | None = None
    seconds: float | None = None
    message: str = ""
    weight: int | None = None  # paused: the new release's share of the canary hosts' requests
    action: str = ""  # guard_triggered: rollback, or abort (of a paused canary)
    statuses: tuple[tuple[str, str], ...] = ()  # finished: (host, its result), every host


def run_started() -> Event:
    """The run began (after validation and the pre-hook, before the first host is changed)."""
    return Event(EventKind.RUN_STARTED)


def batch_started(batch: int, batches: int, hosts: Sequence[str]) -> Event:
    """Batch ``batch`` of ``batches`` (1-based) starts on ``hosts``."""
    return Event(EventKind.BATCH_STARTED, hosts=tuple(hosts), batch=batch, batches=batches)


def host_rolled(host: str, *, release: str, seconds: float) -> Event:
    """``host`` now serves ``release``; its roll took ``seconds``."""
    return Event(EventKind.HOST_ROLLED, host=host, release=release, seconds=seconds)


def gate_failed(host: str, gate: str, message: str) -> Event:
    """A gate (a ``gate_*`` step, or a canary step) failed on ``host``, which is restored."""
    return Event(EventKind.GATE_FAILED, host=host, gate=gate, message=message)


def paused(hosts: Sequence[str], *, weight: int) -> Event:
    """The canary holds ``weight`` % of ``hosts``' requests and waits for promote or abort."""
    return Event(EventKind.PAUSED, hosts=tuple(hosts), weight=weight)


def promoted(hosts: Sequence[str], message: str = "") -> Event:
    """The paused canary's release was rolled on: ``hosts`` serve it."""
    return Event(EventKind.PROMOTED, hosts=tuple(hosts), message=message)


def aborted(hosts: Sequence[str], message: str = "") -> Event:
    """The paused canary was aborted: ``hosts`` are back on their previous release."""
    return Event(EventKind.ABORTED, hosts=tuple(hosts), message=message)


def finished(exit_code: int, seconds: float, message: str = "",
             failed_hosts: Sequence[str] = (),
             statuses: Sequence[tuple[str, str]] = ()) -> Event:
    """The run ended with ``exit_code`` (``hosts``: those that failed; ``statuses``: every
    host's result)."""
    return Event(EventKind.FINISHED, hosts=tuple(failed_hosts), exit_code=exit_code,
                 seconds=seconds, message=message, statuses=tuple(statuses))


def rollback(hosts: Sequence[str], release: str, message: str = "") -> Event:
    """``hosts`` were returned to ``release`` (by ``fab rollback`` or the guard)."""
    return Event(EventKind.ROLLBACK, hosts=tuple(hosts), release=release, message=message)


def guard_triggered(host: str, message: str, *, action: str) -> Event:
    """The guard saw ``host`` break the SLO (or a paused canary fail) for long enough and
    acts: ``action`` is ``rollback`` or ``abort``."""
    return Event(EventKind.GUARD_TRIGGERED, host=host, message=message, action=action)


def slack_escape(text: str) -> str:
    """``&``, ``<`` and ``>`` as Slack's formatting rules require (others stay as they are)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _host_list(hosts: Sequence[str]) -> str:
    shown = ", ".join(hosts[:MAX_TEXT_HOSTS])
    more = len(hosts) - MAX_TEXT_HOSTS
    return f"{shown} and {more} more" if more > 0 else shown


def _first_line(message: str) -> str:
    line = (message.strip().splitlines() or [""])[0]
    return line if len(line) <= 300 else line[:299] + "…"


def event_text(facts: RunFacts, event: Event) -> str:
    """The one-line human message (before Slack escaping)."""
    version = f" v{facts.version}" if facts.version is not None else ""
    subject = f"{facts.command} {facts.model}{version}"
    why = f": {_first_line(event.message)}" if event.message.strip() else ""
    seconds = f" in {event.seconds:.1f}s" if event.seconds is not None else ""
    release = event.release or facts.release or "?"
    match event.kind:
        case EventKind.RUN_STARTED:
            named = f" ({facts.release})" if facts.release else ""
            return (f"{facts.who or 'someone'} started {subject}{named} on "
                    f"{len(facts.hosts)} host(s): {_host_list(facts.hosts)}")
        case EventKind.BATCH_STARTED:
            return (f"{subject}: batch {event.batch}/{event.batches} started on "
                    f"{_host_list(event.hosts)}")
        case EventKind.HOST_ROLLED:
            return f"{subject}: {event.host} rolled{seconds}, now serving {event.release}"
        case EventKind.GATE_FAILED:
            return f"{subject}: gate {event.gate} failed on {event.host}{why}"
        case EventKind.PAUSED:
            return (f"{subject}: canary {release} paused at {event.weight}% on "
                    f"{_host_list(event.hosts)}: `fab promote --model {facts.model}` finishes "
                    f"the roll, `fab abort --model {facts.model}` returns "
                    f"{'it' if len(event.hosts) == 1 else 'them'} to the old release")
        case EventKind.PROMOTED:
            return f"{subject}: canary {release} promoted, {_host_list(event.hosts)} serve it{why}"
        case EventKind.ABORTED:
            return (f"{subject}: canary {release} aborted, {_host_list(event.hosts)} back on "
                    f"their previous release{why}")
        case EventKind.FINISHED:
            return f"{subject} finished: {_outcome(event)}{seconds}{_hosts_by_result(event)}{why}"
        case EventKind.ROLLBACK:
            return f"{subject}: {_host_list(event.hosts)} back on {release}{why}"
        case EventKind.GUARD_TRIGGERED:
            doing = {"rollback": "rolling back", "abort": "aborting the paused canary"}.get(
                event.action, event.action or "acting")
            return f"{subject}: guard triggered on {event.host}, {doing}{why}"
    return f"{subject} {event.kind.value}{why}"


def _outcome(event: Event) -> str:
    code = event.exit_code if event.exit_code is not None else -1
    return f"{result_name(code)} (exit {code})"


def _hosts_by_result(event: Event) -> str:
    """`` (failed: h2)``, or after a pause `` (paused: h1; pending: h2, h3)``."""
    parts = [f"failed: {_host_list(event.hosts)}"] if event.hosts else []
    for status in ("paused", "pending"):
        named = [host for host, seen in event.statuses if seen == status]
        if named:
            parts.append(f"{status}: {_host_list(named)}")
    return f" ({'; '.join(parts)})" if parts else ""


def payload(facts: RunFacts, event: Event, *, seq: int, at: float) -> dict[str, Any]:
    """The JSON body for one event (pure): ``text`` for chat, then the facts for machines."""
    body: dict[str, Any] = {
        "text": slack_escape(f"[tfsdeploy] {event_text(facts, event)}"),
        "schema": SCHEMA, "id": f"{facts.run_id}.{seq}", "seq": seq,
        "event": event.kind.value,
        "time": datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds"),
        "command": facts.command, "model": facts.model, "version": facts.version,
        "release": facts.release, "who": facts.who, "run_id": facts.run_id,
        "selected_hosts": list(facts.hosts)}
    optional: dict[str, Any] = {
        "host": event.host or None, "hosts": list(event.hosts) or None,
        "batch": event.batch, "batches": event.batches, "gate": event.gate or None,
        "to_release": event.release or None, "exit_code": event.exit_code,
        "result": None if event.exit_code is None else result_name(event.exit_code),
        "seconds": None if event.seconds is None else round(event.seconds, 3),
        "message": event.message[:MAX_MESSAGE_CHARS] or None, "weight": event.weight,
        "action": event.action or None, "host_status": dict(event.statuses) or None}
    return body | {k: v for k, v in optional.items() if v is not None}


def check_urls(urls: Sequence[str], *, source: str = "--notify") -> tuple[str, ...]:
    """The receivers, each once, in order; every malformed URL is an error (ConfigError)."""
    problems = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
            problems.append(Problem(
                f"notification URL {redact(url)!r} is not an http:// or https:// URL with a "
                "host", fix="give the receiver's full URL, e.g. https://hooks.example.com/T/B/X",
                field=source))
    if problems:
        raise ConfigError(problems)
    return tuple(dict.fromkeys(urls))


def redact(url: str) -> str:
    """The URL without what may be a secret (user, path, query): webhook URLs carry their
    token in the path, and reports and logs are read by many."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if _has_port(parts.netloc) else ""
    hidden = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{host}{port}{hidden}" if parts.scheme else "(not a URL)"


def _has_port(netloc: str) -> bool:
    try:
        return urlsplit(f"//{netloc}").port is not None
    except ValueError:
        return False


@dataclass(frozen=True)
class DeliveryPolicy:
    """How hard to try. The defaults keep a dead receiver's cost to ``close``'s deadline."""

    request_timeout_s: float = 2.0
    attempts: int = 4
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 2.0
    queue_size: int = 100


@dataclass(frozen=True)
class ReceiverReport:
    """What became of the events sent to one receiver."""

    receiver: str  # redacted URL
    delivered: int = 0
    failed: int = 0  # every attempt failed, or the receiver refused it (4xx)
    dropped: int = 0  # the queue was full (the oldest went) or the run had closed
    unsent: int = 0  # still queued or in flight when close's deadline came
    attempts: int = 0
    last_error: str = ""
    in_flight_s: float = 0.0  # how long the event in flight at the deadline had been tried

    @property
    def ok(self) -> bool:
        """Every event was delivered."""
        return not (self.failed or self.dropped or self.unsent)

    def line(self) -> str:
        """One line for people."""
        parts = [f"{self.delivered} delivered"]
        parts += [f"{n} {what}" for n, what in ((self.failed, "failed"),
                                                (self.dropped, "dropped (queue full)"),
                                                (self.unsent, "not sent by the end of the run"))
                  if n]
        if self.in_flight_s:
            parts.append(f"one still being tried after {self.in_flight_s:.1f}s")
        error = f"; last error: {self.last_error}" if self.last_error else ""
        hint = "" if self.ok else " (the receiver is slow or down)"
        return f"notifications to {self.receiver}: {', '.join(parts)}{error}{hint}"


@dataclass(frozen=True)
class DeliveryReport:
    """Every receiver's report, and how long ``close`` waited."""

    receivers: tuple[ReceiverReport, ...] = ()
    waited_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Every event reached every receiver."""
        return all(r.ok for r in self.receivers)

    def lines(self) -> list[str]:
        """One line per receiver."""
        return [r.line() for r in self.receivers]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for the run's result."""
        return {"ok": self.ok, "waited_s": round(self.waited_s, 3),
                "receivers": [r.__dict__ | {"ok": r.ok} for r in self.receivers]}


class _Retryable(Exception):
    """The receiver may take it later: no connection, a timeout, 408/425/429 or 5xx."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class _Refused(Exception):
    """The receiver will never take it (other 3xx/4xx): retrying cannot help."""


RETRYABLE_STATUS = frozenset({408, 425, 429}) | frozenset(range(500, 600))


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None  # absent, or an HTTP date: the backoff decides


def _post_once(client: httpx.Client, url: str, body: bytes) -> None:
    """One POST; raises _Retryable or _Refused unless the receiver answered 2xx."""
    try:
        response = client.post(url, content=body)
    except httpx.TransportError as error:
        raise _Retryable(_transport_reason(error)) from None
    if response.is_success:
        return
    reason = f"HTTP {response.status_code}"
    if response.status_code in RETRYABLE_STATUS:
        raise _Retryable(reason, _retry_after(response))
    raise _Refused(f"{reason} (not retried: fix the URL or the receiver)")


def _transport_reason(error: httpx.TransportError) -> str:
    if isinstance(error, httpx.TimeoutException):
        return f"no answer in time ({type(error).__name__})"
    if isinstance(error, httpx.ConnectError):
        return f"cannot connect ({error})"
    return f"{type(error).__name__}: {error}"


class _StartsAfter(stop_base):
    """Give up when the next attempt would start after a deadline (monotonic; None: none)."""

    def __init__(self, deadline: Callable[[], float | None]) -> None:
        self._deadline = deadline

    def __call__(self, state: RetryCallState) -> bool:
        deadline = self._deadline()
        return deadline is not None and time.monotonic() + state.upcoming_sleep > deadline


class _Receiver:
    """One URL's bounded queue and the worker thread that drains it in order."""

    def __init__(self, url: str, policy: DeliveryPolicy, abandon: threading.Event) -> None:
        self.url, self._policy, self._abandon = url, policy, abandon
        self._queue: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._deadline: float | None = None  # close's deadline (monotonic), once closing
        self._in_flight: float | None = None  # when the event being posted was taken
        self._down = False  # the last event failed: try the next ones once each until one works
        self._counts = {"delivered": 0, "failed": 0, "dropped": 0, "attempts": 0}
        self._last_error = ""
        self._thread = threading.Thread(target=self._work, name=f"notify {redact(url)}",
                                        daemon=True)
        self._thread.start()

    def offer(self, body: bytes) -> None:
        """Queue an event; the oldest goes when the queue is full."""
        with self._cond:
            if self._closing:
                self._counts["dropped"] += 1
                return
            if len(self._queue) >= self._policy.queue_size:
                self._queue.popleft()
                self._counts["dropped"] += 1
            self._queue.append(body)
            self._cond.notify()

    def close(self, deadline: float) -> None:
        """Accept no more events; the worker ends once the queue is empty, and no longer starts
        a retry that could not begin before ``deadline`` (monotonic)."""
        with self._cond:
            self._closing = True
            self._deadline = deadline
            self._cond.notify()

    def join(self, timeout_s: float) -> None:
        """Wait for the worker, at most ``timeout_s``."""
        self._thread.join(max(0.0, timeout_s))

    def report(self) -> ReceiverReport:
        """The counts so far."""
        with self._cond:
            taken = self._in_flight
            unsent = len(self._queue) + (taken is not None)
            counts = self._counts
            return ReceiverReport(redact(self.url), delivered=counts["delivered"],
                                  failed=counts["failed"], dropped=counts["dropped"],
                                  unsent=unsent, attempts=counts["attempts"],
                                  last_error=self._last_error,
                                  in_flight_s=0.0 if taken is None else time.monotonic() - taken)

    def _next(self) -> bytes | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue or self._abandon.is_set():
                return None
            self._in_flight = time.monotonic()
            return self._queue.popleft()

    def _work(self) -> None:
        try:
            with httpx.Client(timeout=self._policy.request_timeout_s,
                              headers={"content-type": "application/json",
                                       "user-agent": "tfsdeploy"}) as client:
                while (body := self._next()) is not None:
                    outcome = self._deliver(client, body)
                    with self._cond:
                        self._in_flight = None
                        self._counts["delivered" if outcome is None else "failed"] += 1
                        self._down = outcome is not None
                        if outcome is not None:
                            self._last_error = outcome
        except Exception as error:  # the queue's events are then reported as not sent
            with self._cond:
                self._last_error = f"notifications stopped: {type(error).__name__}: {error}"

    def _pause(self, seconds: float) -> None:
        """A backoff sleep that close's deadline cuts short."""
        self._abandon.wait(seconds)

    def _deliver(self, client: httpx.Client, body: bytes) -> str | None:
        """Post with retries; None when delivered, else why not."""
        policy = self._policy
        backoff = wait_random_exponential(multiplier=policy.backoff_initial_s,
                                          min=policy.backoff_initial_s, max=policy.backoff_max_s)

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            after = error.retry_after_s if isinstance(error, _Retryable) else None
            return max(backoff(state), min(after or 0.0, policy.backoff_max_s))

        def attempt() -> None:
            with self._cond:
                self._counts["attempts"] += 1
            _post_once(client, self.url, body)

        retrying = Retrying(
            stop=stop_any(stop_after_attempt(1 if self._down else policy.attempts),
                          stop_when_event_set(self._abandon),
                          _StartsAfter(lambda: self._deadline)),
            wait=wait, retry=retry_if_exception_type(_Retryable), reraise=True,
            sleep=self._pause)
        try:
            retrying(attempt)
        except (_Retryable, _Refused) as error:
            return str(error)
        except Exception as error:  # a bug here must not kill the worker or the run
            return f"{type(error).__name__}: {error}"
        return None


class Notifier:
    """Sends a run's events to every receiver in the background; ``close`` reports."""

    def __init__(self, urls: Sequence[str], facts: RunFacts, *,
                 policy: DeliveryPolicy | None = None) -> None:
        """Check ``urls`` (ConfigError naming each bad one) and start one worker per URL."""
        self.facts = facts
        self.policy = policy or DeliveryPolicy()
        self._abandon = threading.Event()
        self._receivers = [_Receiver(url, self.policy, self._abandon)
                           for url in check_urls(urls)]
        self._seq = 0
        self._lock = threading.Lock()
        self._unbuilt = 0

    def send(self, event: Event) -> None:
        """Queue ``event`` for every receiver; returns at once and never raises."""
        if not self._receivers:
            return
        try:
            with self._lock:
                self._seq += 1
                seq = self._seq
            body = json.dumps(payload(self.facts, event, seq=seq, at=time.time()),
                              default=str).encode()
        except Exception:  # a malformed event must not stop the run
            with self._lock:
                self._unbuilt += 1
            return
        for receiver in self._receivers:
            receiver.offer(body)

    def close(self, deadline_s: float = 0.8) -> DeliveryReport:
        """Stop accepting events, wait at most ``deadline_s`` for the queues to empty, and
        report. Whatever is still queued or in flight then is abandoned (and counted)."""
        started = time.monotonic()
        end = started + deadline_s
        for receiver in self._receivers:
            receiver.close(end)
        for receiver in self._receivers:
            receiver.join(end - time.monotonic())
        self._abandon.set()
        reports = tuple(r.report() for r in self._receivers)
        if self._unbuilt:
            reports += (ReceiverReport("(every receiver)", dropped=self._unbuilt,
                                       last_error="an event could not be encoded"),)
        return DeliveryReport(reports, time.monotonic() - started)
