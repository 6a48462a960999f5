"""The acceptance table: each row's figure, threshold, source and verdict, and the exit code
(pure).

Rows, each with its figure and when it passes:

- throughput: OK responses / duration, every generator's requests; >= 99% of the target QPS,
  and every generator ran the whole window;
- P99 every interval: the worst interval's P99 of OK responses; <= the SLO in every interval
  (an interval inside the window with no OK response fails);
- error rate: failed / completed requests; <= the limit (0.01%);
- P99 during the release: P99 of OK responses completed while ``fab deploy`` ran; <= the SLO,
  and the deploy succeeded inside the window.

Exit codes: 0 every row passed; 1 nothing could be measured (no generator returned results);
2 a row failed, and its failure is the fleet's (no generator lagged, or the row fails even
with the worst generator lag taken off); 3 the release left the fleet inconsistent (the
deploy's own 3); 4 the release could not take the deploy lock (the deploy's own 4); 5 a
generator was lost or failed, or the only failed rows could be the generators' own lag: the
figures are kept but do not measure the fleet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfsdeploy.accept.merge import FleetMerge, GeneratorOutcome, Slice
from tfsdeploy.accept.plan import AcceptPlan
from tfsdeploy.loadtest import stats

THROUGHPUT_SHARE = 0.99
LATE_SHARE_LIMIT = 0.01  # a generator with more late sends could not hold its share
CPU_BUSY_WARN = 0.85  # a generator process using this share of its core is near its limit
CLOCK_WARN_MS = 50.0  # generators' clocks further apart misalign their seconds visibly

EXIT_OK, EXIT_NOTHING, EXIT_ROW_FAILED = 0, 1, 2
EXIT_INCONSISTENT, EXIT_LOCKED, EXIT_LOADGEN = 3, 4, 5


@dataclass(frozen=True)
class Row:
    """One row of the table."""

    name: str
    figure: float | None
    threshold: float
    comparison: str  # ">=" or "<="
    unit: str
    passed: bool
    detail: str
    source: str

    def as_json(self) -> dict[str, Any]:
        """The row for the JSON report."""
        return {"row": self.name, "figure": self.figure, "threshold": self.threshold,
                "comparison": self.comparison, "unit": self.unit, "passed": self.passed,
                "detail": self.detail, "source": self.source}


@dataclass(frozen=True)
class ReleaseOutcome:
    """The ``fab deploy`` run in the window: when it ran (seconds after the common start)."""

    version: int
    argv: tuple[str, ...]
    started_s: float | None
    ended_s: float | None
    exit_code: int | None
    log: str
    skipped: str = ""  # why it did not run

    def as_json(self) -> dict[str, Any]:
        """The release for the JSON report."""
        return {"version": self.version, "command": list(self.argv),
                "startS": self.started_s, "endS": self.ended_s, "exitCode": self.exit_code,
                "log": self.log, "skipped": self.skipped or None}


def throughput_row(plan: AcceptPlan, merged: FleetMerge,
                   outcomes: Sequence[GeneratorOutcome],
                   per_interval: Sequence[Slice]) -> Row:
    """OK responses per second of the window, against the target."""
    ok = merged.fleet.ok.count if merged.fleet is not None else 0
    figure = ok / plan.duration_s
    limit = plan.target_qps.value * THROUGHPUT_SHARE
    missing = [o.name for o in outcomes if not o.measured]
    window = [s for s in per_interval if s.end_s <= plan.duration_s]
    low = min((s.ok / (s.end_s - s.start_s) for s in window), default=0.0)
    passed = figure >= limit and not missing
    detail = (f"{figure:.1f} OK responses/s over {plan.duration_s:g} s (target "
              f"{plan.target_qps.value:g}, at least {limit:.1f}); lowest "
              f"{plan.interval_s} s interval {low:.1f}/s")
    if missing:
        detail += f"; no figures from {', '.join(missing)}"
    return Row("throughput", round(figure, 3), round(limit, 3), ">=", "QPS", passed, detail,
               f"{plan.target_qps.source}; {THROUGHPUT_SHARE:.0%} of it")


def interval_p99_row(plan: AcceptPlan, per_interval: Sequence[Slice]) -> Row:
    """P99 of every interval under the SLO (the worst one is the figure)."""
    slo = plan.slo_p99_ms.value
    worst: tuple[float, Slice] | None = None
    silent = []
    for item in per_interval:
        p99 = item.percentile_ms(99.0)
        if p99 is None:
            if item.end_s <= plan.duration_s:  # a window second with no OK response at all
                silent.append(item.start_s)
            continue
        if worst is None or p99 > worst[0]:
            worst = (p99, item)
    over = sum(1 for s in per_interval if (s.percentile_ms(99.0) or 0) > slo)
    passed = worst is not None and worst[0] <= slo and not silent
    if worst is None:
        detail = "no OK response in any interval"
    else:
        detail = (f"worst P99 {worst[0]:.2f} ms at {worst[1].start_s}-{worst[1].end_s} s; "
                  f"{over} of {len(per_interval)} intervals over {slo:g} ms")
    if silent:
        detail += f"; no OK response in the interval(s) starting at {silent[:5]} s"
    return Row(f"p99 every {plan.interval_s} s", round(worst[0], 3) if worst else None,
               slo, "<=", "ms", passed, detail, plan.slo_p99_ms.source)


def error_rate_row(plan: AcceptPlan, merged: FleetMerge) -> Row:
    """Failed requests over completed ones; a run that completed nothing fails."""
    limit = plan.max_error_rate_pct.value
    fleet = merged.fleet
    if fleet is None or fleet.count == 0:
        return Row("error rate", None, limit, "<=", "%", False, "no request completed",
                   plan.max_error_rate_pct.source)
    pct = fleet.err.count / fleet.count * 100
    top = ", ".join(f"{k} x{v}" for k, v in fleet.status_codes.most_common(3) if k != "OK")
    detail = f"{fleet.err.count} of {fleet.count} failed" + (f" ({top})" if top else "")
    return Row("error rate", round(pct, 6), limit, "<=", "%", pct <= limit, detail,
               plan.max_error_rate_pct.source)


def release_row(plan: AcceptPlan, release: ReleaseOutcome, window: Slice | None) -> Row:
    """P99 while the release rolled out; the deploy must also have succeeded in the window."""
    slo = plan.slo_p99_ms.value
    name = f"p99 during release v{release.version}"
    problems = []
    if release.skipped:
        problems.append(f"not run: {release.skipped}")
    elif release.exit_code != 0:
        problems.append(f"fab deploy exited {release.exit_code} (see {release.log})")
    if release.ended_s is not None and release.ended_s > plan.duration_s:
        problems.append(f"the deploy ended at {release.ended_s:.1f} s, after the "
                        f"{plan.duration_s:g} s window: lengthen --duration or release earlier")
    p99 = window.percentile_ms(99.0) if window is not None else None
    if window is not None:
        head = (f"P99 {p99:.2f} ms" if p99 is not None else "no OK response") + \
               f" over {window.count} requests from {release.started_s:.1f} to " \
               f"{release.ended_s:.1f} s"
    else:
        head = "no request measured during the release"
    passed = not problems and p99 is not None and p99 <= slo
    detail = "; ".join([head, *problems])
    return Row(name, round(p99, 3) if p99 is not None else None, slo, "<=", "ms", passed,
               detail, plan.slo_p99_ms.source)


# -- the generators ------------------------------------------------------------------------------

def generator_warnings(outcome: GeneratorOutcome, merged: stats.Merged | None) -> list[str]:
    """Why this generator's figures may show its own limits rather than the fleet's."""
    warnings = []
    if outcome.clock_offset_ms is not None and abs(outcome.clock_offset_ms) > CLOCK_WARN_MS:
        warnings.append(f"{outcome.name}'s clock is at least {outcome.clock_offset_ms:+.0f} ms "
                        "off this machine's: it started off the common instant and its seconds "
                        "are shifted by that much (synchronise the clocks, e.g. NTP)")
    if not outcome.measured or merged is None:
        what = "was lost mid-run" if outcome.status == "lost" else "failed"
        return [*warnings, f"{outcome.name} {what}: {outcome.error}; its share "
                f"({outcome.share_qps:g} QPS) is missing from the figures"]
    count = max(merged.count, 1)
    late_share = merged.own_late_sends / count
    if late_share > LATE_SHARE_LIMIT:
        warnings.append(
            f"{outcome.name} could not hold its share: {merged.own_late_sends} of "
            f"{merged.count} requests ({late_share:.1%}) were sent > 10 ms after their time "
            f"though a worker was free (worst {merged.max_send_lag_ns / 1e6:.0f} ms late); "
            f"{_cpu_text(outcome, merged)}. Its lateness counts as latency: add generators or "
            "give them cores")
    elif _cpu_share(outcome, merged) >= CPU_BUSY_WARN:
        warnings.append(f"{outcome.name} is near its limit ({_cpu_text(outcome, merged)}), "
                        "though its sends kept to the schedule")
    return warnings


def _cpu_share(outcome: GeneratorOutcome, merged: stats.Merged) -> float:
    cores_used = (merged.cpu_user_s + merged.cpu_system_s) / merged.wall_s
    return float(cores_used / max(outcome.procs, 1))


def _cpu_text(outcome: GeneratorOutcome, merged: stats.Merged) -> str:
    cores_used = (merged.cpu_user_s + merged.cpu_system_s) / merged.wall_s
    text = f"its processes used {cores_used:.2f} cores of {max(outcome.procs, 1)}"
    busy = (outcome.host_cpu or {}).get("busyPct")
    if busy is not None:
        text += f", its machine was {busy:g}% busy"
    return text


def lagged(outcome: GeneratorOutcome, merged: stats.Merged | None) -> bool:
    """Whether the generator fell behind its schedule by its own doing: more than 1% of its
    requests sent > 10 ms late although a worker was free (late sends that waited for a
    worker are the fleet's slowness: every worker was waiting for an answer)."""
    return bool(outcome.measured and merged is not None
                and merged.own_late_sends / max(merged.count, 1) > LATE_SHARE_LIMIT)


def worst_own_lag_ms(outcomes: Sequence[GeneratorOutcome], merged: FleetMerge) -> float | None:
    """The latest any lagging generator sent a request by its own doing (None: none lagged)."""
    lags = [m.max_send_lag_ns / 1e6 for o in outcomes
            if lagged(o, m := merged.generators.get(o.name)) and m is not None]
    return max(lags) if lags else None


def fleet_to_blame(row: Row, lag_ms: float | None) -> bool:
    """Whether a failed row is the fleet's failure whatever the generators' own lag.

    Latency counts from the intended send time, so a generator's lag adds at most its worst
    lag to any request: a P99 still over the SLO after taking that off was the fleet's. The
    other rows do not depend on when requests were sent (every request of the window is
    sent and counted; deadlines run from the actual send).
    """
    if row.unit != "ms" or lag_ms is None:
        return True
    return row.figure is not None and row.figure - lag_ms > row.threshold


def exit_code(rows: Sequence[Row], outcomes: Sequence[GeneratorOutcome], merged: FleetMerge,
              release: ReleaseOutcome | None) -> int:
    """The run's exit code (module docstring)."""
    if release is not None and release.exit_code in (EXIT_INCONSISTENT, EXIT_LOCKED):
        return int(release.exit_code)
    if not any(o.measured for o in outcomes):
        return EXIT_NOTHING
    if any(not o.measured for o in outcomes):
        return EXIT_LOADGEN
    failed = [r for r in rows if not r.passed]
    if not failed:
        return EXIT_OK
    lag_ms = worst_own_lag_ms(outcomes, merged)
    if any(fleet_to_blame(r, lag_ms) for r in failed):
        return EXIT_ROW_FAILED
    return EXIT_LOADGEN


def verdict(code: int) -> str:
    """One word for the exit code."""
    return {EXIT_OK: "pass", EXIT_ROW_FAILED: "fail", EXIT_NOTHING: "nothing measured",
            EXIT_INCONSISTENT: "fail: fleet inconsistent", EXIT_LOCKED: "fail: deploy locked",
            EXIT_LOADGEN: "inconclusive: load generation failed"}.get(code, "fail")
