"""Exact merging of per-process results."""

from __future__ import annotations

import random

from tfsdeploy.loadtest import stats


def _proc_result(latencies: list[int], errors: int = 0) -> stats.ProcResult:
    rec = stats.Recorder(keep_service_time=False)
    for i, latency in enumerate(latencies):
        rec.record_ok(latency, latency + i)
    for _ in range(errors):
        rec.record_error(5_000_000, 1, "Unavailable", "rpc error: code = Unavailable desc = x")
    return stats.finish(rec, start_ns=0, end_ns=10**9, cpu_user_s=0.5, cpu_system_s=0.1,
                        end_reason="normal")


def test_merged_histogram_equals_single_process_histogram() -> None:
    rng = random.Random(7)
    parts = [[rng.randint(50_000, 900_000_000) for _ in range(2000)] for _ in range(3)]
    merged = stats.merge_results([_proc_result(p) for p in parts])
    single = stats.new_histogram()
    for value in (v for p in parts for v in p):
        single.record_value(value // 1000)
    assert merged.ok_hist.get_total_count() == 6000
    assert list(merged.ok_hist.counts) == list(single.counts)
    for pct in (50, 90, 99, 99.9, 99.99, 100):
        assert stats.percentile_ns(merged.ok_hist, pct) == stats.percentile_ns(single, pct)


def test_merged_moments_and_counters_are_exact() -> None:
    a, b = [1_000, 9_000_000], [3_000, 4_000]
    merged = stats.merge_results([_proc_result(a, errors=2), _proc_result(b, errors=1)])
    assert (merged.ok.count, merged.ok.min_ns, merged.ok.max_ns) == (4, 1_000, 9_000_000)
    assert merged.ok.total_ns == sum(a + b)
    assert merged.count == 7
    assert merged.status_codes == {"OK": 4, "Unavailable": 3}
    assert merged.errors == {"rpc error: code = Unavailable desc = x": 3}
    assert abs(merged.cpu_user_s - 1.0) < 1e-9


def test_histogram_precision_is_within_a_tenth_of_a_percent() -> None:
    hist = stats.new_histogram()
    hist.record_value(123_456)
    value = stats.percentile_ns(hist, 50)
    assert abs(value - 123_456_000) / 123_456_000 < 0.001
