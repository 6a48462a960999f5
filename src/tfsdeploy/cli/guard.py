"""`fab guard`: watch each host's TFServing metrics; roll back when the SLO breaks for long
enough. Meant for cron/systemd: no prompts, bounded, documented exit codes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from tfsdeploy.cli.rollback import RollbackRequest, rollback
from tfsdeploy.errors import ExitCode, TfsDeployError
from tfsdeploy.guard import Breach, Scrape, parse_metrics, window
from tfsdeploy.inventory import ResolvedHost, load_inventory
from tfsdeploy.layout import model_ports
from tfsdeploy.rollout import DeployResult, Reporter


@dataclass(frozen=True)
class GuardRequest:
    """What to watch, and when to act."""

    model: str
    inventory: str | None = None
    hosts: str | None = None
    limit: str | None = None
    max_error_rate: float = 0.01
    slo_p99_ms: float | None = None  # None: the model's latency SLO
    for_s: float = 30.0
    interval_s: float = 5.0
    duration_s: float | None = None  # None: until a rollback (or forever)
    min_requests: int = 20
    lock_wait: float = 60.0


def scrape(host: ResolvedHost, port: int, path: str, model: str) -> Scrape:
    """One read of a host's metrics through its stable REST port."""
    with urllib.request.urlopen(f"http://{host.address}:{port}{path}", timeout=5) as reply:
        return parse_metrics(reply.read().decode(), model)


def guard(request: GuardRequest, *, reporter: Reporter,
          act: Callable[[RollbackRequest], DeployResult] | None = None,
          sleep: Callable[[float], None] = time.sleep) -> tuple[ExitCode, str]:
    """Watch until a sustained breach (then roll back) or the duration ends."""
    inventory = load_inventory(request.inventory)
    model = inventory.model(request.model)
    hosts = inventory.select(request.hosts, limit=request.limit, model=model)
    slo = request.slo_p99_ms or model.latency_slo_ms
    breach = Breach()
    last: dict[str, Scrape] = {}
    start = time.monotonic()
    reporter.note(f"guarding {model.name} on {len(hosts)} host(s): error rate <= "
                  f"{request.max_error_rate:.2%}, P99 <= {slo:g} ms; act after "
                  f"{request.for_s:g} s of breach")
    while request.duration_s is None or time.monotonic() - start < request.duration_s:
        now = time.monotonic()
        for host in hosts:
            port = model_ports(host, model).rest
            try:
                current = scrape(host, port, host.vars.monitoring_path, model.name)
            except OSError as error:
                reporter.step(host.name, "guard", "scrape", "failed", 0.0, str(error))
                continue
            if host.name in last:
                w = window(last[host.name], current)
                why = breach.observe(host.name, w, now=now, max_error_rate=request.max_error_rate,
                                     slo_p99_ms=slo, min_requests=request.min_requests)
                if why:
                    reporter.step(host.name, "guard", "slo", "breach", 0.0, why)
                if why and breach.sustained(host.name, now=now, for_s=request.for_s):
                    return _roll_back(request, host.name, why, reporter, act)
            last[host.name] = current
        sleep(request.interval_s)
    return ExitCode.OK, "no sustained SLO breach"


def _roll_back(request: GuardRequest, host: str, why: str, reporter: Reporter,
               act: Callable[[RollbackRequest], DeployResult] | None) -> tuple[ExitCode, str]:
    reporter.note(f"{host}: {why} for {request.for_s:g} s: rolling back {request.model}")
    run = act or (lambda r: rollback(r, reporter=reporter))
    try:
        result = run(RollbackRequest(model=request.model, inventory=request.inventory,
                                     hosts=request.hosts, limit=request.limit,
                                     lock_wait=request.lock_wait))
    except TfsDeployError as error:
        code = ExitCode.LOCKED if error.exit_code == ExitCode.LOCKED else ExitCode.INCONSISTENT
        return code, f"the SLO broke ({host}: {why}) and the rollback failed: {error}"
    if result.exit_code == ExitCode.OK:
        return ExitCode.ROLLED_BACK, (f"rolled back to {result.release_id} after {host}: "
                                      f"{why}")
    code = ExitCode.LOCKED if result.exit_code == ExitCode.LOCKED else ExitCode.INCONSISTENT
    return code, f"the SLO broke ({host}: {why}) and the rollback failed: {result.message}"
