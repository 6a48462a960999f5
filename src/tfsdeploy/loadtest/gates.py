"""Acceptance gates (the article's table): P99 under the SLO, error rate, throughput, duration.

Pure functions over a finished report. Each gate says whether it passed, what was seen, what
was required and by how much it missed, so a failed run explains itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_ERROR_RATE_PCT = 0.01
DURATION_TOLERANCE = 0.99  # a 300 s run that measured 299.5 s still sustained its load


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
        """JSON form for the report."""
        return {"gate": self.name, "passed": self.passed, "observed": self.observed,
                "limit": self.limit, "unit": self.unit, "detail": self.detail}


def _miss(observed: float, limit: float, unit: str) -> str:
    diff = abs(observed - limit)
    pct = f" ({diff / limit * 100:.1f}%)" if limit else ""
    return f"{diff:.4g} {unit}{pct}"


def p99_gate(p99_ms: float, slo_ms: float) -> GateResult:
    """P99 latency at most the SLO."""
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


def duration_gate(measured_s: float, required_s: float, end_reason: str) -> GateResult:
    """The load ran for the whole required duration (not cut short, not cancelled)."""
    ok = measured_s >= required_s * DURATION_TOLERANCE and end_reason != "cancel"
    detail = (f"sustained {measured_s:.1f} s >= {required_s:g} s" if ok else
              f"ran {measured_s:.1f} s of {required_s:g} s (end: {end_reason}), "
              f"short by {_miss(measured_s, required_s, 's')}")
    return GateResult("duration", ok, measured_s, required_s, "s", detail)


def evaluate(report: Mapping[str, Any], spec: GateSpec) -> list[GateResult]:
    """Every enabled gate against a ghz-style report (see report.ghz_report)."""
    ext = report["tfsdeploy"]
    results = []
    if spec.slo_p99_ms is not None:
        p99 = next(p["latency"] for p in ext["percentiles"] if p["percentile"] == 99.0)
        results.append(p99_gate(p99 / 1e6, spec.slo_p99_ms))
    if spec.max_error_rate_pct is not None:
        results.append(error_rate_gate(ext["errorCount"], report["count"],
                                       spec.max_error_rate_pct))
    if spec.min_qps is not None:
        results.append(qps_gate(report["rps"], spec.min_qps))
    if spec.min_duration_s is not None:
        results.append(duration_gate(report["total"] / 1e9, spec.min_duration_s,
                                     report["endReason"]))
    return results


def all_passed(results: Sequence[GateResult]) -> bool:
    """True when no gate failed."""
    return all(r.passed for r in results)
