"""The acceptance report: a ghz-compatible JSON file (the fleet's merged load as ghz reports a
run, everything else under ``tfsdeploy.accept``) and the lines people read (pure)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfsdeploy.accept.merge import FleetMerge, GeneratorOutcome, Slice, series_rows
from tfsdeploy.accept.plan import AcceptPlan
from tfsdeploy.accept.rows import ReleaseOutcome, Row, generator_warnings, verdict
from tfsdeploy.loadtest import report as ghz
from tfsdeploy.loadtest import stats

KIND = "tfsdeploy.accept"


@dataclass(frozen=True)
class RunFacts:
    """What the run was, beside the figures."""

    start_at_s: float  # wall clock of the common start
    request_data: str
    plot: str
    cleanup_problems: tuple[str, ...] = ()


def _options(plan: AcceptPlan, outcomes: Sequence[GeneratorOutcome]) -> dict[str, Any]:
    """ghz's ``options`` for the whole fleet's load."""
    return {"call": "tensorflow.serving.PredictionService.Predict",
            "host": ",".join(plan.targets), "insecure": True,
            "rps": int(plan.target_qps.value), "load-schedule": "const",
            "concurrency": sum(o.workers for o in outcomes),
            "duration": int(plan.duration_s * 1e9), "timeout": int(plan.timeout_s * 1e9),
            "async": True, "model": plan.model.name,
            "procs": sum(o.procs for o in outcomes),
            "loadgens": [o.name for o in outcomes], "transport": "grpc"}


def _generator_json(outcome: GeneratorOutcome, merged: stats.Merged | None,
                    address: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "name": outcome.name, "address": address, "shareQps": outcome.share_qps,
        "status": outcome.status, "error": outcome.error or None, "procs": outcome.procs,
        "workers": outcome.workers, "warmupRequests": outcome.warmup,
        "clockOffsetMs": outcome.clock_offset_ms,
        "endedS": outcome.ended_s, "hostCpu": outcome.host_cpu,
        "warnings": generator_warnings(outcome, merged)}
    if merged is not None:
        cpu = merged.cpu_user_s + merged.cpu_system_s
        item.update({
            "count": merged.count, "okCount": merged.ok.count, "errorCount": merged.err.count,
            "rps": merged.count / merged.wall_s,
            "p50Ms": stats.percentile_ns(merged.ok_hist, 50) / 1e6,
            "p99Ms": stats.percentile_ns(merged.ok_hist, 99) / 1e6,
            "lateSends": merged.late_sends, "ownLateSends": merged.own_late_sends,
            "maxSendLagMs": merged.max_send_lag_ns / 1e6,
            "cpuSeconds": round(cpu, 3), "coresUsed": round(cpu / merged.wall_s, 3),
            "hdrHistogram": merged.ok_hist.encode().decode("ascii")})
    return item


def _rfc3339(wall_s: float) -> str:
    return dt.datetime.fromtimestamp(wall_s, dt.UTC).astimezone().isoformat(timespec="seconds")


def accept_json(plan: AcceptPlan, merged: FleetMerge, per_second: Sequence[Slice],
                rows: Sequence[Row], outcomes: Sequence[GeneratorOutcome],
                release: ReleaseOutcome | None, code: int, facts: RunFacts,
                addresses: Mapping[str, str | None]) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    generators = [_generator_json(o, merged.generators.get(o.name), addresses.get(o.name))
                  for o in outcomes]
    accept = {
        "kind": KIND, "model": plan.model.name, "inventory": plan.inventory_path,
        "targets": list(plan.targets), "targetQps": plan.target_qps.value,
        "durationS": plan.duration_s, "intervalS": plan.interval_s,
        "sloP99Ms": plan.slo_p99_ms.value, "maxErrorRatePct": plan.max_error_rate_pct.value,
        "startAt": _rfc3339(facts.start_at_s), "exitCode": code, "verdict": verdict(code),
        "rows": [r.as_json() for r in rows],
        "release": release.as_json() if release is not None else None,
        "generators": generators,
        "warnings": [w for g in generators for w in g["warnings"]],
        "merge": {"count": merged.count, "sumOfGenerators": merged.generator_count_sum,
                  "equal": merged.count == merged.generator_count_sum},
        "series": series_rows(per_second),
        "requestData": facts.request_data, "plot": facts.plot,
        "cleanupProblems": list(facts.cleanup_problems),
    }
    if merged.fleet is None:
        return {"endReason": "cancel", "count": 0, "options": _options(plan, outcomes),
                "tfsdeploy": {"accept": accept}}
    run = {"targets": list(plan.targets), "transport": "grpc", "loadMode": "open-loop",
           "latencyFrom": "intended send time", "procs": sum(o.procs for o in outcomes),
           "loadgens": len(outcomes)}
    data = ghz.ghz_report(merged.fleet, options=_options(plan, outcomes), run=run,
                          name=f"fab accept {plan.model.name}")
    data["tfsdeploy"]["accept"] = accept
    return data


# -- for people ---------------------------------------------------------------------------------

def _figure(row: Mapping[str, Any]) -> str:
    value = row["figure"]
    return "-" if value is None else f"{value:.4g} {row['unit']}"


def row_table(data: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(row, figure, threshold, result, detail, source) for each row."""
    return [(r["row"], _figure(r), f"{r['comparison']} {r['threshold']:g} {r['unit']}",
             "PASS" if r["passed"] else "FAIL", r["detail"], r["source"])
            for r in data["tfsdeploy"]["accept"]["rows"]]


def generator_table(data: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(generator, share, status, count, QPS, P99, late sends, CPU) for each generator."""
    out: list[tuple[str, ...]] = []
    for g in data["tfsdeploy"]["accept"]["generators"]:
        measured = "count" in g
        busy = (g.get("hostCpu") or {}).get("busyPct")
        out.append((g["name"], f"{g['shareQps']:g}", g["status"] + (
            f": {g['error']}" if g["error"] else ""),
            str(g["count"]) if measured else "-",
            f"{g['rps']:.1f}" if measured else "-",
            f"{g['p99Ms']:.2f} ms" if measured else "-",
            f"{g['lateSends']}; own lag {g['ownLateSends']} (max {g['maxSendLagMs']:.0f} ms)"
            if measured else "-",
            (f"{g['coresUsed']:.2f} of {g['procs']} procs" if measured else "-")
            + (f", host {busy:g}% busy" if busy is not None else "")))
    return out


def closing_lines(data: Mapping[str, Any], json_path: str) -> list[str]:
    """Warnings, the merge check, the release, the files and the verdict."""
    accept = data["tfsdeploy"]["accept"]
    lines = [f"WARNING: {w}" for w in accept["warnings"]]
    merge = accept["merge"]
    lines.append(f"merged count {merge['count']} = sum of the generators' counts "
                 f"{merge['sumOfGenerators']}" if merge["equal"] else
                 f"MERGE MISMATCH: merged {merge['count']} != sum {merge['sumOfGenerators']}")
    release = accept["release"]
    if release is not None:
        lines.append(f"release v{release['version']}: " + (
            f"skipped ({release['skipped']})" if release["skipped"] else
            f"fab deploy from {release['startS']:.1f} s to {release['endS']:.1f} s, exit "
            f"{release['exitCode']} (log {release['log']})"))
    lines += [f"cleanup: {p}" for p in accept["cleanupProblems"]]
    lines.append(f"report: {json_path}  plot: {accept['plot']}")
    lines.append(f"accept {accept['model']}: {accept['verdict']} (exit {accept['exitCode']})")
    return lines
