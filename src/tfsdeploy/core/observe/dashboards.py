"""Grafana dashboards of the fleet and of each model, built with grafana-foundation-sdk
(Grafana Labs' own builders, generated from Grafana's dashboard schema and released with it;
grafanalib, the older choice, has had no release since 2024). Import this module only where
a dashboard is written: the SDK is large, and `fab` starts without it.

The panels read the recording rules of ``observe`` (``model:tfserving_*``) and the scrape's
target labels; a model's releases are annotations: a release shows where the first
scrape of its serving processes appears.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.monitoring import Monitoring
from tfsdeploy.core.observe.prometheus import QUEUING_LATENCY, job_name, seconds

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend)


def _series(title: str, unit: str, *queries: prometheus.Dataquery, width: int = 12
            ) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).height(8) \
        .span(width)
    for query in queries:
        panel = panel.with_target(query)
    return panel


def _base(title: str, uid: str, tags: list[str]) -> dashboard.Dashboard:
    return (dashboard.Dashboard(title).uid(uid).tags(tags).refresh("30s").time("now-6h", "now")
            .timezone("utc").with_variable(
                dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))


def fleet_dashboard(models: Sequence[Model], monitoring: Monitoring) -> dict[str, Any]:
    """One row per model: request rate, server-error ratio, P99 against the SLO."""
    board = _base("TFServing fleet", "tfsdeploy-fleet", ["tfsdeploy", "tfserving"])
    board = board.with_panel(_series(
        "Requests/s by model", "reqps",
        _query("model:tfserving_requests:rate", "{{model}}"), width=8))
    board = board.with_panel(_series(
        "Server errors by model", "percentunit",
        _query("model:tfserving_server_errors:ratio_rate", "{{model}}"), width=8))
    board = board.with_panel(_series(
        "P99 by model", "s", _query("model:tfserving_request_latency_seconds:p99", "{{model}}"),
        width=8))
    board = board.with_panel(
        stat.Panel().title("Serving processes up").datasource(DATASOURCE).height(4).span(24)
        .with_target(_query('sum by (model) (up{job=~"tfserving-.*"})', "{{model}}")))
    for model in models:
        board = board.with_row(dashboard.Row(f"{model.name} (SLO {model.latency_slo_ms:g} ms)"))
        board = board.with_panel(_series(
            f"{model.name}: P99 and SLO", "s",
            _query(f'model:tfserving_request_latency_seconds:p99{{model="{model.name}"}}', "P99"),
            _query(f"vector({model.latency_slo_ms / 1000:g})", "SLO"), width=24))
    return _json(board)


def model_dashboard(model: Model, monitoring: Monitoring) -> dict[str, Any]:
    """One model: traffic, errors, latency per release, batching queue, load and warmup,
    serving processes; its releases as annotations."""
    m = model.name
    sel = f'job="{job_name(m)}"'
    w = seconds(monitoring.rate_window_s)
    board = _base(f"TFServing {m}", f"tfsdeploy-{m}"[:40], ["tfsdeploy", "tfserving", m])
    board = board.annotation(
        dashboard.AnnotationQuery().name("Releases").datasource(DATASOURCE).enable(True)
        .icon_color("blue")
        # a release's processes appear in the scrape when it starts serving
        .expr(f"count by (release, version) (up{{{sel}}}) unless "
              f"count by (release, version) (up{{{sel}}} offset {w})"))
    board = board.with_panel(_series(
        "Requests/s", "reqps", _query(f'model:tfserving_requests:rate{{model="{m}"}}', "all"),
        _query(f"sum by (release, version) (rate(:tensorflow:serving:request_count{{{sel}}}"
               f"[{w}]))", "{{release}} v{{version}}")))
    board = board.with_panel(_series(
        "Server-error ratio", "percentunit",
        _query(f'model:tfserving_server_errors:ratio_rate{{model="{m}"}}', "server errors")))
    board = board.with_panel(_series(
        "Latency by release", "s",
        _query(f'model_release:tfserving_request_latency_seconds:p99{{model="{m}"}}',
               "P99 {{release}} v{{version}}"),
        _query(f'model_release:tfserving_request_latency_seconds:p50{{model="{m}"}}',
               "P50 {{release}} v{{version}}"),
        _query(f"vector({model.latency_slo_ms / 1000:g})", "SLO")))
    board = board.with_panel(_series(
        "SLO bad-request ratio (burn windows)", "percentunit",
        _query(f'model:tfsdeploy_slo_bad_requests:ratio_rate{{model="{m}"}}', "{{window}}"),
        _query(f"vector({monitoring.error_budget:g})", "error budget")))
    board = board.with_panel(_series(
        "Batching queue P99", "s",
        _query(f"histogram_quantile(0.99, sum by (host, slot, le) (rate({QUEUING_LATENCY}"
               f"_bucket{{{sel}}}[{w}]))) / 1e6", "{{host}} {{slot}}")))
    board = board.with_panel(_series(
        "Serving processes", "short",
        _query(f"up{{{sel}}}", "{{host}}/{{instance}}/{{slot}} {{release}} v{{version}}")))
    return _json(board)


def _json(board: dashboard.Dashboard) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return data
