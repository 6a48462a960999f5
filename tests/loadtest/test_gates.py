"""Acceptance gates pass and fail at the right thresholds and say by how much."""

from __future__ import annotations

from tfsdeploy.loadtest import gates


def test_p99_gate_threshold_is_inclusive() -> None:
    assert gates.p99_gate(50.0, 50.0).passed
    failed = gates.p99_gate(60.0, 50.0)
    assert not failed.passed
    assert "over by 10 ms (20.0%)" in failed.detail


def test_default_error_rate_is_one_in_ten_thousand() -> None:
    limit = gates.DEFAULT_MAX_ERROR_RATE_PCT
    assert gates.error_rate_gate(1, 10_000, limit).passed
    failed = gates.error_rate_gate(2, 10_000, limit)
    assert not failed.passed
    assert "0.02% (2/10000) > 0.01%" in failed.detail


def test_no_request_is_a_failure() -> None:
    assert not gates.error_rate_gate(0, 0, 1.0).passed


def test_min_qps_gate() -> None:
    assert gates.qps_gate(1000.0, 1000.0).passed
    failed = gates.qps_gate(900.0, 1000.0)
    assert not failed.passed and "short by 100 QPS (10.0%)" in failed.detail


def test_duration_gate_fails_on_a_short_or_cancelled_run() -> None:
    assert gates.duration_gate(299.0, 300.0, "timeout").passed  # within 1%
    assert not gates.duration_gate(200.0, 300.0, "normal").passed
    assert not gates.duration_gate(300.0, 300.0, "cancel").passed


def test_evaluate_reads_a_report() -> None:
    report = {"count": 1000, "rps": 500.0, "total": 2_000_000_000, "endReason": "normal",
              "tfsdeploy": {"errorCount": 0, "percentiles": [
                  {"percentile": 99.0, "latency": 40_000_000}]}}
    spec = gates.GateSpec(slo_p99_ms=30, min_qps=400, min_duration_s=2)
    results = {r.name: r.passed for r in gates.evaluate(report, spec)}
    assert results == {"slo-p99": False, "max-error-rate": True, "min-qps": True,
                       "duration": True}
