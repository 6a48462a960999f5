"""`fab guard`: watch each host's TFServing metrics; roll back when the SLO breaks for long
enough. Meant for cron/systemd: no prompts, bounded, documented exit codes.

Rates are computed per serving process: each slot's own REST port is read, on every instance of
a host that runs one server per GPU (not the stable port, which changes process at a switch),
each process's counters are compared only with that process's previous reading, and a host's
processes are added up for its verdict. A process that starts (a switch, a restart) gives its
first reading as a baseline; one that restarted between two readings measured nothing.

It acts only on what it judged: when a host starts to breach, the release its proxy serves is
pinned; when the breach is sustained, a host serving another release by then starts its breach
again (judging that one), and the rollback is handed the release each host served: under the
lock, before any change, it refuses (exit 3) when another is live (``plans.refuse_changed``).

It fails closed: a host with no window for ``for_s`` is not measured, said once per host, and
ends the watch in exit 3 (no host measured at all: at once); it never reports health it did
not see.

While a canary is paused (or interrupted: a canary run killed at a split weight), its hosts run
the new release beside the old one: the guard also judges the new slot against the old one on
each canary host, over the last ``for_s`` seconds, with the model's canary policy (the analysis
of the canary steps). A failing verdict, or any sustained SLO breach, aborts the canary (`fab
abort`: the canary hosts back on the old slot at 100 %, the lock freed) instead of rolling
back.

The watch runs under the engine's signal handling (``watch``: ``engine.operate``): Ctrl-C,
SIGTERM or SIGHUP ends it at once, between two rounds or during a look at the hosts, with exit 1
and what it saw until then (it had not acted: nothing was changed), so that cron's ``timeout``
or a systemd stop still leaves its recorded result. Its looks at the hosts are the engine's
(``engine.look``: their connections closed at the end, their deadline); a rollback or abort it
hands over is an engine run, with that run's own handling of a signal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tfsdeploy.core.canary.steps import CanaryState, judge, slot_figures
from tfsdeploy.core.errors import ExitCode, TfsDeployError
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, Verdict
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gpu import instance_gpus
from tfsdeploy.core.inventory.layout import model_ports, other_slot
from tfsdeploy.core.observe.guard import (
    Breach,
    GuardPolicy,
    Scrape,
    Window,
    bucket_deltas,
    merge,
    parse_metrics,
    restarted,
    window,
)
from tfsdeploy.core.target import Target
from tfsdeploy.hosts import probes
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.run import engine, survey
from tfsdeploy.run.after import GuardTriggered
from tfsdeploy.run.canary import finish_canary
from tfsdeploy.run.engine import Reporter, RunResult, emit
from tfsdeploy.run.jobs import Verb
from tfsdeploy.run.plans import canary_under_way, interrupted_canary
from tfsdeploy.run.rollback import rollback


@dataclass(frozen=True)
class PausedCanary:
    """A canary under way: its release and, per canary host, its new slot. ``interrupted``:
    a canary run killed at a split weight (the proxy shares the traffic, no host records a
    pause)."""

    release: str
    new_slots: Mapping[str, str]  # host -> the slot the canary's release serves from
    interrupted: bool = False

    @property
    def described(self) -> str:
        """``paused canary r...`` or ``interrupted canary r...``."""
        return f"{'interrupted' if self.interrupted else 'paused'} canary {self.release}"


@dataclass(frozen=True)
class Look:
    """What one look at the fleet's hosts found: the canary under way, and the release each
    host's proxy serves (hosts that answered and serve exactly one)."""

    paused: PausedCanary | None
    live: Mapping[str, str] = field(default_factory=dict)


def scrape(address: str, port: int, path: str, model: str) -> Scrape:
    """One read of one server process's metrics (its slot's REST port)."""
    return parse_metrics(probes.metrics(address, port, path, timeout_s=METRICS_TIMEOUT_S),
                         model)


# a filtered port (DROP) answers nothing: each read gives up after this long, and every
# process of every host is read at once, so one round costs at most this
METRICS_TIMEOUT_S = 3.0
Scraper = Callable[[str, int, str, str], Scrape]
Process = tuple[str, int]  # (slot, REST port) of one serving process on a host
Readings = dict[Process, Scrape]


@dataclass
class HostRead:
    """One round's reads of one host: the processes that answered, and why the others did
    not (a stopped slot refuses: that is normal for one of the two)."""

    readings: Readings = field(default_factory=dict)
    failed: dict[Process, str] = field(default_factory=dict)


def processes(host: ResolvedHost, target: Target) -> list[Process]:
    """Every serving process the host may run for the model: each instance's two slots."""
    ports = model_ports(host, target.model)
    count = len(instance_gpus(host, target.model))
    return [(slot, ports.slot_rest(slot, k)) for k in range(count) for slot in ports.slots]


def _read_one(host: ResolvedHost, target: Target, process: Process, read: Scraper
              ) -> Scrape | str:
    try:
        return read(host.address, process[1], host.vars.monitoring_path, target.model.name)
    except Exception as error:  # whatever stops a read is a reason to report, never a crash
        return f"{type(error).__name__}: {str(error)[:160] or 'no answer'}"


def read_host(host: ResolvedHost, target: Target, read: Scraper) -> HostRead:
    """The metrics of each of the host's processes that answers, and each failure."""
    return read_fleet(target, read, hosts=(host,))[host.name]


def read_fleet(target: Target, read: Scraper,
               hosts: tuple[ResolvedHost, ...] | None = None) -> dict[str, HostRead]:
    """One round: every process of every host read at once (a filtered port costs one
    timeout, not one per process)."""
    chosen = hosts or target.hosts
    jobs = [(h, p) for h in chosen for p in processes(h, target)]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(jobs)))) as pool:
        results = list(pool.map(lambda job: _read_one(job[0], target, job[1], read), jobs))
    found = {h.name: HostRead() for h in chosen}
    for (host, process), result in zip(jobs, results, strict=True):
        if isinstance(result, str):
            found[host.name].failed[process] = result
        else:
            found[host.name].readings[process] = result
    return found


def host_window(before: Readings, now: Readings, *, count_client_errors: bool = False
                ) -> Window | None:
    """The host's traffic between two readings, over the processes read both times that did
    not restart in between (None when no process was: nothing was measured). A process that
    restarted (its counters went back: a crash, a crash loop) measured nothing continuous."""
    both = [p for p in now if p in before and not restarted(before[p], now[p])]
    if not both:
        return None
    return merge([window(before[p], now[p], count_client_errors=count_client_errors)
                  for p in both], [bucket_deltas(before[p], now[p]) for p in both])


def unmeasured_reason(before: Readings, read: HostRead) -> str:
    """Why a round measured nothing on a host: each process's failure or restart."""
    parts = [f"{slot} :{port} {why}" for (slot, port), why in sorted(read.failed.items())]
    parts += [f"{slot} :{port} restarted (its counters went back)"
              for (slot, port), now in sorted(read.readings.items())
              if (slot, port) in before and restarted(before[(slot, port)], now)]
    if not parts and read.readings:
        parts.append("first reading of its process(es): a baseline")
    return "; ".join(parts) or "no serving process to read"


@dataclass
class Coverage:
    """Which hosts the guard measured: a host with no window for ``blind_after_s`` is not
    measured (said once, per host, when it starts; counted as not healthy in the verdict)."""

    started: float
    blind_after_s: float
    measured_at: dict[str, float] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)  # host -> why its last round measured nothing
    blind: dict[str, float] = field(default_factory=dict)  # host -> when it became unmeasured
    ever_blind: dict[str, str] = field(default_factory=dict)  # host -> why, for the verdict
    watched_s: float = 0.0  # how long the watch has run, as of its last round

    def observe(self, host: str, now: float, measured: bool, why: str) -> str | None:
        """One round of ``host``; a line to report when it just became (or stopped being)
        unmeasured."""
        if measured:
            self.measured_at[host] = now
            self.why.pop(host, None)
            if self.blind.pop(host, None) is not None:
                return "measured again"
            return None
        self.why[host] = why
        self.watched_s = max(self.watched_s, now - self.started)
        since = self.measured_at.get(host, self.started)
        if now - since >= self.blind_after_s and host not in self.blind:
            self.blind[host] = since
            self.ever_blind[host] = why
            return f"not measured for {now - since:.0f} s: {why}"
        if host in self.blind:
            self.ever_blind[host] = why
        return None

    def nowhere(self, hosts: list[str]) -> bool:
        """Whether no host is measured now."""
        return bool(hosts) and all(h in self.blind for h in hosts)

    def unmeasured(self, hosts: list[str]) -> dict[str, str]:
        """Host -> why, for the verdict: each host that went unmeasured for ``blind_after_s``,
        and each that no window measured at all (a watch that ended before its second read
        of the host, or whose every round failed there)."""
        found = dict(self.ever_blind)
        for host in hosts:
            if host not in self.measured_at and host not in found:
                found[host] = (f"no window measured in {self.watched_s:.0f} s of watch: "
                               f"{self.why.get(host, 'not read')}")
        return found


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


def canary_of(facts: Mapping[str, HostFacts]) -> PausedCanary | None:
    """The canary under way that the guard judges: a paused one (each host that records it
    paused), or an interrupted one (each host whose proxy splits the traffic for it)."""
    record, state, interrupted = canary_under_way(facts)
    if record is None:
        return None
    if interrupted:
        split = interrupted_canary(facts)
        return PausedCanary(record.id, split[1] if split else {}, interrupted=True)
    if state is not CanaryState.PAUSED:
        return None
    slots = {}
    for host, host_facts in facts.items():
        held = host_facts.record(record.id)
        if held is not None and (held.canary or {}).get("state") == CanaryState.PAUSED:
            slots[host] = held.slot
    return PausedCanary(record.id, slots) if slots else None


def look_at_fleet(target: Target) -> Look:
    """One look at every selected host: the canary under way and what each host serves."""
    def look(target: Target, host: ResolvedHost, conn: Any, facts: Any) -> dict[str, Any]:
        return {"facts": facts}

    rows = engine.look(target, lambda session: survey.each_host(target, look, session=session))
    facts: dict[str, HostFacts] = {r["host"]: r["facts"] for r in rows if r["reachable"]}
    live = {host: f.serving_release for host, f in facts.items() if f.serving_release}
    return Look(canary_of(facts), live)


@dataclass
class Watch:
    """What the guard saw at its last look at the hosts (the canary under way, what each host
    serves), and the release each breaching host served when its breach began."""

    seen: Look
    looked_at: float
    pinned: dict[str, str | None] = field(default_factory=dict)


RollbackAction = Callable[[Mapping[str, str]], RunResult]
AbortAction = Callable[[str], RunResult]


@dataclass
class Guarding:
    """One guard's run: its policy and the effects it was given."""

    target: Target
    policy: GuardPolicy
    reporter: Reporter
    act: RollbackAction | None
    abort: AbortAction | None
    read: Scraper
    look: Callable[[Target], Look]
    slo: float
    canary_policy: CanaryPolicy
    breach: Breach = field(default_factory=Breach)
    last: dict[str, Readings] = field(default_factory=dict)
    history: History = field(default_factory=lambda: History(keep_s=0.0))
    stop: engine.Stop | None = None  # set by a signal (``watch``): the guard ends, unacted


class _StopNow(Exception):
    """A signal came (``Guarding.stop``): the watch ends before it acts."""


def _go_on(run: Guarding) -> None:
    """Raise _StopNow once a signal came."""
    if run.stop is not None and run.stop.is_set():
        raise _StopNow


def _seen(run: Guarding) -> Look:
    """A look at the hosts (what each serves, the canary under way); a signal, before it or
    one that ended it, raises _StopNow. A look past its own deadline is an error."""
    _go_on(run)
    try:
        return run.look(run.target)
    except engine.LookStopped as ended:
        if run.stop is None or ended.signal_name is None:  # its deadline: the guard is blind
            raise
        run.stop.stop("interrupted", ended.signal_name)
        raise _StopNow from None


def guard(target: Target, policy: GuardPolicy, *, reporter: Reporter,
          act: RollbackAction | None = None, read: Scraper = scrape,
          sleep: Callable[[float], None] = time.sleep,
          look: Callable[[Target], Look] = look_at_fleet,
          abort: AbortAction | None = None,
          clock: Callable[[], float] = time.monotonic,
          stop: engine.Stop | None = None) -> tuple[ExitCode, str]:
    """Watch until a sustained breach (then roll back what it judged, or abort the canary
    under way) or the duration ends; exit 3 when it could not measure a host (it never
    reports health it did not see); exit 1 when ``stop`` is set first (a signal)."""
    run = Guarding(target, policy, reporter, act, abort, read, look,
                   slo=policy.slo_p99_ms or target.model.latency_slo_ms,
                   canary_policy=target.model.rollout.canary or CanaryPolicy(),
                   history=History(keep_s=policy.for_s), stop=stop)
    start = clock()
    try:
        return _watch(run, start, clock=clock, sleep=sleep)
    except _StopNow:
        return _stopped(stop, clock() - start)


def _watch(run: Guarding, start: float, *, clock: Callable[[], float],
           sleep: Callable[[float], None]) -> tuple[ExitCode, str]:
    """The rounds until the guard acts, goes blind or its duration ends (a signal: _StopNow,
    checked before each look, after each round of reads and before it acts)."""
    policy, target = run.policy, run.target
    watch = Watch(_seen(run), start)
    # a host's first window needs two reads an interval apart, each of which may take up to
    # the read's timeout on a busy host: blind only after that much time without one
    coverage = Coverage(start, blind_after_s=max(
        policy.for_s, 2 * policy.interval_s + METRICS_TIMEOUT_S))
    _announce(run, watch)
    while policy.duration_s is None or clock() - start < policy.duration_s:
        now = clock()
        _go_on(run)
        if now - watch.looked_at >= policy.paused_refresh_s:
            watch = Watch(_seen(run), now, watch.pinned)
        rounds = read_fleet(target, run.read)
        _go_on(run)
        for host in target.hosts:
            ended = _host_round(run, watch, coverage, host.name, rounds[host.name], now)
            if ended is not None:
                return ended
        if coverage.nowhere([h.name for h in target.hosts]):
            return ExitCode.INCONSISTENT, _blind_message(run, coverage, now)
        sleep(policy.interval_s)
    return _verdict(run, coverage)


def watch(target: Target, policy: GuardPolicy, *, reporter: Reporter,
          act: RollbackAction | None = None,
          abort: AbortAction | None = None) -> tuple[ExitCode, str]:
    """`fab guard`'s watch under the engine's signal handling (see the module's docstring):
    a signal ends its wait between rounds at once."""
    return engine.operate(
        lambda _session, stop: guard(target, policy, reporter=reporter, act=act, abort=abort,
                                     sleep=lambda seconds: _wait(stop, seconds), stop=stop),
        note=reporter.note, saying=GUARD_STOPPING)


# what the guard says at a signal (it holds no lock and has changed nothing while it watches)
GUARD_STOPPING = ("ending the watch before it acts", "already ending the watch")


def _wait(stop: engine.Stop, seconds: float) -> None:
    """The guard's wait between two rounds, ended at once by a signal."""
    stop.wait(seconds)


def _stopped(stop: engine.Stop | None, watched_s: float) -> tuple[ExitCode, str]:
    name = (stop.signal or stop.why) if stop is not None else "stopped"
    return ExitCode.INVALID, (f"{name}: the guard stopped after {watched_s:.0f} s of watching, "
                              "before its duration ended; it had not acted: nothing was "
                              "changed")


def _announce(run: Guarding, watch: Watch) -> None:
    policy, target = run.policy, run.target
    counted = "all errors" if policy.count_client_errors else "server errors"
    run.reporter.note(f"guarding {target.model.name} on {len(target.hosts)} host(s): error "
                      f"rate <= {policy.max_error_rate:.2%} ({counted}), P99 <= {run.slo:g} "
                      f"ms; act after {policy.for_s:g} s of breach")
    canary = watch.seen.paused
    if canary:
        run.reporter.note(f"{canary.described} is under way on "
                          f"{', '.join(sorted(canary.new_slots))}: judging its new slot "
                          "against the old one; a failure or a breach aborts it")


def _host_round(run: Guarding, watch: Watch, coverage: Coverage, host: str, read: HostRead,
                now: float) -> tuple[ExitCode, str] | None:
    """One host's round: measured or not, breaching or not; the guard's ending when it acts."""
    policy = run.policy
    before = run.last.get(host, {})
    traffic = host_window(before, read.readings, count_client_errors=policy.count_client_errors)
    change = coverage.observe(host, now, traffic is not None,
                              "" if traffic is not None else unmeasured_reason(before, read))
    if change:
        run.reporter.step(host, "guard", "measure", "ok" if traffic is not None else "blind",
                          0.0, change)
    run.last[host] = read.readings
    run.history.add(host, now, read.readings)
    why = None
    if traffic is not None:
        breaching = host in run.breach.since
        why = run.breach.observe(host, traffic, now=now, max_error_rate=policy.max_error_rate,
                                 slo_p99_ms=run.slo, min_requests=policy.min_requests)
        if why:
            run.reporter.step(host, "guard", "slo", "breach", 0.0, why)
            if not breaching:  # the release that breaches: what a rollback may act on
                if watch.looked_at != now:  # one look per round, however many hosts start
                    watch.seen, watch.looked_at = _seen(run), now
                watch.pinned[host] = watch.seen.live.get(host)
        else:
            watch.pinned.pop(host, None)
    if why and run.breach.sustained(host, now=now, for_s=policy.for_s):
        return _decide(run, watch, host, why, now)
    failed = _canary_failure(host, watch.seen.paused, run.history, run.canary_policy,
                             policy.for_s)
    if failed:
        run.reporter.step(host, "guard", "canary", "fail", 0.0, failed)
        return _act(run, host, failed, _seen(run), {})
    return None


def _decide(run: Guarding, watch: Watch, host: str, why: str, now: float
            ) -> tuple[ExitCode, str] | None:
    """A sustained breach: act on the release that breached, unless another one took over
    the host meanwhile (the breach then starts again, judging the new one)."""
    seen = _seen(run)
    pinned, live = watch.pinned.get(host), seen.live.get(host)
    if pinned is not None and live != pinned:
        run.reporter.step(host, "guard", "slo", "changed", 0.0,
                          f"the breach began on {pinned}, {live or 'no single release'} is "
                          "live now: judging it afresh")
        run.breach.since[host] = now
        watch.pinned[host] = live
        return None
    return _act(run, host, why, seen, dict(seen.live))


def _act(run: Guarding, host: str, why: str, seen: Look, judged: Mapping[str, str]
         ) -> tuple[ExitCode, str]:
    """Abort the canary under way now (it holds the lock, or a killed run left it split),
    else roll back the releases judged; never once a signal came (it ends the watch)."""
    _go_on(run)
    canary = seen.paused
    emit(run.reporter, GuardTriggered(host, why, "rollback" if canary is None else "abort"))
    if canary is None:
        return _roll_back(run, host, why, judged)
    run.reporter.note(f"{host}: {why}: aborting the {canary.described} of "
                      f"{run.target.model.name}")
    abort = run.abort or (lambda release: _abort(run, release))
    try:
        result = abort(canary.release)
    except TfsDeployError as error:
        return ExitCode.INCONSISTENT, f"the canary failed ({host}: {why}) and the abort " \
            f"failed: {error}"
    if result.exit_code == ExitCode.OK:
        return ExitCode.ROLLED_BACK, (f"aborted the {canary.described} after {host}: {why}")
    return ExitCode.INCONSISTENT, (f"the canary failed ({host}: {why}) and the abort failed: "
                                   f"{result.message}")


def _canary_failure(host: str, paused: PausedCanary | None, history: History,
                    policy: CanaryPolicy, for_s: float) -> str | None:
    """Why the canary under way fails on ``host`` over the last ``for_s`` seconds (None: it
    does not, or not yet: a window shorter than ``for_s`` is not judged)."""
    if paused is None or host not in paused.new_slots:
        return None
    span = history.window(host)
    if span is None or span[0] < for_s:
        return None
    verdict, described = canary_verdict(span[1], span[2], paused.new_slots[host], policy)
    return described if verdict is Verdict.FAIL else None


def _abort(run: Guarding, release: str) -> RunResult:
    return finish_canary(Verb.ABORT, run.target, lock_wait=run.policy.lock_wait,
                         reporter=run.reporter, judged=release)


def _roll_back(run: Guarding, host: str, why: str, judged: Mapping[str, str]
               ) -> tuple[ExitCode, str]:
    target, policy = run.target, run.policy
    pinned = ", ".join(f"{h} {r}" for h, r in sorted(judged.items())) or "nothing read"
    run.reporter.note(f"{host}: {why} for {policy.for_s:g} s: rolling back "
                      f"{target.model.name} (judged: {pinned})")
    act = run.act or (lambda releases: rollback(target, lock_wait=policy.lock_wait,
                                                reporter=run.reporter, by_guard=True,
                                                judged=releases))
    try:
        result = act(judged)
    except TfsDeployError as error:
        code = ExitCode.LOCKED if error.exit_code == ExitCode.LOCKED else ExitCode.INCONSISTENT
        return code, f"the SLO broke ({host}: {why}) and the rollback failed: {error}"
    if result.exit_code == ExitCode.OK:
        return ExitCode.ROLLED_BACK, (f"rolled back to {result.release_id} after {host}: "
                                      f"{why}")
    code = ExitCode.LOCKED if result.exit_code == ExitCode.LOCKED else ExitCode.INCONSISTENT
    return code, f"the SLO broke ({host}: {why}) and the rollback failed: {result.message}"


def _blind_message(run: Guarding, coverage: Coverage, now: float) -> str:
    reasons = "; ".join(f"{h}: {coverage.why.get(h) or coverage.ever_blind.get(h, '?')}"
                        for h in sorted(coverage.blind))
    return (f"cannot measure {run.target.model.name}: no serving process's metrics could be "
            f"read on any host for {now - min(coverage.blind.values()):.0f} s ({reasons}); "
            "the guard never reports health it did not see")


def _verdict(run: Guarding, coverage: Coverage) -> tuple[ExitCode, str]:
    """The end of the watch: no sustained breach, said only of the hosts it measured (a host
    no window measured is not called healthy, however short the watch)."""
    missing = coverage.unmeasured([h.name for h in run.target.hosts])
    if not missing:
        return ExitCode.OK, "no sustained SLO breach"
    measured = [h.name for h in run.target.hosts if h.name not in missing]
    unmeasured = "; ".join(f"{h}: {why}" for h, why in sorted(missing.items()))
    return ExitCode.INCONSISTENT, (
        f"not measured, so not known to be healthy: {unmeasured}; no sustained SLO breach on "
        f"{', '.join(measured) if measured else 'no host'}")
