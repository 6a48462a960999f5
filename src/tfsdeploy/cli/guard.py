"""`fab guard`: watch each host's TFServing metrics; roll back when the SLO breaks for long
enough. Meant for cron/systemd: no prompts, bounded, documented exit codes.

Rates are computed per serving process: each slot's own REST port is read (not the stable
port, which changes process at a switch), each process's counters are compared only with that
process's previous reading, and a host's processes are added up for its verdict. A process
that starts (a switch, a restart) gives its first reading as a baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tfsdeploy.cli.rollback import rollback
from tfsdeploy.engine import Reporter, RunResult
from tfsdeploy.errors import ExitCode, TfsDeployError
from tfsdeploy.guard import Breach, Scrape, Window, bucket_deltas, merge, parse_metrics, window
from tfsdeploy.inventory import ResolvedHost
from tfsdeploy.layout import model_ports
from tfsdeploy.target import Target


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


def scrape(address: str, port: int, path: str, model: str) -> Scrape:
    """One read of one server process's metrics (its slot's REST port)."""
    import httpx

    reply = httpx.get(f"http://{address}:{port}{path}", timeout=5)
    reply.raise_for_status()
    return parse_metrics(reply.text, model)


Scraper = Callable[[str, int, str, str], Scrape]


def host_window(host: ResolvedHost, target: Target, last: dict[tuple[str, int], Scrape],
                read: Scraper, *, count_client_errors: bool = False) -> Window | None:
    """The host's traffic since the previous reading, over its serving processes (None when
    no process has a previous reading yet)."""
    ports = model_ports(host, target.model)
    windows, buckets = [], []
    for slot in ports.slots:
        key = (host.name, ports.slot_rest(slot))
        try:
            current = read(host.address, key[1], host.vars.monitoring_path, target.model.name)
        except Exception:  # a stopped slot: no process to read
            last.pop(key, None)
            continue
        if key in last:
            windows.append(window(last[key], current,
                                  count_client_errors=count_client_errors))
            buckets.append(bucket_deltas(last[key], current))
        last[key] = current
    return merge(windows, buckets) if windows else None


def guard(target: Target, policy: GuardPolicy, *, reporter: Reporter,
          act: Callable[[], RunResult] | None = None, read: Scraper = scrape,
          sleep: Callable[[float], None] = time.sleep) -> tuple[ExitCode, str]:
    """Watch until a sustained breach (then roll back) or the duration ends."""
    slo = policy.slo_p99_ms or target.model.latency_slo_ms
    breach = Breach()
    last: dict[tuple[str, int], Scrape] = {}
    start = time.monotonic()
    counted = "all errors" if policy.count_client_errors else "server errors"
    reporter.note(f"guarding {target.model.name} on {len(target.hosts)} host(s): error rate "
                  f"<= {policy.max_error_rate:.2%} ({counted}), P99 <= {slo:g} ms; act "
                  f"after {policy.for_s:g} s of breach")
    while policy.duration_s is None or time.monotonic() - start < policy.duration_s:
        now = time.monotonic()
        for host in target.hosts:
            w = host_window(host, target, last, read,
                            count_client_errors=policy.count_client_errors)
            if w is None:
                continue
            why = breach.observe(host.name, w, now=now, max_error_rate=policy.max_error_rate,
                                 slo_p99_ms=slo, min_requests=policy.min_requests)
            if why:
                reporter.step(host.name, "guard", "slo", "breach", 0.0, why)
            if why and breach.sustained(host.name, now=now, for_s=policy.for_s):
                return _roll_back(target, policy, host.name, why, reporter, act)
        sleep(policy.interval_s)
    return ExitCode.OK, "no sustained SLO breach"


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
