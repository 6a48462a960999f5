"""Concurrency sweep: find the knee of the inverted U and the best point under the SLO.

Concurrency doubles from a start value. The sweep stops at the first of:

* P99 above the SLO (the point is kept, and marked as over the SLO);
* error rate above the limit;
* throughput stopped rising: the new point's QPS is less than ``min_gain`` (5%) above the
  previous point's;
* the next concurrency would exceed ``max_concurrency``.

The knee is the last point before throughput stopped rising (past it, doubling the requests
in flight buys < 5% more QPS and mostly queueing). The best point is the highest-QPS point
whose P99 is within the SLO and whose error rate is within the limit; its QPS, divided by the
number of targets, is the per-instance figure capacity planning needs.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tfsdeploy.loadtest import plotting

SWEEP_KIND = "tfsdeploy.sweep"
DEFAULT_MIN_GAIN = 0.05


@dataclass(frozen=True)
class SweepPoint:
    """The figures of one concurrency level."""

    concurrency: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    error_rate_pct: float
    count: int

    @classmethod
    def from_report(cls, concurrency: int, report: Mapping[str, Any]) -> SweepPoint:
        """Pick the figures out of a ghz-style run report."""
        ext = report["tfsdeploy"]
        pct = {p["percentile"]: p["latency"] / 1e6 for p in ext["percentiles"]}
        return cls(concurrency=concurrency, rps=float(report["rps"]), p50_ms=pct[50.0],
                   p95_ms=pct[95.0], p99_ms=pct[99.0], p999_ms=pct[99.9],
                   error_rate_pct=ext["errorRate"] * 100, count=int(report["count"]))


@dataclass(frozen=True)
class SweepLimits:
    """When to stop and what counts as acceptable."""

    slo_p99_ms: float | None = None
    max_error_rate_pct: float | None = 0.01
    min_gain: float = DEFAULT_MIN_GAIN
    max_concurrency: int = 4096

    def acceptable(self, point: SweepPoint) -> bool:
        """P99 within the SLO and errors within the limit."""
        if self.slo_p99_ms is not None and point.p99_ms > self.slo_p99_ms:
            return False
        return self.max_error_rate_pct is None or point.error_rate_pct <= self.max_error_rate_pct


def gain(before: SweepPoint, after: SweepPoint) -> float:
    """Relative QPS change from one point to the next."""
    return after.rps / before.rps - 1 if before.rps > 0 else float("inf")


def stop_reason(points: Sequence[SweepPoint], limits: SweepLimits) -> str | None:
    """Why the sweep must stop after the last point, or None to go on."""
    last = points[-1]
    if limits.slo_p99_ms is not None and last.p99_ms > limits.slo_p99_ms:
        return (f"p99 {last.p99_ms:.2f} ms broke the SLO {limits.slo_p99_ms:g} ms at "
                f"concurrency {last.concurrency}")
    if limits.max_error_rate_pct is not None and last.error_rate_pct > limits.max_error_rate_pct:
        return (f"error rate {last.error_rate_pct:.4g}% above {limits.max_error_rate_pct:g}% "
                f"at concurrency {last.concurrency}")
    if len(points) >= 2 and gain(points[-2], last) < limits.min_gain:
        return (f"throughput stopped rising: {gain(points[-2], last) * 100:+.1f}% "
                f"(< +{limits.min_gain * 100:g}%) from concurrency {points[-2].concurrency} "
                f"to {last.concurrency}")
    if last.concurrency * 2 > limits.max_concurrency:
        return f"reached the maximum concurrency {limits.max_concurrency}"
    return None


def knee(points: Sequence[SweepPoint], min_gain: float = DEFAULT_MIN_GAIN) -> SweepPoint | None:
    """The last point after which doubling concurrency gained less than ``min_gain``."""
    for before, after in itertools.pairwise(points):
        if gain(before, after) < min_gain:
            return before
    return None


def best_under_slo(points: Sequence[SweepPoint], limits: SweepLimits) -> SweepPoint | None:
    """Highest-QPS acceptable point."""
    good = [p for p in points if limits.acceptable(p)]
    return max(good, key=lambda p: p.rps) if good else None


def run_sweep(measure: Callable[[int], SweepPoint], start: int,
              limits: SweepLimits) -> tuple[list[SweepPoint], str]:
    """Measure at start, 2*start, ... until ``stop_reason`` says stop."""
    points: list[SweepPoint] = []
    concurrency = start
    while True:
        points.append(measure(concurrency))
        reason = stop_reason(points, limits)
        if reason is not None:
            return points, reason
        concurrency *= 2


def sweep_report(points: Sequence[SweepPoint], reason: str, limits: SweepLimits, *,
                 targets: Sequence[str], plot: str | None = None,
                 options: Mapping[str, Any] | None = None,
                 instances: int | None = None) -> dict[str, Any]:
    """The sweep report (JSON-ready); ``perInstanceQps`` (best QPS / ``instances``, by
    default one per target) feeds capacity planning."""
    best = best_under_slo(points, limits)
    found = knee(points, limits.min_gain)
    instances = max(instances or len(targets), 1)
    return {
        "kind": SWEEP_KIND,
        "version": 1,
        "date": dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="seconds"),
        "targets": list(targets),
        "instances": instances,
        "sloP99Ms": limits.slo_p99_ms,
        "maxErrorRatePct": limits.max_error_rate_pct,
        "minGainPct": limits.min_gain * 100,
        "stopReason": reason,
        "points": [asdict(p) for p in points],
        "knee": asdict(found) if found else None,
        "best": asdict(best) if best else None,
        "perInstanceQps": best.rps / instances if best else None,
        "plot": plot,
        "options": dict(options or {}),
    }


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON (indented) atomically enough for a report: temp file + rename."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def draw_plot(points: Sequence[SweepPoint], path: Path, limits: SweepLimits) -> None:
    """PNG of QPS (left axis), P50 and P99 (right axis) against concurrency (log 2); not drawn,
    said on stderr, when matplotlib is missing and cannot be installed (plotting.py)."""
    plt = plotting.pyplot_or_say(path)
    if plt is None:
        return

    xs = [p.concurrency for p in points]
    fig, ax_qps = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax_lat = ax_qps.twinx()
    ax_qps.plot(xs, [p.rps for p in points], "o-", color="tab:blue", label="QPS")
    ax_lat.plot(xs, [p.p50_ms for p in points], "s--", color="tab:green", label="P50")
    ax_lat.plot(xs, [p.p99_ms for p in points], "^--", color="tab:red", label="P99")
    if limits.slo_p99_ms is not None:
        ax_lat.axhline(limits.slo_p99_ms, color="tab:red", linestyle=":", label="P99 SLO")
    found = knee(points, limits.min_gain)
    if found is not None:
        ax_qps.axvline(found.concurrency, color="grey", linestyle=":", label="knee")
    best = best_under_slo(points, limits)
    if best is not None:
        ax_qps.plot([best.concurrency], [best.rps], "*", color="gold", markersize=16,
                    markeredgecolor="black", label="best under SLO")
    ax_qps.set_xscale("log", base=2)
    ax_qps.set_xticks(xs, [str(x) for x in xs])
    ax_qps.minorticks_off()
    ax_qps.set_xlabel("concurrency (requests in flight)")
    ax_qps.set_ylabel("throughput (QPS)")
    ax_lat.set_ylabel("latency (ms)")
    handles = ax_qps.get_legend_handles_labels()
    more = ax_lat.get_legend_handles_labels()
    ax_qps.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left", fontsize=8)
    ax_qps.set_title("Throughput and latency vs concurrency")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
