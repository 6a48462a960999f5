"""Sweep stop rules, knee, best point under the SLO, report and plot (pure: fake measure)."""

from __future__ import annotations

from pathlib import Path

from tfsdeploy.loadtest import sweep
from tfsdeploy.loadtest.sweep import SweepLimits, SweepPoint


def _point(c: int, rps: float, p99: float, err: float = 0.0) -> SweepPoint:
    return SweepPoint(concurrency=c, rps=rps, p50_ms=p99 / 2, p95_ms=p99 * 0.9, p99_ms=p99,
                      p999_ms=p99 * 1.2, error_rate_pct=err, count=1000)


# an inverted U: linear, then flat, then latency explodes
CURVE = {64: (4000, 20), 128: (5000, 30), 256: (5200, 60), 512: (5150, 180), 1024: (4000, 900)}


def _measure(c: int) -> SweepPoint:
    rps, p99 = CURVE[c]
    return _point(c, rps, p99)


def test_stops_when_throughput_gains_less_than_five_percent() -> None:
    points, reason = sweep.run_sweep(_measure, 64, SweepLimits(slo_p99_ms=100))
    assert [p.concurrency for p in points] == [64, 128, 256]
    assert "stopped rising: +4.0%" in reason
    assert sweep.knee(points) == points[1]
    assert sweep.best_under_slo(points, SweepLimits(slo_p99_ms=100)) == points[2]


def test_stops_when_p99_breaks_the_slo() -> None:
    limits = SweepLimits(slo_p99_ms=25)
    points, reason = sweep.run_sweep(_measure, 64, limits)
    assert [p.concurrency for p in points] == [64, 128]
    assert "broke the SLO" in reason
    assert sweep.best_under_slo(points, limits) == points[0]


def test_stops_on_errors_and_at_the_maximum() -> None:
    errors = sweep.stop_reason([_point(64, 100, 1, err=0.5)], SweepLimits())
    assert errors is not None and "error rate" in errors
    at_max = sweep.stop_reason([_point(64, 100, 1)], SweepLimits(max_concurrency=100))
    assert at_max is not None and "maximum concurrency" in at_max


def test_no_point_under_the_slo() -> None:
    limits = SweepLimits(slo_p99_ms=5)
    points, _ = sweep.run_sweep(_measure, 64, limits)
    data = sweep.sweep_report(points, "x", limits, targets=["a:1"])
    assert data["best"] is None and data["perInstanceQps"] is None


def test_report_divides_by_instances_and_plot_is_a_png(tmp_path: Path) -> None:
    limits = SweepLimits(slo_p99_ms=100)
    points, reason = sweep.run_sweep(_measure, 64, limits)
    data = sweep.sweep_report(points, reason, limits, targets=["a:1", "b:1"])
    assert data["kind"] == "tfsdeploy.sweep"
    assert data["perInstanceQps"] == 2600.0
    per_gpu = sweep.sweep_report(points, reason, limits, targets=["a:1", "b:1"], instances=4)
    assert (per_gpu["instances"], per_gpu["perInstanceQps"]) == (4, 1300.0)
    assert data["knee"]["concurrency"] == 128
    png = tmp_path / "sweep.png"
    sweep.draw_plot(points, png, limits)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
