"""The ghz-compatible report and the human summary."""

from __future__ import annotations

import json
from typing import Any

from tfsdeploy.loadtest import report, stats

GHZ_KEYS = {"endReason", "date", "options", "count", "total", "average", "fastest", "slowest",
            "rps", "errorDistribution", "statusCodeDistribution", "latencyDistribution",
            "histogram"}


def _merged() -> stats.Merged:
    rec = stats.Recorder(keep_service_time=False)
    for i in range(1, 101):
        rec.record_ok(i * 1_000_000, i)  # 1..100 ms
    rec.record_error(500_000_000, 1, "DeadlineExceeded", "rpc error: code = DeadlineExceeded "
                     "desc = Deadline Exceeded")
    result = stats.finish(rec, start_ns=0, end_ns=2_000_000_000, cpu_user_s=0.2,
                          cpu_system_s=0.05, end_reason="normal")
    return stats.merge_results([result])


def _report(**kw: Any) -> dict[str, Any]:
    return report.ghz_report(_merged(), options={"concurrency": 4}, run={
        "loadMode": "closed-loop", "latencyFrom": "actual send", "procs": 1}, **kw)


def test_ghz_field_names_types_and_units() -> None:
    data = _report()
    assert set(data) >= GHZ_KEYS
    assert "details" not in data
    for key in ("total", "average", "fastest", "slowest"):
        assert isinstance(data[key], int)
    assert data["total"] == 2_000_000_000
    assert data["count"] == 101
    assert data["rps"] == 101 / 2
    assert data["fastest"] == 1_000_000 and data["slowest"] == 100_000_000  # OK only
    assert data["average"] == (sum(range(1, 101)) * 1_000_000 + 500_000_000) // 101
    dist = data["latencyDistribution"]
    assert [d["percentage"] for d in dist] == [10, 25, 50, 75, 90, 95, 99]
    assert all(isinstance(d["latency"], int) for d in dist)
    assert data["statusCodeDistribution"] == {"OK": 100, "DeadlineExceeded": 1}
    json.dumps(data)


def test_histogram_has_ten_buckets_plus_slowest_and_counts_everything() -> None:
    buckets = _report()["histogram"]
    assert isinstance(buckets, list) and len(buckets) == 11
    assert sum(b["count"] for b in buckets) == 100
    assert abs(buckets[0]["mark"] - 0.001) < 1e-9 and abs(buckets[-1]["mark"] - 0.1) < 1e-9
    assert abs(sum(b["frequency"] for b in buckets) - 1) < 1e-9


def test_extension_has_p999_and_client_cpu() -> None:
    ext = _report()["tfsdeploy"]
    assert isinstance(ext, dict)
    assert abs(ext["p999"] - 100_000_000) / 100_000_000 < 0.002
    assert ext["clientCpu"]["cores"] == 0.125
    assert ext["errorCount"] == 1 and ext["okCount"] == 100


def test_count_errors_puts_errors_into_the_percentiles() -> None:
    data = _report(count_errors=True)
    assert data["slowest"] == 500_000_000


def test_summary_mentions_the_key_figures() -> None:
    text = "\n".join(report.summary_lines(_report()))
    for needle in ("Requests/sec: 50.50", "99.9 % in", "[DeadlineExceeded] 1 responses",
                   "Client CPU"):
        assert needle in text
