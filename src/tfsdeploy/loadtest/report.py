"""The run report: ghz-compatible JSON and a human summary.

JSON follows ghz's output (field names and units: every duration is an integer number of
nanoseconds, ``histogram[].mark`` is in seconds, ``rps`` is count / total). What ghz does not
have lives under one extra key, ``tfsdeploy``, which ghz readers ignore: p99.9 and p99.99, the
client CPU, the load mode, the open-loop service time, per-second counts, gate results and the
merged HdrHistogram (so runs can be merged again later).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hdrh.histogram import HdrHistogram

from tfsdeploy.loadtest import stats

GHZ_PERCENTILES = (10, 25, 50, 75, 90, 95, 99)
EXTRA_PERCENTILES = (10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99)
HISTOGRAM_BUCKETS = 10


def latency_histogram(merged: stats.Merged, *, count_errors: bool) -> HdrHistogram:
    """The histogram behind the percentiles: OK responses only, unless ``count_errors``."""
    if not count_errors:
        return merged.ok_hist
    both = stats.new_histogram()
    both.add(merged.ok_hist)
    both.add(merged.err_hist)
    return both


def _extremes(merged: stats.Merged, *, count_errors: bool) -> stats.Moments:
    moments = stats.Moments()
    moments.merge(merged.ok)
    if count_errors:
        moments.merge(merged.err)
    return moments


def ghz_histogram(hist: HdrHistogram, fastest_ns: int, slowest_ns: int) -> list[dict[str, Any]]:
    """ghz's histogram: 10 equal-width buckets from fastest to slowest, plus slowest.

    Bucket i counts latencies in (mark[i-1], mark[i]]; marks are seconds.
    """
    total = hist.get_total_count()
    if total == 0:
        return []
    width = (slowest_ns - fastest_ns) / HISTOGRAM_BUCKETS
    marks = [fastest_ns + width * i for i in range(HISTOGRAM_BUCKETS)] + [float(slowest_ns)]
    counts = [0] * len(marks)
    for item in hist.get_recorded_iterator():
        value = min(max(item.value_iterated_to * 1000, fastest_ns), slowest_ns)
        index = next((i for i, mark in enumerate(marks) if value <= mark), len(marks) - 1)
        counts[index] += item.count_added_in_this_iter_step
    return [{"mark": mark / 1e9, "count": count, "frequency": count / total}
            for mark, count in zip(marks, counts, strict=True)]


def _rfc3339_now() -> str:
    return dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="seconds")


def _client_cpu(merged: stats.Merged) -> dict[str, float]:
    seconds = merged.cpu_user_s + merged.cpu_system_s
    count = max(merged.count, 1)
    return {"userSeconds": round(merged.cpu_user_s, 3),
            "systemSeconds": round(merged.cpu_system_s, 3),
            "cores": round(seconds / merged.wall_s, 3),
            "microsPerRequest": round(seconds * 1e6 / count, 1),
            "requestsPerCoreSecond": round(merged.count / seconds, 1) if seconds else 0.0}


def _percentiles(hist: HdrHistogram) -> list[dict[str, Any]]:
    return [{"percentile": p, "latency": stats.percentile_ns(hist, p)}
            for p in EXTRA_PERCENTILES]


def _extension(merged: stats.Merged, hist: HdrHistogram, run: Mapping[str, Any]) -> dict[str, Any]:
    count = merged.count
    ext: dict[str, Any] = {
        **run,
        "p999": stats.percentile_ns(hist, 99.9),
        "percentiles": _percentiles(hist),
        "okCount": merged.ok.count,
        "errorCount": merged.err.count,
        "errorRate": merged.err.count / count if count else 0.0,
        "clientCpu": _client_cpu(merged),
        "perSecond": [{"second": s, "count": c, "errors": e}
                      for s, (c, e) in merged.per_second.items()],
        "lateSends": merged.late_sends,
        "ownLateSends": merged.own_late_sends,
        "maxSendLag": merged.max_send_lag_ns,
        "hdrHistogram": hist.encode().decode("ascii"),
    }
    if merged.service_hist is not None:
        ext["serviceTime"] = {"note": "latency from the actual send (open loop only)",
                              "percentiles": _percentiles(merged.service_hist)}
    return ext


def ghz_report(merged: stats.Merged, *, options: Mapping[str, Any], run: Mapping[str, Any],
               count_errors: bool = False, name: str = "", tags: Mapping[str, str] | None = None,
               details: bool = False) -> dict[str, Any]:
    """The full report as a JSON-ready dict (ghz fields first, then ``tfsdeploy``)."""
    hist = latency_histogram(merged, count_errors=count_errors)
    extremes = _extremes(merged, count_errors=count_errors)
    count = merged.count
    total_ns = int(merged.wall_s * 1e9)
    report: dict[str, Any] = {}
    if name:
        report["name"] = name
    report.update({
        "endReason": merged.end_reason,
        "date": _rfc3339_now(),
        "options": dict(options),
        "count": count,
        "total": total_ns,
        "average": (merged.ok.total_ns + merged.err.total_ns) // count if count else 0,
        "fastest": extremes.min_ns,
        "slowest": extremes.max_ns,
        "rps": count / merged.wall_s if count else 0.0,
        "errorDistribution": dict(merged.errors),
        "statusCodeDistribution": dict(merged.status_codes),
        "latencyDistribution": [{"percentage": p, "latency": stats.percentile_ns(hist, p)}
                                for p in GHZ_PERCENTILES] if hist.get_total_count() else None,
        "histogram": ghz_histogram(hist, extremes.min_ns, extremes.max_ns),
    })
    if details:
        offset = time.time_ns() - time.perf_counter_ns()
        report["details"] = [_detail(d, offset) for d in merged.details]
    if tags:
        report["tags"] = dict(tags)
    report["tfsdeploy"] = _extension(merged, hist, run)
    return report


def _detail(item: tuple[int, int, str, str], offset_ns: int) -> dict[str, Any]:
    """One ghz ``details`` entry; ``offset_ns`` maps the monotonic clock to wall time."""
    began, latency, error, status = item
    stamp = dt.datetime.fromtimestamp((began + offset_ns) / 1e9, dt.UTC).astimezone()
    return {"timestamp": stamp.isoformat(), "latency": latency, "error": error,
            "status": status}


# -- human summary --------------------------------------------------------------------------

def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report as plain text lines (the rich summary prints the same facts)."""
    ext = report["tfsdeploy"]
    lines = ["Summary:",
             f"  Count:        {report['count']}",
             f"  Total:        {report['total'] / 1e9:.2f} s",
             f"  Slowest:      {_ms(report['slowest'])}",
             f"  Fastest:      {_ms(report['fastest'])}",
             f"  Average:      {_ms(report['average'])}",
             f"  Requests/sec: {report['rps']:.2f}",
             f"  Mode:         {ext['loadMode']} (latency from {ext['latencyFrom']})",
             "", "Latency distribution:"]
    lines += [f"  {p['percentile']:g} % in {_ms(p['latency'])}" for p in ext["percentiles"]]
    if "serviceTime" in ext:
        st = {p["percentile"]: p["latency"] for p in ext["serviceTime"]["percentiles"]}
        lines.append(f"  service time from actual send: p50 {_ms(st[50.0])}, "
                     f"p99 {_ms(st[99.0])}, p99.9 {_ms(st[99.9])}")
    if ext.get("lateSends"):
        share = ext["lateSends"] / max(report["count"], 1) * 100
        lines.append(f"  {ext['lateSends']} requests ({share:.1f}%) were sent > 10 ms after "
                     "their intended time: all workers busy (raise -c) or client saturated")
    lines += ["", "Status code distribution:"]
    lines += [f"  [{k}] {v} responses" for k, v in sorted(report["statusCodeDistribution"].items())]
    if report["errorDistribution"]:
        lines += ["", "Error distribution:"]
        lines += [f"  [{v}] {k}" for k, v in sorted(report["errorDistribution"].items(),
                                                      key=lambda kv: -kv[1])]
    cpu = ext["clientCpu"]
    lines += ["", f"Client CPU: {cpu['userSeconds'] + cpu['systemSeconds']:.2f} s "
              f"({cpu['cores']:.2f} cores, {cpu['microsPerRequest']:.0f} us/request) "
              f"over {ext['procs']} process(es)"]
    return lines


def print_summary(report: Mapping[str, Any], gate_lines: Sequence[str] = ()) -> None:
    """Print the human summary with rich (a table of percentiles, colours for gates)."""
    from rich.console import Console  # rich is only needed for people, not for JSON output

    console = Console(highlight=False)
    for line in summary_lines(report):
        console.print(line, markup=False)
    for line in gate_lines:
        style = "green" if line.startswith("PASS") else "bold red"
        console.print(line, style=style, markup=False)
