"""Acceptance gates pass and fail at the right thresholds and say by how much."""

from __future__ import annotations

import json

import pytest

from tfsdeploy.loadtest import slo_gates as gates


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
    assert not gates.duration_gate(1.97, 2.0, "timeout").passed  # a closed loop: 1% = 0.02 s


def test_an_open_loop_may_end_one_send_interval_early() -> None:
    # 20 requests/s for 2 s: the last is due at 1.95 s and completes a few ms later
    assert gates.duration_gate(1.958, 2.0, "normal", send_interval_s=0.05).passed
    short = gates.duration_gate(1.9, 2.0, "normal", send_interval_s=0.05)
    assert not short.passed
    assert "ran 1.90 s of 2 s (end: normal), short by 0.1 s (5.0%), more than the slack " \
           "0.05 s" in short.detail
    assert gates.duration_slack(300.0, 0.05) == pytest.approx(3.0)  # 1% is more


def _report(*, count: int, errors: int, p99_ns: int, total_s: float = 2.0,
            options: dict[str, object] | None = None) -> dict[str, object]:
    return {"count": count, "rps": count / total_s, "total": int(total_s * 1e9),
            "endReason": "normal", "options": options or {},
            "tfsdeploy": {"errorCount": errors, "percentiles": [
                {"percentile": 99.0, "latency": p99_ns}]}}


def test_evaluate_allows_an_open_loop_its_last_interval() -> None:
    spec = gates.GateSpec(min_duration_s=2)
    paced = _report(count=40, errors=0, p99_ns=9_000_000, total_s=1.958,
                    options={"rps": 20, "load-schedule": "const"})
    assert {r.name: r.passed for r in gates.evaluate(paced, spec)}["duration"]
    closed = _report(count=40, errors=0, p99_ns=9_000_000, total_s=1.958,
                     options={"rps": 0, "load-schedule": "const"})
    assert not {r.name: r.passed for r in gates.evaluate(closed, spec)}["duration"]


def test_a_latency_gate_without_one_successful_request_fails() -> None:
    report = _report(count=3623, errors=3623, p99_ns=0)
    results = {r.name: r for r in gates.evaluate(report, gates.GateSpec(slo_p99_ms=50))}
    p99 = results["slo-p99"]
    assert not p99.passed
    assert p99.line() == "FAIL slo-p99: no successful request: no P99 to hold to the SLO 50 ms"
    assert p99.as_json()["observed"] is None
    assert json.loads(json.dumps(p99.as_json()))["passed"] is False
    assert not gates.all_passed(list(results.values()))
    one_ok = _report(count=3623, errors=3622, p99_ns=4_000_000)
    assert {r.name: r.passed for r in gates.evaluate(one_ok, gates.GateSpec(
        slo_p99_ms=50))}["slo-p99"]


def test_evaluate_reads_a_report() -> None:
    report = {"count": 1000, "rps": 500.0, "total": 2_000_000_000, "endReason": "normal",
              "tfsdeploy": {"errorCount": 0, "percentiles": [
                  {"percentile": 99.0, "latency": 40_000_000}]}}
    spec = gates.GateSpec(slo_p99_ms=30, min_qps=400, min_duration_s=2)
    results = {r.name: r.passed for r in gates.evaluate(report, spec)}
    assert results == {"slo-p99": False, "max-error-rate": True, "min-qps": True,
                       "duration": True}
