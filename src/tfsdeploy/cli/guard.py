"""`fab guard`: watch each host's TFServing metrics; roll back when the SLO breaks for long
enough. Meant for cron/systemd: no prompts, bounded, documented exit codes.

Rates are computed per serving process: each slot's own REST port is read, on every instance of
a host that runs one server per GPU (not the stable port, which changes process at a switch),
each process's counters are compared only with that process's previous reading, and a host's
processes are added up for its verdict. A process that starts (a switch, a restart) gives its
first reading as a baseline.

While a canary is paused, its hosts run the new release beside the old one: the guard also
judges the new slot against the old one on each canary host, over the last ``for_s`` seconds,
with the model's canary policy (the analysis of the canary steps). A failing verdict, or any
sustained SLO breach, aborts the canary (`fab abort`: the canary hosts back on the old slot at
100 %, the lock freed) instead of rolling back, since the paused release holds the lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tfsdeploy.cli.canary import finish_canary
from tfsdeploy.cli.rollback import rollback
from tfsdeploy.core.canary import CanaryState, judge, slot_figures
from tfsdeploy.core.canary_policy import CanaryPolicy, Verdict
from tfsdeploy.core.errors import ExitCode, TfsDeployError
from tfsdeploy.core.fleet import ResolvedHost
from tfsdeploy.core.gpu import instance_gpus
from tfsdeploy.core.guard import Breach, Scrape, Window, bucket_deltas, merge, parse_metrics, window
from tfsdeploy.core.layout import model_ports, other_slot
from tfsdeploy.core.target import Target
from tfsdeploy.hosts import probes
from tfsdeploy.run import survey
from tfsdeploy.run.engine import Reporter, RunResult, emit
from tfsdeploy.run.jobs import Verb
from tfsdeploy.run.plans import paused_canary


@dataclass(frozen=True)
class GuardPolicy:
    """When to act."""

    max_error_rate: float = 0.01
    slo_p99_ms: float | None = None  # None: the model's latency SLO
    for_s: float = 30.0
    interval_s: float = 5.0
    duration_s: float | None = None  # None: until a rollback (or forever)
    min_requests: int = 20
    lock_wait: float = 60.0
    # client errors (malformed requests) count only when asked: anyone able to send bad
    # requests could otherwise roll a good release back
    count_client_errors: bool = False
    # how often a paused canary is looked for again (SSH to every host)
    paused_refresh_s: float = 60.0


@dataclass(frozen=True)
class PausedCanary:
    """A canary left paused: its release and, per canary host, its new slot."""

    release: str
    new_slots: Mapping[str, str]  # host -> the slot the paused release serves from


def scrape(address: str, port: int, path: str, model: str) -> Scrape:
    """One read of one server process's metrics (its slot's REST port)."""
    return parse_metrics(probes.metrics(address, port, path), model)


Scraper = Callable[[str, int, str, str], Scrape]
Process = tuple[str, int]  # (slot, REST port) of one serving process on a host
Readings = dict[Process, Scrape]


def processes(host: ResolvedHost, target: Target) -> list[Process]:
    """Every serving process the host may run for the model: each instance's two slots."""
    ports = model_ports(host, target.model)
    count = len(instance_gpus(host, target.model))
    return [(slot, ports.slot_rest(slot, k)) for k in range(count) for slot in ports.slots]


def read_host(host: ResolvedHost, target: Target, read: Scraper) -> Readings:
    """The metrics of each of the host's processes that answers (a stopped slot does not)."""
    found: Readings = {}
    for process in processes(host, target):
        try:
            found[process] = read(host.address, process[1], host.vars.monitoring_path,
                                  target.model.name)
        except Exception:  # a stopped slot: no process to read
            continue
    return found


def host_window(before: Readings, now: Readings, *, count_client_errors: bool = False
                ) -> Window | None:
    """The host's traffic between two readings, over the processes read both times (None when
    no process was)."""
    both = [p for p in now if p in before]
    if not both:
        return None
    return merge([window(before[p], now[p], count_client_errors=count_client_errors)
                  for p in both], [bucket_deltas(before[p], now[p]) for p in both])


@dataclass
class History:
    """Each host's readings over the last ``keep_s`` seconds (oldest first)."""

    keep_s: float
    readings: dict[str, list[tuple[float, Readings]]] = field(default_factory=dict)

    def add(self, host: str, at: float, readings: Readings) -> None:
        """Keep a reading; drop those no longer needed for a window of ``keep_s``."""
        kept = self.readings.setdefault(host, [])
        kept.append((at, readings))
        while len(kept) > 1 and at - kept[1][0] >= self.keep_s:
            kept.pop(0)

    def window(self, host: str) -> tuple[float, Readings, Readings] | None:
        """(seconds covered, first, last) of the host's kept readings (None: fewer than 2)."""
        kept = self.readings.get(host, [])
        if len(kept) < 2:
            return None
        return kept[-1][0] - kept[0][0], kept[0][1], kept[-1][1]


def canary_verdict(first: Readings, last: Readings, new_slot: str, policy: CanaryPolicy
                   ) -> tuple[Verdict, str]:
    """The new slot against the old one between two readings of a paused canary host (the
    processes read both times; a process that restarted counts from its restart)."""
    old_slot = other_slot(new_slot)

    def pair(slot: str) -> tuple[list[Scrape], list[Scrape]]:
        both = [p for p in last if p in first and p[0] == slot]
        return [first[p] for p in both], [last[p] for p in both]

    result = judge(slot_figures(*pair(old_slot)), slot_figures(*pair(new_slot)), policy)
    return result.verdict, result.describe()


def find_paused(target: Target) -> PausedCanary | None:
    """The model's paused canary, read from the hosts' release records (None: none)."""
    def look(target: Target, host: ResolvedHost, conn: Any, facts: Any) -> dict[str, Any]:
        return {"facts": facts}

    rows = survey.each_host(target, look)
    facts = {r["host"]: r["facts"] for r in rows if r["reachable"]}
    record, state = paused_canary(facts)
    if record is None or state is not CanaryState.PAUSED:
        return None
    slots = {}
    for host, host_facts in facts.items():
        held = host_facts.record(record.id)
        if held is not None and (held.canary or {}).get("state") == CanaryState.PAUSED:
            slots[host] = held.slot
    return PausedCanary(record.id, slots) if slots else None


@dataclass
class Watch:
    """What the guard watches between two looks for a paused canary."""

    paused: PausedCanary | None
    looked_at: float


def guard(target: Target, policy: GuardPolicy, *, reporter: Reporter,
          act: Callable[[], RunResult] | None = None, read: Scraper = scrape,
          sleep: Callable[[float], None] = time.sleep,
          look_for_paused: Callable[[Target], PausedCanary | None] = find_paused,
          abort: Callable[[], RunResult] | None = None,
          clock: Callable[[], float] = time.monotonic) -> tuple[ExitCode, str]:
    """Watch until a sustained breach (then roll back, or abort a paused canary) or the
    duration ends."""
    slo = policy.slo_p99_ms or target.model.latency_slo_ms
    canary_policy = target.model.rollout.canary or CanaryPolicy()
    breach = Breach()
    last: dict[str, Readings] = {}
    history = History(keep_s=policy.for_s)
    start = clock()
    watch = Watch(look_for_paused(target), start)
    counted = "all errors" if policy.count_client_errors else "server errors"
    reporter.note(f"guarding {target.model.name} on {len(target.hosts)} host(s): error rate "
                  f"<= {policy.max_error_rate:.2%} ({counted}), P99 <= {slo:g} ms; act "
                  f"after {policy.for_s:g} s of breach")
    if watch.paused:
        reporter.note(f"canary {watch.paused.release} is paused on "
                      f"{', '.join(sorted(watch.paused.new_slots))}: judging its new slot "
                      "against the old one; a failure aborts it")
    while policy.duration_s is None or clock() - start < policy.duration_s:
        now = clock()
        if now - watch.looked_at >= policy.paused_refresh_s:
            watch = Watch(look_for_paused(target), now)
        for host in target.hosts:
            readings = read_host(host, target, read)
            traffic = host_window(last.get(host.name, {}), readings,
                            count_client_errors=policy.count_client_errors)
            last[host.name] = readings
            history.add(host.name, now, readings)
            why = None
            if traffic is not None:
                why = breach.observe(host.name, traffic, now=now,
                                     max_error_rate=policy.max_error_rate, slo_p99_ms=slo,
                                     min_requests=policy.min_requests)
                if why:
                    reporter.step(host.name, "guard", "slo", "breach", 0.0, why)
            if why and breach.sustained(host.name, now=now, for_s=policy.for_s):
                return _act(target, policy, host.name, why, reporter, act, abort,
                            look_for_paused)
            failed = _canary_failure(host.name, watch.paused, history, canary_policy,
                                     policy.for_s)
            if failed:
                reporter.step(host.name, "guard", "canary", "fail", 0.0, failed)
                return _act(target, policy, host.name, failed, reporter, act, abort,
                            look_for_paused)
        sleep(policy.interval_s)
    return ExitCode.OK, "no sustained SLO breach"


def _canary_failure(host: str, paused: PausedCanary | None, history: History,
                    policy: CanaryPolicy, for_s: float) -> str | None:
    """Why the paused canary fails on ``host`` over the last ``for_s`` seconds (None: it does
    not, or not yet: a window shorter than ``for_s`` is not judged)."""
    if paused is None or host not in paused.new_slots:
        return None
    span = history.window(host)
    if span is None or span[0] < for_s:
        return None
    verdict, described = canary_verdict(span[1], span[2], paused.new_slots[host], policy)
    return described if verdict is Verdict.FAIL else None


def _act(target: Target, policy: GuardPolicy, host: str, why: str, reporter: Reporter,
         act: Callable[[], RunResult] | None, abort: Callable[[], RunResult] | None,
         look_for_paused: Callable[[Target], PausedCanary | None]) -> tuple[ExitCode, str]:
    """Abort the canary when one is paused now (it holds the lock), else roll back."""
    paused = look_for_paused(target)
    emit(reporter, "guard_triggered", host=host, message=why,
         action="rollback" if paused is None else "abort")
    if paused is None:
        return _roll_back(target, policy, host, why, reporter, act)
    reporter.note(f"{host}: {why}: aborting the paused canary {paused.release} of "
                  f"{target.model.name}")
    run = abort or (lambda: _abort(target, policy, reporter))
    try:
        result = run()
    except TfsDeployError as error:
        return ExitCode.INCONSISTENT, f"the canary failed ({host}: {why}) and the abort " \
            f"failed: {error}"
    if result.exit_code == ExitCode.OK:
        return ExitCode.ROLLED_BACK, (f"aborted the paused canary {paused.release} after "
                                      f"{host}: {why}")
    return ExitCode.INCONSISTENT, (f"the canary failed ({host}: {why}) and the abort failed: "
                                   f"{result.message}")


def _abort(target: Target, policy: GuardPolicy, reporter: Reporter) -> RunResult:
    return finish_canary(Verb.ABORT, target, lock_wait=policy.lock_wait, reporter=reporter)


def _roll_back(target: Target, policy: GuardPolicy, host: str, why: str, reporter: Reporter,
               act: Callable[[], RunResult] | None) -> tuple[ExitCode, str]:
    reporter.note(f"{host}: {why} for {policy.for_s:g} s: rolling back {target.model.name}")
    run = act or (lambda: rollback(target, lock_wait=policy.lock_wait, reporter=reporter,
                                   by_guard=True))
    try:
        result = run()
    except TfsDeployError as error:
        code = ExitCode.LOCKED if error.exit_code == ExitCode.LOCKED else ExitCode.INCONSISTENT
        return code, f"the SLO broke ({host}: {why}) and the rollback failed: {error}"
    if result.exit_code == ExitCode.OK:
        return ExitCode.ROLLED_BACK, (f"rolled back to {result.release_id} after {host}: "
                                      f"{why}")
    code = ExitCode.LOCKED if result.exit_code == ExitCode.LOCKED else ExitCode.INCONSISTENT
    return code, f"the SLO broke ({host}: {why}) and the rollback failed: {result.message}"
