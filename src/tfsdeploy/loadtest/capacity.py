"""Capacity planning: how many TFServing instances a target QPS needs.

    instances = target_qps / (per_instance_qps x load_factor x availability_factor)

``per_instance_qps`` must be measured at the SLO (the best point under the SLO of a
concurrency sweep), never the raw peak. ``load_factor`` (default 0.65) leaves 35% for daily
swings; ``availability_factor`` (default 0.9) covers rolling releases and one failed instance.

* minimum = ceil(instances)
* recommended = max(ceil(minimum x (1 + headroom)), minimum + spares), with headroom 15% and
  one spare per failure domain (default 1 domain). For example, 100,000 QPS at 8,000
  per instance: 100000 / (8000 x 0.65 x 0.9) = 21.37 -> minimum 22 -> recommended 26
  (22 x 1.15 = 25.3 -> 26, and 22 + 1 = 23).

Pure: no I/O except ``load_sweep_report``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_LOAD_FACTOR = 0.65
DEFAULT_AVAILABILITY_FACTOR = 0.9
DEFAULT_HEADROOM = 0.15
DEFAULT_FAILURE_DOMAINS = 1
SWEEP_KIND = "tfsdeploy.sweep"
TUNE_KIND = "tfsdeploy.tune"


class CapacityError(ValueError):
    """Inputs that do not allow a plan."""


@dataclass(frozen=True)
class CapacityPlan:
    """The result, with every input kept so the arithmetic can be shown."""

    target_qps: float
    per_instance_qps: float
    load_factor: float
    availability_factor: float
    headroom: float
    failure_domains: int
    exact: float
    minimum: int
    recommended: int
    source: str = ""
    instances_per_host: int = 1

    @property
    def hosts(self) -> int:
        """Hosts for the recommended instances, ``instances_per_host`` on each (one server per
        GPU: a host with 2 GPUs runs 2)."""
        return math.ceil(self.recommended / self.instances_per_host)

    @property
    def usable_per_instance_qps(self) -> float:
        """What one instance is planned to carry: measured x load x availability."""
        return self.per_instance_qps * self.load_factor * self.availability_factor

    def explain(self) -> str:
        """The arithmetic, line by line, for people and for the runbook."""
        by_headroom = math.ceil(round(self.minimum * (1 + self.headroom), 9))
        lines = [
            f"per-instance QPS at the SLO: {self.per_instance_qps:,.1f}"
            + (f" (from {self.source})" if self.source else ""),
            "instances = target / (per-instance x load factor x availability factor)",
            f"          = {self.target_qps:,.0f} / ({self.per_instance_qps:,.1f} x "
            f"{self.load_factor:g} x {self.availability_factor:g})",
            f"          = {self.target_qps:,.0f} / {self.usable_per_instance_qps:,.1f}"
            f" = {self.exact:.2f}",
            f"minimum: ceil({self.exact:.2f}) = {self.minimum}",
            f"recommended: max(ceil({self.minimum} x {1 + self.headroom:g}) = {by_headroom}, "
            f"{self.minimum} + {self.failure_domains} spare per failure domain = "
            f"{self.minimum + self.failure_domains}) = {self.recommended}",
        ]
        if self.instances_per_host > 1:
            lines.append(f"hosts: ceil({self.recommended} / {self.instances_per_host} instances "
                         f"per host) = {self.hosts}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"targetQps": self.target_qps, "perInstanceQps": self.per_instance_qps,
                "loadFactor": self.load_factor, "availabilityFactor": self.availability_factor,
                "headroom": self.headroom, "failureDomains": self.failure_domains,
                "exact": self.exact, "minimum": self.minimum,
                "recommended": self.recommended, "source": self.source,
                "instancesPerHost": self.instances_per_host, "hosts": self.hosts}


# more instances than any fleet runs: a plan past it comes from factors given wrongly
MAX_INSTANCES = 10**7


def _check_fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise CapacityError(f"{name} must be in (0, 1], got {value:g}")


def plan(target_qps: float, per_instance_qps: float, *,
         load_factor: float = DEFAULT_LOAD_FACTOR,
         availability_factor: float = DEFAULT_AVAILABILITY_FACTOR,
         headroom: float = DEFAULT_HEADROOM,
         failure_domains: int = DEFAULT_FAILURE_DOMAINS,
         source: str = "", instances_per_host: int = 1) -> CapacityPlan:
    """Minimum and recommended instance counts for ``target_qps`` (and the hosts they take,
    ``instances_per_host`` on each)."""
    if target_qps <= 0:
        raise CapacityError(f"target QPS must be positive, got {target_qps:g}")
    if per_instance_qps <= 0:
        raise CapacityError(f"per-instance QPS must be positive, got {per_instance_qps:g}")
    _check_fraction("load factor", load_factor)
    _check_fraction("availability factor", availability_factor)
    if headroom < 0 or failure_domains < 0:
        raise CapacityError("headroom and failure domains must not be negative")
    if instances_per_host < 1:
        raise CapacityError(f"instances per host must be at least 1, got {instances_per_host}")
    served = per_instance_qps * load_factor * availability_factor
    exact = target_qps / served if served > 0 else math.inf
    if not math.isfinite(exact) or exact > MAX_INSTANCES:
        raise CapacityError(
            f"{target_qps:g} QPS at {per_instance_qps:g} per instance x load factor "
            f"{load_factor:g} x availability factor {availability_factor:g} needs more than "
            f"{MAX_INSTANCES:,} instances: check the factors (typical: 0.5 to 1)")
    # round() first: 21.000000000000004 from float noise must not become 22
    minimum = max(math.ceil(round(exact, 9)), 1)
    recommended = max(math.ceil(round(minimum * (1 + headroom), 9)), minimum + failure_domains)
    return CapacityPlan(target_qps, per_instance_qps, load_factor, availability_factor,
                        headroom, failure_domains, exact, minimum, recommended, source,
                        instances_per_host)


def per_instance_qps_from_sweep(report: Mapping[str, Any]) -> float:
    """The per-instance QPS of a sweep report: its best point under the SLO / instances."""
    if report.get("kind") != SWEEP_KIND:
        raise CapacityError("not a sweep report (run scripts/loadtest --sweep first)")
    value = report.get("perInstanceQps")
    if value is None:
        raise CapacityError("the sweep found no point under the SLO: no per-instance figure")
    return float(value)


def load_sweep_report(path: Path) -> dict[str, Any]:
    """Read a sweep report file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise CapacityError(f"{path}: {err}") from err
    if not isinstance(data, dict):
        raise CapacityError(f"{path}: not a JSON object")
    return data


def plan_from_sweep(target_qps: float, path: Path, **factors: Any) -> CapacityPlan:
    """``plan`` with the per-instance figure read from a sweep report file."""
    report = load_sweep_report(path)
    qps = per_instance_qps_from_sweep(report)
    best = report.get("best") or {}
    source = (f"{path}: best point under the SLO, concurrency {best.get('concurrency')}, "
              f"p99 {best.get('p99_ms', 0):.2f} ms, over {report.get('instances', 1)} instance(s)")
    return plan(target_qps, qps, source=source, **factors)


def per_instance_qps_from_tune(report: Mapping[str, Any]) -> tuple[float, str]:
    """The recommended trial's QPS at the SLO in a `fab tune` report (tune.json): one
    scratch instance measured alone, so it is the per-instance figure; and where it is from."""
    if report.get("kind") != TUNE_KIND:
        raise CapacityError("not a fab tune report (tune.json from `fab tune --out DIR`)")
    index, trials = report.get("recommended"), report.get("trials")
    if not isinstance(trials, list) or not trials:
        raise CapacityError("the tune report holds no trial")
    if index is None:
        raise CapacityError("no trial of the tune report met the SLO: no per-instance figure")
    if not isinstance(index, int) or not 0 <= index < len(trials):
        raise CapacityError(f"the tune report's recommended trial {index!r} is not one of its "
                            f"{len(trials)} trials")
    trial = trials[index]
    if not trial.get("meets_slo") or not trial.get("qps"):
        raise CapacityError(f"the tune report's recommended trial {index} did not meet the SLO")
    label = trial.get("label") or f"trial {index}"
    return float(trial["qps"]), (
        f"trial {index} of fab tune on {report.get('host')} ({label}), p99 "
        f"{float(trial.get('p99_ms') or 0):.2f} ms at the SLO {report.get('slo_p99_ms')} ms")


def plan_from_tune(target_qps: float, path: Path, **factors: Any) -> CapacityPlan:
    """``plan`` with the per-instance figure of a `fab tune` report's recommended trial."""
    qps, where = per_instance_qps_from_tune(load_sweep_report(path))
    return plan(target_qps, qps, source=f"{path}: {where}", **factors)
