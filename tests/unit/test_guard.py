"""The guard's arithmetic and the unattended outputs (pure)."""

from __future__ import annotations

from pathlib import Path

from tfsdeploy.cli.unattended import read_samples, update_textfile
from tfsdeploy.guard import Breach, parse_metrics, window
from tfsdeploy.state import common_good_release, parse_json_stream


def _bucket(le: str, count: int) -> str:
    return (':tensorflow:serving:request_latency_bucket{model_name="m",API="Predict",'
            f'entrypoint="GRPC",le="{le}"}} {count}')


def _scrape(ok: int, bad: int, fast: int) -> str:
    return "\n".join([
        "# TYPE :tensorflow:serving:request_count counter",
        f':tensorflow:serving:request_count{{model_name="m",status="OK"}} {ok}',
        f':tensorflow:serving:request_count{{model_name="m",status="INVALID_ARGUMENT"}} {bad}',
        ':tensorflow:serving:request_count{model_name="other",status="OK"} 999',
        "# TYPE :tensorflow:serving:request_latency histogram",
        _bucket("1000", fast), _bucket("50000", ok), _bucket("+Inf", ok)]) + "\n"


def test_window_error_rate_and_p99() -> None:
    before = parse_metrics(_scrape(100, 0, 100), "m")
    after = parse_metrics(_scrape(200, 10, 195), "m")
    w = window(before, after)
    assert (w.total, w.errors) == (110, 10)
    assert abs(w.error_rate - 10 / 110) < 1e-9
    assert w.p99_ms == 50.0  # 5 of 100 new successes were slower than 1 ms


def test_counter_reset_after_a_switch_is_not_negative() -> None:
    w = window(parse_metrics(_scrape(500, 5, 500), "m"), parse_metrics(_scrape(10, 0, 10), "m"))
    assert w.total == 10 and w.errors == 0


def test_breach_must_last_before_action() -> None:
    breach = Breach()
    bad = window(parse_metrics(_scrape(0, 0, 0), "m"), parse_metrics(_scrape(50, 50, 50), "m"))
    good = window(parse_metrics(_scrape(0, 0, 0), "m"), parse_metrics(_scrape(50, 0, 50), "m"))
    assert "error rate 50.00% > 1.00%" in str(
        breach.observe("h", bad, now=0, max_error_rate=0.01, slo_p99_ms=100))
    assert not breach.sustained("h", now=20, for_s=30)
    breach.observe("h", bad, now=20, max_error_rate=0.01, slo_p99_ms=100)
    assert breach.sustained("h", now=30, for_s=30)
    assert breach.observe("h", good, now=31, max_error_rate=0.01, slo_p99_ms=100) is None
    assert not breach.sustained("h", now=100, for_s=30)


def test_few_requests_never_breach() -> None:
    tiny = window(parse_metrics(_scrape(0, 0, 0), "m"), parse_metrics(_scrape(1, 5, 1), "m"))
    assert Breach().observe("h", tiny, now=0, max_error_rate=0.01, slo_p99_ms=1) is None


def test_latency_breach() -> None:
    slow = window(parse_metrics(_scrape(0, 0, 0), "m"), parse_metrics(_scrape(100, 0, 10), "m"))
    assert Breach().observe("h", slow, now=0, max_error_rate=0.01, slo_p99_ms=20) == \
        "P99 50 ms > SLO 20 ms"


def test_textfile_keeps_other_runs_and_last_success(tmp_path: Path) -> None:
    path = str(tmp_path / "tfsdeploy.prom")
    update_textfile(path, model="m", command="deploy", exit_code=0, seconds=12.5,
                    release="r1", version=1)
    update_textfile(path, model="m", command="rollback", exit_code=0, seconds=3,
                    release="r0", version=1)
    first = read_samples(path)
    success = first['tfsdeploy_last_success_timestamp_seconds{command="deploy",model="m"}']
    update_textfile(path, model="m", command="deploy", exit_code=2, seconds=40,
                    release="r2", version=2)
    samples = read_samples(path)
    text = Path(path).read_text()
    assert samples['tfsdeploy_last_run_exit_code{command="deploy",model="m"}'] == 2
    assert samples['tfsdeploy_last_success_timestamp_seconds{command="deploy",model="m"}'] == \
        success
    assert 'tfsdeploy_release_info{command="deploy",model="m",release="r2",version="2"} 1' in text
    assert 'release="r1"' not in text
    assert samples['tfsdeploy_last_run_exit_code{command="rollback",model="m"}'] == 0
    assert text.count("# TYPE tfsdeploy_last_run_exit_code gauge") == 1


def test_common_good_release_and_json_stream() -> None:
    stream = '{"id": "r1", "status": "serving"}\n{"id": "r2", "status": "serving"}\n{"id": "r3"'
    assert [m["id"] for m in parse_json_stream(stream)] == ["r1", "r2"]
    histories = {
        "a": [{"id": "r1", "status": "serving"}, {"id": "r2", "status": "serving"},
              {"id": "r3", "status": "serving"}],
        "b": [{"id": "r1", "status": "serving"}, {"id": "r2", "status": "failed"},
              {"id": "r3", "status": "serving"}],
    }
    assert common_good_release(histories, {"a": "r3", "b": "r3"}) == "r1"
    assert common_good_release(histories, {"a": "r1", "b": "r1"}) == "r3"
    # a rollback to r1 interrupted after host a: running it again finishes it
    histories["a"][2]["status"] = "rolled_back"
    assert common_good_release(histories, {"a": "r1", "b": "r3"}) == "r1"
