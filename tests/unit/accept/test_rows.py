"""The acceptance table's rows and the exit code (tfsdeploy.accept.rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfsdeploy.accept import rows
from tfsdeploy.accept.merge import LOST, GeneratorOutcome, merge_fleet, slice_of, slices
from tfsdeploy.accept.plan import AcceptPlan

from .support import Request, S, outcome, plan, proc_result

MS = 1_000_000


def steady(seconds: int, qps: int, latency_ms: float, *, errors: int = 0,
           slow_second: int | None = None, slow_ms: float = 0.0) -> list[Request]:
    """``qps`` completions in each second, ``errors`` of them failed (spread out)."""
    out: list[Request] = []
    for second in range(seconds):
        for i in range(qps):
            latency = slow_ms if second == slow_second and i % 10 == 0 else latency_ms
            out.append((second * S + i * (S // qps), int(latency * MS), True))
    for k in range(errors):
        index = (k * 997) % len(out)
        done, latency, _ = out[index]
        out[index] = (done, latency, False)
    return out


def table(accept: AcceptPlan, outcomes: list[GeneratorOutcome],
          release: rows.ReleaseOutcome | None = None) -> tuple[list[rows.Row], int]:
    merged = merge_fleet(outcomes)
    assert merged.fleet is not None
    per_interval = slices(merged.fleet, accept.duration_s, accept.interval_s)
    got = [rows.throughput_row(accept, merged, outcomes, per_interval),
           rows.interval_p99_row(accept, per_interval), rows.error_rate_row(accept, merged)]
    if release is not None:
        window = slice_of(merged.fleet, int(release.started_s or 0),
                          int(release.ended_s or 0) + 1)
        got.append(rows.release_row(accept, release, window))
    return got, rows.exit_code(got, outcomes, merged, release)


@pytest.fixture
def accept(tmp_path: Path) -> AcceptPlan:
    return plan(tmp_path, target_qps=200.0, duration="10s", loadgens="loadgens")


def two_generators(a: list[Request], b: list[Request], *, late: int = 0,
                   own_late: int = 0) -> list[GeneratorOutcome]:
    return [outcome("tb1", [proc_result(a, late=late, own_late=own_late)]),
            outcome("tb2", [proc_result(b)])]


def test_a_fleet_that_keeps_up_passes_every_row(accept: AcceptPlan) -> None:
    got, code = table(accept, two_generators(steady(10, 100, 5), steady(10, 100, 6)))
    assert [(r.name, r.passed) for r in got] == [
        ("throughput", True), ("p99 every 1 s", True), ("error rate", True)]
    assert got[0].figure == 200.0 and got[0].threshold == 198.0
    assert got[1].figure == pytest.approx(6.0, rel=0.002)
    assert code == rows.EXIT_OK


def test_one_slow_second_fails_the_interval_row_not_the_others(accept: AcceptPlan) -> None:
    # tb2's second 4: every tenth request takes 80 ms, so that second's P99 is 80 ms
    got, code = table(accept, two_generators(steady(10, 100, 5),
                                             steady(10, 100, 5, slow_second=4, slow_ms=80)))
    interval = got[1]
    assert not interval.passed and interval.figure == pytest.approx(80.0, rel=0.002)
    assert "at 4-5 s; 1 of 10 intervals over 50 ms" in interval.detail
    assert got[0].passed and got[2].passed
    assert code == rows.EXIT_ROW_FAILED


def test_the_interval_length_groups_seconds(tmp_path: Path) -> None:
    # the same slow second, in 5 s intervals: 10 slow of 1000 requests is exactly the 1% tail
    accept = plan(tmp_path, target_qps=200.0, duration="10s", loadgens="loadgens",
                  interval="5s")
    got, _ = table(accept, two_generators(steady(10, 100, 5),
                                          steady(10, 100, 5, slow_second=4, slow_ms=80)))
    assert got[1].name == "p99 every 5 s" and got[1].passed


def test_a_silent_second_fails_the_interval_row(accept: AcceptPlan) -> None:
    a = [r for r in steady(10, 100, 5) if r[0] // S != 7]
    b = [r for r in steady(10, 100, 5) if r[0] // S != 7]
    got, _ = table(accept, two_generators(a, b))
    assert not got[1].passed and "no OK response in the interval(s) starting at [7] s" in \
        got[1].detail
    assert not got[0].passed  # 180 OK/s < 198


def test_error_rate_limit_is_inclusive(accept: AcceptPlan) -> None:
    # 2000 requests: 0.01% allows 0.2 of them, so one error fails
    got, _ = table(accept, two_generators(steady(10, 100, 5, errors=1), steady(10, 100, 5)))
    assert not got[2].passed and got[2].figure == pytest.approx(0.05)
    assert "1 of 2000 failed (Unavailable x1)" in got[2].detail
    loose = plan(Path(str(accept.model.source)).parent, target_qps=200.0, duration="10s",
                 loadgens="loadgens", max_error_rate_pct=0.05)
    got, _ = table(loose, two_generators(steady(10, 100, 5, errors=1), steady(10, 100, 5)))
    assert got[2].passed


def release(started: float, ended: float, code: int = 0) -> rows.ReleaseOutcome:
    return rows.ReleaseOutcome(2, ("fab", "deploy"), started, ended, code, "deploy.log")


def test_release_row_takes_the_release_window_only(tmp_path: Path) -> None:
    accept = plan(tmp_path, target_qps=200.0, duration="10s", loadgens="loadgens",
                  release="2", interval="10s")
    # slow only in second 4 (every tenth request): the release from 3.5 to 5.2 s covers
    # seconds 3-5, 60 of 600 requests slow -> its P99 is over the SLO
    outcomes = two_generators(steady(10, 100, 5, slow_second=4, slow_ms=80),
                              steady(10, 100, 5))
    got, code = table(accept, outcomes, release(3.5, 5.2))
    assert got[3].name == "p99 during release v2" and not got[3].passed
    assert got[3].figure == pytest.approx(80.0, rel=0.002)
    assert got[1].passed  # over 10 s intervals the slow second is under 1%
    assert code == rows.EXIT_ROW_FAILED
    got, code = table(accept, outcomes, release(6.0, 8.0))
    assert got[3].passed and code == rows.EXIT_OK


def test_a_failed_or_late_deploy_fails_the_release_row(tmp_path: Path) -> None:
    accept = plan(tmp_path, target_qps=200.0, duration="10s", loadgens="loadgens",
                  release="2")
    outcomes = two_generators(steady(10, 100, 5), steady(10, 100, 5))
    got, code = table(accept, outcomes, release(2.0, 6.0, code=2))
    assert not got[3].passed and "fab deploy exited 2" in got[3].detail
    assert code == rows.EXIT_ROW_FAILED
    got, _ = table(accept, outcomes, release(2.0, 12.5))
    assert not got[3].passed and "after the 10 s window" in got[3].detail
    for deploy_code in (rows.EXIT_INCONSISTENT, rows.EXIT_LOCKED):
        _, code = table(accept, outcomes, release(2.0, 6.0, code=deploy_code))
        assert code == deploy_code


def test_a_lost_generator_fails_the_run_with_its_partner_figures_kept(
        accept: AcceptPlan) -> None:
    outcomes = [outcome("tb1", [proc_result(steady(10, 100, 5))]),
                GeneratorOutcome("tb2", 100.0, LOST, error="host unreachable", ended_s=4.2)]
    got, code = table(accept, outcomes)
    assert code == rows.EXIT_LOADGEN
    assert not got[0].passed and "no figures from tb2" in got[0].detail
    assert got[1].passed and got[2].passed  # tb1's figures are still judged
    warnings = rows.generator_warnings(outcomes[1], None)
    assert warnings == ["tb2 was lost mid-run: host unreachable; its share (100 QPS) is "
                        "missing from the figures"]


def test_lag_makes_a_failure_inconclusive_never_a_pass(accept: AcceptPlan) -> None:
    # tb1 sent 30 of its 1000 requests up to 25 ms late with a worker free; one second's P99
    # is 60 ms: without that lag it might have been 35 ms, so the failure may be its doing
    slow = steady(10, 100, 5, slow_second=4, slow_ms=60)
    outcomes = two_generators(slow, steady(10, 100, 5), own_late=30)
    _, code = table(accept, outcomes)
    assert code == rows.EXIT_LOADGEN
    # 80 ms - 25 ms is still over the 50 ms SLO: the fleet failed, whatever the lag
    _, code = table(accept, two_generators(steady(10, 100, 5, slow_second=4, slow_ms=80),
                                           steady(10, 100, 5), own_late=30))
    assert code == rows.EXIT_ROW_FAILED
    merged = merge_fleet(outcomes)
    warning = rows.generator_warnings(outcomes[0], merged.generators["tb1"])
    assert len(warning) == 1 and warning[0].startswith(
        "tb1 could not hold its share: 30 of 1000 requests (3.0%) were sent > 10 ms after "
        "their time though a worker was free (worst 25 ms late)")
    # the same lag with every row passed: lateness only adds latency, so the pass stands
    _, code = table(accept, two_generators(steady(10, 100, 5), steady(10, 100, 5),
                                           own_late=30))
    assert code == rows.EXIT_OK


def test_late_sends_that_waited_for_a_worker_are_the_fleets_slowness(
        accept: AcceptPlan) -> None:
    # every worker was waiting for an answer: the fleet was slow, the generator kept up
    outcomes = two_generators(steady(10, 100, 5, slow_second=4, slow_ms=80),
                              steady(10, 100, 5), late=300)
    _, code = table(accept, outcomes)
    assert code == rows.EXIT_ROW_FAILED
    assert rows.generator_warnings(outcomes[0], merge_fleet(outcomes).generators["tb1"]) == []


def test_nothing_measured_is_exit_1(accept: AcceptPlan) -> None:
    outcomes = [GeneratorOutcome("tb1", 100.0, "failed", error="connect"),
                GeneratorOutcome("tb2", 100.0, "failed", error="connect")]
    merged = merge_fleet(outcomes)
    assert rows.exit_code([rows.error_rate_row(accept, merged)], outcomes, merged,
                          None) == rows.EXIT_NOTHING


def test_clock_offset_warning(accept: AcceptPlan) -> None:
    result = outcome("tb1", [proc_result(steady(2, 10, 5))])
    result.clock_offset_ms = 120.0
    merged = merge_fleet([result]).generators["tb1"]
    assert any("clock is at least +120 ms off" in w for w in
               rows.generator_warnings(result, merged))
