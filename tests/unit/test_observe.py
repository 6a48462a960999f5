"""`fab observe` without a fleet: the rendered Prometheus configuration and rules pass the real
`promtool check config` / `check rules`, and every alert is run through `promtool test rules`
on series shaped as TFServing and the toolkit's textfile export them: it fires when it should
and stays silent when it should not. Plus the pure pieces: the SLO's bucket, the targets'
labels, the dashboards, the inventory's ``monitoring`` checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.helpers import model
from tfsdeploy.cli.observe import write_observability
from tfsdeploy.core.errors import ConfigError
from tfsdeploy.core.inventory.catalog import Batching
from tfsdeploy.core.inventory.fleet import Gpu, Group, Host
from tfsdeploy.core.inventory.load import Inventory, build_inventory
from tfsdeploy.core.inventory.monitoring import Monitoring
from tfsdeploy.core.observe.prometheus import (
    ServingProcess,
    latency_limits,
    le_text,
    slo_bucket,
    target_alerts,
    target_groups,
)
from tfsdeploy.core.target import Target
from tfsdeploy.run.after import StepEvent
from tfsdeploy.run.targets import merged_groups

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
MONITORING = Monitoring(node_exporters=("deploy-1:9100",),
                        cron_periods={"guard": 300, "rollback": 86400})


def fleet(monitoring: Monitoring = MONITORING, **model_changes: Any) -> Inventory:
    hosts = [Host("h1", "10.0.0.1", gpus=[Gpu(0, 16384)]),
             Host("h2", "10.0.0.2", gpus=[Gpu(0, 16384)], vars={"monitoring_path": "/m"})]
    return build_inventory("inv.py", hosts=hosts, groups={"g": Group(["h1", "h2"])},
                           defaults={}, models=[model(**model_changes)], monitoring=monitoring)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("observe")
    inv = fleet()
    write_observability(inv, list(inv.models.values()), out)
    groups = target_groups(inv.model("m"), inv.hosts,
                           [ServingProcess("h1", 0, "blue", "r1-v1", 1)])
    # observe made the targets file, empty, for Prometheus to watch from its start
    assert json.loads((out / "prometheus" / "targets" / "m.json").read_text()) == []
    (out / "prometheus" / "targets" / "m.json").write_text(json.dumps(groups))
    return out


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def test_promtool_accepts_the_config_and_its_rules(rendered: Path) -> None:
    result = promtool("check", "config", str(rendered / "prometheus" / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr  # the targets file is read too
    rules = promtool("check", "rules", str(rendered / "prometheus" / "rules" / "m.yml"))
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_the_config_scrapes_each_model_and_only_the_toolkits_textfile_metrics(
        rendered: Path) -> None:
    config = yaml.safe_load((rendered / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["tfserving-m"]["metrics_path"] == "/monitoring/prometheus/metrics"
    assert jobs["tfserving-m"]["file_sd_configs"][0]["files"] == ["targets/m.json"]
    assert jobs["tfsdeploy-textfile"]["static_configs"] == [{"targets": ["deploy-1:9100"]}]
    assert jobs["tfsdeploy-textfile"]["metric_relabel_configs"][0]["regex"] == "tfsdeploy_.*"


def test_each_model_has_its_target_alerts(rendered: Path) -> None:
    rules = yaml.safe_load((rendered / "prometheus" / "rules" / "m.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts["TFServingTargetDown"]["expr"] == 'up{job="tfserving-m"} == 0'
    assert alerts["TFServingTargetsAbsent"]["expr"] == 'absent(up{job="tfserving-m"})'
    assert alerts["TFServingTargetDown"]["for"] == "300s"  # monitoring.alert_for_s


def test_a_short_alert_for_still_outlasts_a_retired_process_leaving_the_scrape() -> None:
    """A roll stops the old release's processes before the targets drop them: with a short
    ``alert_for_s`` the target alerts wait as long as that takes (5 s + 3 scrapes)."""
    short = Monitoring(scrape_interval_s=6, rate_window_s=12, alert_for_s=6)
    alerts = {a["alert"]: a for a in target_alerts(model(name="m"), short)}
    assert alerts["TFServingTargetDown"]["for"] == "23s"
    assert alerts["TFServingTargetsAbsent"]["for"] == "23s"
    slow = Monitoring(scrape_interval_s=60, rate_window_s=240, alert_for_s=120)
    assert {a["for"] for a in target_alerts(model(name="m"), slow)} == {"185s"}


def test_targets_carry_model_host_instance_slot_release_and_version() -> None:
    inv = fleet()
    groups = target_groups(inv.model("m"), inv.hosts, [
        ServingProcess("h2", 0, "green", "r2-v2", 2), ServingProcess("h1", 0, "blue", "r1-v1", 1),
        ServingProcess("gone", 0, "blue", "r0", 1)])  # no longer in the inventory: left out
    assert groups == [
        {"targets": ["10.0.0.1:8511"], "labels": {
            "model": "m", "host": "h1", "instance": "0", "slot": "blue", "release": "r1-v1",
            "version": "1"}},
        {"targets": ["10.0.0.2:8521"], "labels": {
            "model": "m", "host": "h2", "instance": "0", "slot": "green", "release": "r2-v2",
            "version": "2", "__metrics_path__": "/m"}}]


def test_a_host_that_could_not_be_read_keeps_its_previous_targets() -> None:
    inv = fleet()
    target = Target(inv, inv.model("m"), inv.hosts)
    old = target_groups(inv.model("m"), inv.hosts, [ServingProcess("h1", 0, "blue", "a", 1),
                                                    ServingProcess("h2", 0, "blue", "a", 1)])
    now = merged_groups(target, [ServingProcess("h1", 0, "green", "b", 2)], ["h2"], old)
    assert [(g["labels"]["host"], g["labels"]["release"]) for g in now] == \
        [("h1", "b"), ("h2", "a")]


def test_the_slo_is_judged_at_the_bucket_limit_tfserving_prints_at_or_below_it() -> None:
    limits = latency_limits()
    assert len(limits) == 33 and limits[0] == 10.0
    assert le_text(limits[14]) == "37481.3" and le_text(limits[15]) == "67466.4"
    assert slo_bucket(60).micros == limits[14]
    assert slo_bucket(67.46).micros == limits[14]
    assert slo_bucket(0.001).micros == 10.0  # below every limit: the first
    # a Prometheus that normalises `le` (3.x) stores "10" as "10.0": both match
    assert slo_bucket(0.01).le_pattern == "10|10\\\\.0"


def test_the_limits_match_the_emulators_page() -> None:
    from testbed.emulator.tfserving_emulator.metrics import Metrics

    metrics = Metrics()
    metrics.request_latency.observe(1.0, "m", "Predict", "GRPC")
    page = [line for line in metrics.page().splitlines()
            if line.startswith(":tensorflow:serving:request_latency_bucket")]
    shown = [line.split('le="')[1].split('"')[0] for line in page]
    assert shown == [le_text(limit) for limit in latency_limits()] + ["+Inf"]


def test_the_dashboards_are_grafana_json_with_releases_as_annotations(rendered: Path) -> None:
    board = json.loads((rendered / "grafana" / "m.json").read_text())
    assert board["uid"] == "tfsdeploy-m" and board["title"] == "TFServing m"
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert 'model_release:tfserving_request_latency_seconds:p99{model="m"}' in exprs
    (releases,) = [a for a in board["annotations"]["list"] if a["name"] == "Releases"]
    assert "count by (release, version)" in releases["expr"]
    fleet_board = json.loads((rendered / "grafana" / "fleet.json").read_text())
    assert any(p.get("title") == "m (SLO 60 ms)" for p in fleet_board["panels"])


def test_monitoring_is_checked_where_it_is_set() -> None:
    with pytest.raises(ConfigError) as caught:
        fleet(Monitoring(hosts="nowhere", scrape_interval_s=30, rate_window_s=30))
    text = str(caught.value)
    assert "monitoring.rate_window_s" in text and "two scrape intervals" in text
    with pytest.raises(ConfigError) as caught:
        fleet(Monitoring(hosts="nowhere"))
    assert "monitoring.hosts 'nowhere' matches no host" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        fleet(Monitoring(cron_periods={"gaurd": 60}))  # type: ignore[dict-item]
    assert "monitoring.cron_periods" in str(caught.value)


# -- promtool test rules: every alert, firing and silent ---------------------------------------

PROCESS = 'job="tfserving-m",model="m",host="h1",instance="0",slot="blue",release="r1",' \
          'version="1"'
PROCESS_LABELS = {"job": "tfserving-m", "model": "m", "host": "h1", "instance": "0",
                  "slot": "blue", "release": "r1", "version": "1"}
REQUEST = f'{PROCESS},model_name="m",API="Predict",entrypoint="GRPC"'


def latency(per_step: int, bucket_index: int) -> list[dict[str, str]]:
    """request_latency series: ``per_step`` requests every step, all in one bucket."""
    series = []
    for i, limit in enumerate([*latency_limits(), None]):
        le = "+Inf" if limit is None else le_text(limit)
        step = per_step if i >= bucket_index else 0
        series.append({"series": f':tensorflow:serving:request_latency_bucket{{{REQUEST},'
                                 f'le="{le}"}}', "values": f"0+{step}x300"})
    series.append({"series": f":tensorflow:serving:request_latency_count{{{REQUEST}}}",
                   "values": f"0+{per_step}x300"})
    return series


def requests(ok: int, internal: int) -> list[dict[str, str]]:
    return [{"series": f':tensorflow:serving:request_count{{{PROCESS},model_name="m",'
                       f'status="OK"}}', "values": f"0+{ok}x300"},
            {"series": f':tensorflow:serving:request_count{{{PROCESS},model_name="m",'
                       f'status="INTERNAL"}}', "values": f"0+{internal}x300"}]


def case(series: list[dict[str, str]], checks: list[tuple[str, str, list[dict[str, str]]]]
         ) -> dict[str, Any]:
    """A promtool test: input series at a 15 s interval, and (eval time, alert, expected
    labels of each firing alert; [] = silent)."""
    return {"interval": "15s", "input_series": series, "alert_rule_test": [
        {"eval_time": at, "alertname": name,
         "exp_alerts": [{"exp_labels": labels} for labels in expected]}
        for at, name, expected in checks]}


SLOW = slo_bucket(60)
FAST_BUCKET = 5  # 10 x 1.8^5 us = 189 us
SLOW_BUCKET = 16  # 10 x 1.8^16 us = 121 ms, twice the 60 ms SLO
P99 = {"severity": "page", "model": "m", "window": "60s"}
BURN_1H = {"severity": "page", "model": "m", "window": "1h"}
BURN_6H = {"severity": "ticket", "model": "m", "window": "6h"}
TEXTFILE = 'job="tfsdeploy-textfile",instance="deploy-1:9100",model="m"'


def textfile(command: str, metric: str, values: str) -> dict[str, str]:
    return {"series": f'tfsdeploy_{metric}{{{TEXTFILE},command="{command}"}}', "values": values}


def unit_tests() -> list[dict[str, Any]]:
    queue = ":tensorflow:serving:batching_session:queuing_latency_bucket"
    load = ":tensorflow:cc:saved_model:load_attempt_count"
    warmup = ":tensorflow:serving:model_warmup_latency"
    return [
        # a release slower than the SLO: P99 above it, pending at 4 min, firing after its 5 min
        case(latency(10, SLOW_BUCKET) + requests(10, 0), [
            ("4m", "TFServingP99AboveSLO", []),
            ("10m", "TFServingP99AboveSLO", [P99]),
            # every request slow: the SLO's budget burns at 100x
            ("10m", "TFServingSLOBurnRate1h", [BURN_1H]),
            ("10m", "TFServingModelLoadFailed", [])]),
        # a serving process stops answering its scrape at 5 min (its host lost): pending,
        # then firing after alert_for_s (5 min); one down for two minutes (a roll's step
        # between a process stopping and the targets following it) stays silent
        case([{"series": f"up{{{PROCESS}}}", "values": "1x20 0x60"},
              {"series": f'up{{{PROCESS.replace("h1", "h2")}}}', "values": "1x20 0x8 1x60"}], [
            ("4m", "TFServingTargetDown", []),
            ("8m", "TFServingTargetDown", []),
            ("12m", "TFServingTargetDown", [{**PROCESS_LABELS, "severity": "page"}]),
            ("12m", "TFServingTargetsAbsent", [])]),
        # every process answers: silent
        case([{"series": f"up{{{PROCESS}}}", "values": "1x200"}], [
            ("30m", "TFServingTargetDown", []), ("30m", "TFServingTargetsAbsent", [])]),
        # the model's targets vanish at 2.5 min (an empty targets file): absent once the
        # 5 min lookback passed (7.5 min), firing 5 min later
        case([{"series": f"up{{{PROCESS}}}", "values": "1x10"}], [
            ("2m", "TFServingTargetsAbsent", []),
            ("10m", "TFServingTargetsAbsent", []),
            ("20m", "TFServingTargetsAbsent", [{"job": "tfserving-m", "model": "m",
                                                "severity": "page"}]),
            ("20m", "TFServingTargetDown", [])]),
        # only another model is scraped: this one's targets were never there
        case([{"series": 'up{job="tfserving-other",model="other",host="h1"}',
               "values": "1x100"}], [
            ("6m", "TFServingTargetsAbsent", [{"job": "tfserving-m", "model": "m",
                                               "severity": "page"}])]),
        # a good release: fast, no errors: nothing fires
        case(latency(10, FAST_BUCKET) + requests(10, 0), [
            ("30m", "TFServingP99AboveSLO", []),
            ("30m", "TFServingSLOBurnRate1h", []),
            ("30m", "TFServingSLOBurnRate6h", [])]),
        # 20% server errors, fast successes: the fast burn (14.4 x 1%) fires
        case(latency(8, FAST_BUCKET) + requests(8, 2), [
            ("1m", "TFServingSLOBurnRate1h", []),  # not for its 2 minutes yet
            ("10m", "TFServingSLOBurnRate1h", [BURN_1H])]),
        # 10% server errors: under the fast burn, over the slow one (6 x 1%) after 15 min
        case(latency(9, FAST_BUCKET) + requests(9, 1), [
            ("40m", "TFServingSLOBurnRate1h", []),
            ("10m", "TFServingSLOBurnRate6h", []),
            ("40m", "TFServingSLOBurnRate6h", [BURN_6H])]),
        # client errors only (INVALID_ARGUMENT): never the release's failure
        case([
            *latency(5, FAST_BUCKET),
            {"series": f':tensorflow:serving:request_count{{{PROCESS},model_name="m",'
                       f'status="INVALID_ARGUMENT"}}', "values": "0+50x500"},
            {"series": f':tensorflow:serving:request_count{{{PROCESS},model_name="m",'
                       f'status="OK"}}', "values": "0+5x500"}], [
            ("30m", "TFServingSLOBurnRate1h", []), ("30m", "TFServingSLOBurnRate6h", [])]),
        # a load that failed on a process that appeared at 5 min; quiet again 10 min later
        case([{"series": f'{load}{{{PROCESS},model_path="/models/m/1",status="fail"}}',
               "values": "_x20 1+0x100"},
              {"series": f'{load}{{{PROCESS},model_path="/models/m/2",status="success"}}',
               "values": "1+0x100"}], [
            ("4m", "TFServingModelLoadFailed", []),
            ("6m", "TFServingModelLoadFailed", [{
                **PROCESS_LABELS, "severity": "page", "model_path": "/models/m/1",
                "status": "fail"}]),
            ("20m", "TFServingModelLoadFailed", [])]),
        # warmup: 400 s on one process (over 300 s), 2 s on another
        case([{"series": f'{warmup}_sum{{{PROCESS},model_path="/m/1",status="OK"}}',
               "values": "400000000+0x10"},
              {"series": f'{warmup}_count{{{PROCESS},model_path="/m/1",status="OK"}}',
               "values": "1+0x10"},
              {"series": f'{warmup}_sum{{{PROCESS.replace("h1", "h2")},model_path="/m/1",'
                         f'status="OK"}}', "values": "2000000+0x10"},
              {"series": f'{warmup}_count{{{PROCESS.replace("h1", "h2")},model_path="/m/1",'
                         f'status="OK"}}', "values": "1+0x10"}], [
            ("1m", "TFServingWarmupSlow", [{**PROCESS_LABELS, "severity": "ticket",
                                            "model_path": "/m/1", "status": "OK"}])]),
        # batching queue: 99 ms waits on h1 (over half the 60 ms SLO), 1 ms on h2
        case([{"series": f'{queue}{{{PROCESS},thread_pool_name="",le="20000"}}',
               "values": "0+0x100"},
              {"series": f'{queue}{{{PROCESS},thread_pool_name="",le="100000"}}',
               "values": "0+10x100"},
              {"series": f'{queue}{{{PROCESS},thread_pool_name="",le="+Inf"}}',
               "values": "0+10x100"},
              {"series": f'{queue}{{{PROCESS.replace("h1", "h2")},thread_pool_name="",'
                         f'le="20000"}}', "values": "0+10x100"},
              {"series": f'{queue}{{{PROCESS.replace("h1", "h2")},thread_pool_name="",'
                         f'le="+Inf"}}', "values": "0+10x100"}], [
            ("3m", "TFServingBatchQueueSlow", []),
            ("10m", "TFServingBatchQueueSlow", [{
                "model": "m", "host": "h1", "instance": "0", "slot": "blue", "release": "r1",
                "severity": "ticket"}])]),
        # `fab deploy --pause` (exit 6) at t=0, never promoted: fires after an hour
        case([textfile("deploy", "last_run_exit_code", "6+0x500"),
              textfile("deploy", "last_run_timestamp_seconds", "0+0x500")], [
            ("50m", "TfsdeployCanaryPausedTooLong", []),
            ("70m", "TfsdeployCanaryPausedTooLong", [{"model": "m", "severity": "ticket"}])]),
        # ... a guard from cron watched it afterwards (exit 0): still held, still fires
        case([textfile("deploy", "last_run_exit_code", "6+0x500"),
              textfile("deploy", "last_run_timestamp_seconds", "0+0x500"),
              textfile("guard", "last_run_exit_code", "0+0x500"),
              textfile("guard", "last_run_timestamp_seconds", "300+0x500")], [
            ("70m", "TfsdeployCanaryPausedTooLong", [{"model": "m", "severity": "ticket"}])]),
        # ... a guard aborted it (exit 2) at t=300 s: silent
        case([textfile("deploy", "last_run_exit_code", "6+0x500"),
              textfile("deploy", "last_run_timestamp_seconds", "0+0x500"),
              textfile("guard", "last_run_exit_code", "2+0x500"),
              textfile("guard", "last_run_timestamp_seconds", "300+0x500")], [
            ("70m", "TfsdeployCanaryPausedTooLong", [])]),
        # ... promoted at t=100 s: silent
        case([textfile("deploy", "last_run_exit_code", "6+0x500"),
              textfile("deploy", "last_run_timestamp_seconds", "0+0x500"),
              textfile("promote", "last_run_timestamp_seconds", "100+0x500")], [
            ("70m", "TfsdeployCanaryPausedTooLong", [])]),
        # a guard from cron every 5 min whose last success (60 s runs) was at t=0
        case([textfile("guard", "last_success_timestamp_seconds", "0+0x100"),
              textfile("guard", "last_run_timestamp_seconds", "0+15x100"),
              textfile("guard", "last_run_duration_seconds", "60+0x100")], [
            ("5m", "TfsdeployCronGuardNotSucceeding", []),
            ("7m", "TfsdeployCronGuardNotSucceeding", [
                {"model": "m", "command": "guard", "severity": "page"}])]),
        # ... succeeding at every run: silent; a rollback that never succeeded: fires
        case([textfile("guard", "last_success_timestamp_seconds", "0+15x100"),
              textfile("guard", "last_run_duration_seconds", "60+0x100"),
              textfile("rollback", "last_run_timestamp_seconds", "0+0x100")], [
            ("20m", "TfsdeployCronGuardNotSucceeding", []),
            ("1m", "TfsdeployCronRollbackNotSucceeding", [
                {"model": "m", "command": "rollback", "severity": "page"}])]),
    ]


def test_every_alert_fires_when_it_should_and_not_otherwise(rendered: Path,
                                                           tmp_path: Path) -> None:
    rules = yaml.safe_load((rendered / "prometheus" / "rules" / "m.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = unit_tests()
    tested = {c["alertname"] for t in tests for c in t["alert_rule_test"]}
    assert tested == alerts  # every alert the file holds is tested
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert fired == alerts  # ... and seen firing
    for group in rules["groups"]:  # the summaries are checked by `check rules`; here the
        for rule in group["rules"]:  # expressions and their `for`
            rule.pop("annotations", None)
    (tmp_path / "m.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["m.yml"], "evaluation_interval": "15s", "tests": tests},
        sort_keys=False))
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_batching_there_is_no_queue_alert(tmp_path: Path) -> None:
    inv = fleet(batching=Batching(enabled=False))
    write_observability(inv, list(inv.models.values()), tmp_path)
    rules = (tmp_path / "prometheus" / "rules" / "m.yml").read_text()
    assert "TFServingBatchQueueSlow" not in rules and "TFServingP99AboveSLO" in rules


def test_without_node_exporters_no_textfile_job_or_alert(tmp_path: Path) -> None:
    inv = fleet(Monitoring())
    write_observability(inv, list(inv.models.values()), tmp_path)
    assert "tfsdeploy-textfile" not in (tmp_path / "prometheus" / "prometheus.yml").read_text()
    assert "Tfsdeploy" not in (tmp_path / "prometheus" / "rules" / "m.yml").read_text()


def test_the_p99_for_and_windows_follow_the_inventory(tmp_path: Path) -> None:
    inv = fleet(replace(MONITORING, scrape_interval_s=1, rate_window_s=5, p99_for_s=3))
    write_observability(inv, list(inv.models.values()), tmp_path)
    rules = yaml.safe_load((tmp_path / "prometheus" / "rules" / "m.yml").read_text())
    (p99,) = [r for g in rules["groups"] for r in g["rules"]
              if r.get("alert") == "TFServingP99AboveSLO"]
    assert p99["for"] == "3s" and 'window="5s"' in p99["expr"] and "> 0.06" in p99["expr"]


# -- the targets a run rewrites -----------------------------------------------------------------

def test_a_run_rewrites_the_targets_as_its_processes_change_and_at_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    from tfsdeploy.run import targets as observe

    inv = fleet(Monitoring(local_targets_dir=str(tmp_path / "targets")))
    target = Target(inv, inv.model("m"), inv.hosts)
    serving = [ServingProcess("h1", 0, "blue", "r1", 1), ServingProcess("h2", 0, "blue", "r1", 1)]
    surveys: list[int] = []

    def survey(_target: Target, _session: Any = None
               ) -> tuple[list[ServingProcess], list[str]]:
        surveys.append(len(serving))
        return list(serving), []

    monkeypatch.setattr(observe, "running_processes", survey)
    written = tmp_path / "targets" / "m.json"

    def versions() -> set[tuple[str, str, str]]:
        return {(g["labels"]["host"], g["labels"]["slot"], g["labels"]["version"])
                for g in json.loads(written.read_text())}

    def step(task: str, status: str, *, processes: bool) -> StepEvent:
        return StepEvent("h1", "roll", task, status, 0.1, "", processes_changed=processes)

    session = object()  # the run's session, handed to the reads (the survey is faked here)
    retargeter = observe.Retargeter(target)
    serving.append(ServingProcess("h1", 0, "green", "r2", 2))
    retargeter.on_step(step("upload_release", "ok", processes=False), session)  # no write
    time.sleep(0.3)
    assert not written.exists()
    # a new process AVAILABLE (the step's typed event says so, whatever the step is called)
    retargeter.on_step(step("any_step", "ok", processes=True), session)
    deadline = time.monotonic() + 10
    while not written.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ("h1", "green", "2") in versions() and ("h1", "blue", "1") in versions()
    del serving[0]  # h1's old slot retired
    retargeter.on_step(step("retire_old", "failed", processes=True), session)  # no write
    retargeter.final(None, session)  # the run ended (an after-pass): the final write
    assert versions() == {("h1", "green", "2"), ("h2", "blue", "1")}

    def broken(_target: Target, _session: Any = None
               ) -> tuple[list[ServingProcess], list[str]]:
        raise OSError("no route to host")

    monkeypatch.setattr(observe, "running_processes", broken)
    observe.after_run(target)  # never raises: one line on stderr
    assert "the Prometheus targets of m could not be rewritten: OSError: no route to host" \
        in capsys.readouterr().err


def test_without_a_place_for_the_targets_a_run_reads_no_host(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    from tfsdeploy.run import targets as observe

    def survey(_target: Target, _session: Any = None) -> Any:
        raise AssertionError("read the hosts")

    monkeypatch.setattr(observe, "running_processes", survey)
    inv = fleet(Monitoring())
    target = Target(inv, inv.model("m"), inv.hosts)
    assert not observe.retargets(target)
    observe.after_run(target)


def test_fab_observe_writes_the_files_and_refuses_an_unknown_model(tmp_path: Path) -> None:
    from tests.unit.test_cli import _fab

    out = tmp_path / "out"
    done = _fab("observe", "--inventory", "inventory/example_production.py", "--out", str(out),
                tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "grafana/fleet.json", "grafana/ranker.json", "grafana/resnet50.json",
        "prometheus/prometheus.yml", "prometheus/rules/ranker.yml",
        "prometheus/rules/resnet50.yml"]  # the targets live on the monitoring hosts
    config = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())
    assert config["scrape_configs"][0]["file_sd_configs"][0]["files"] == \
        ["/etc/prometheus/tfsdeploy/resnet50.json"]
    refused = _fab("observe", "--model", "nope", "--out", str(tmp_path / "x"),
                   "--inventory", "inventory/example_production.py", tmp_path=tmp_path)
    assert refused.returncode == 1 and "model 'nope' is not in the catalog" in refused.stderr
    assert not (tmp_path / "x").exists()  # nothing written
