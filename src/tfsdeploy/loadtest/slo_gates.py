"""Acceptance gates: P99 under the SLO, error rate, throughput, duration.

Pure functions over a finished report. Each gate says whether it passed, what was seen, what
was required and by how much it missed, so a failed run explains itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_ERROR_RATE_PCT = 0.01
# The measured window may fall short of the duration by 1% of it (a 300 s run that measured
# 299.5 s still sustained its load), or by one send interval of an open loop, whichever is
# more: its last request is due one interval before the end, and the window closes when that
# request completes (20 requests/s for 2 s measure about 1.95 s).
DURATION_SLACK_FRACTION = 0.01


@dataclass(frozen=True)
class GateSpec:
    """The thresholds of one run; None disables a gate."""

    slo_p99_ms: float | None = None
    max_error_rate_pct: float | None = DEFAULT_MAX_ERROR_RATE_PCT
    min_qps: float | None = None
    min_duration_s: float | None = None


@dataclass(frozen=True)
class GateResult:
    """Outcome of one gate."""

    name: str
    passed: bool
    observed: float
    limit: float
    unit: str
    detail: str

    def line(self) -> str:
        """One line for people: ``PASS p99: 12.1 ms <= 50 ms``."""
        return f"{'PASS' if self.passed else 'FAIL'} {self.name}: {self.detail}"

    def as_json(self) -> dict[str, Any]:
        """JSON form for the report (an observation that does not exist is null)."""
        observed = None if math.isnan(self.observed) else self.observed
        return {"gate": self.name, "passed": self.passed, "observed": observed,
                "limit": self.limit, "unit": self.unit, "detail": self.detail}


def _miss(observed: float, limit: float, unit: str) -> str:
    diff = abs(observed - limit)
    pct = f" ({diff / limit * 100:.1f}%)" if limit else ""
    return f"{diff:.4g} {unit}{pct}"


def p99_gate(p99_ms: float, slo_ms: float, *, successes: int | None = None) -> GateResult:
    """P99 latency at most the SLO. With no successful request (``successes`` 0) there is no
    latency to judge: the gate fails, it never passes on an empty histogram."""
    if successes == 0:
        return GateResult("slo-p99", False, math.nan, slo_ms, "ms",
                          f"no successful request: no P99 to hold to the SLO {slo_ms:g} ms")
    ok = p99_ms <= slo_ms
    detail = (f"p99 {p99_ms:.2f} ms <= SLO {slo_ms:g} ms" if ok else
              f"p99 {p99_ms:.2f} ms > SLO {slo_ms:g} ms, over by {_miss(p99_ms, slo_ms, 'ms')}")
    return GateResult("slo-p99", ok, p99_ms, slo_ms, "ms", detail)


def error_rate_gate(errors: int, count: int, max_pct: float) -> GateResult:
    """Share of failed requests at most ``max_pct`` percent; a run with no request fails."""
    if count == 0:
        return GateResult("max-error-rate", False, 100.0, max_pct, "%",
                          "no request completed")
    pct = errors / count * 100
    ok = pct <= max_pct
    head = f"error rate {pct:.4g}% ({errors}/{count})"
    detail = (f"{head} <= {max_pct:g}%" if ok else
              f"{head} > {max_pct:g}%, over by {_miss(pct, max_pct, 'points')}")
    return GateResult("max-error-rate", ok, pct, max_pct, "%", detail)


def qps_gate(qps: float, min_qps: float) -> GateResult:
    """Throughput (all completed requests per second) at least ``min_qps``."""
    ok = qps >= min_qps
    detail = (f"{qps:.1f} QPS >= {min_qps:g}" if ok else
              f"{qps:.1f} QPS < {min_qps:g}, short by {_miss(qps, min_qps, 'QPS')}")
    return GateResult("min-qps", ok, qps, min_qps, "QPS", detail)


def duration_slack(required_s: float, send_interval_s: float = 0.0) -> float:
    """How far the measured window may fall short of ``required_s`` (see
    DURATION_SLACK_FRACTION)."""
    return max(required_s * DURATION_SLACK_FRACTION, send_interval_s)


def duration_gate(measured_s: float, required_s: float, end_reason: str, *,
                  send_interval_s: float = 0.0) -> GateResult:
    """The load ran for the whole required duration, within its slack (duration_slack), and
    was not cancelled."""
    slack = duration_slack(required_s, send_interval_s)
    ok = measured_s >= required_s - slack and end_reason != "cancel"
    detail = (f"sustained {measured_s:.2f} s of {required_s:g} s (slack {slack:.3g} s)" if ok
              else f"ran {measured_s:.2f} s of {required_s:g} s (end: {end_reason}), short by "
                   f"{_miss(measured_s, required_s, 's')}, more than the slack {slack:.3g} s")
    return GateResult("duration", ok, measured_s, required_s, "s", detail)


def evaluate(report: Mapping[str, Any], spec: GateSpec) -> list[GateResult]:
    """Every enabled gate against a ghz-style report (see report.ghz_report)."""
    ext = report["tfsdeploy"]
    results = []
    if spec.slo_p99_ms is not None:
        p99 = next(p["latency"] for p in ext["percentiles"] if p["percentile"] == 99.0)
        results.append(p99_gate(p99 / 1e6, spec.slo_p99_ms,
                                successes=report["count"] - ext["errorCount"]))
    if spec.max_error_rate_pct is not None:
        results.append(error_rate_gate(ext["errorCount"], report["count"],
                                       spec.max_error_rate_pct))
    if spec.min_qps is not None:
        results.append(qps_gate(report["rps"], spec.min_qps))
    if spec.min_duration_s is not None:
        results.append(duration_gate(report["total"] / 1e9, spec.min_duration_s,
                                     report["endReason"],
                                     send_interval_s=send_interval(report.get("options"))))
    return results


def send_interval(options: Mapping[str, Any] | None) -> float:
    """Seconds between two requests of a constant open loop (its ``rps`` option); 0 for a
    closed loop or a rate schedule."""
    if not options or options.get("load-schedule", "const") != "const":
        return 0.0
    rate = float(options.get("rps") or 0)
    return 1.0 / rate if rate > 0 else 0.0


def all_passed(results: Sequence[GateResult]) -> bool:
    """True when no gate failed."""
    return all(r.passed for r in results)
