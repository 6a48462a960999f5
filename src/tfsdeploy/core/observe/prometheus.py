"""`fab observe`, pure: Prometheus' scrape configuration, recording rules and alerts, and the
file_sd target groups of a model's serving processes, from the inventory and the catalog.

Facts of TensorFlow Serving these rules rely on (tensorflow/serving, read at its 2026-07 head):

- util/prometheus_exporter.cc: a metric's name has every character outside ``[a-zA-Z0-9_]``
  turned into ``:`` (``/tensorflow/serving/request_count`` -> ``:tensorflow:serving:
  request_count``); label names have every character outside ``[a-zA-Z0-9]`` turned into
  ``_``; histograms are ``_bucket{le}``, ``_sum`` and ``_count``, the bucket limits printed by
  ``absl::StrCat(double)`` (six significant digits, ``%g``-style) and the last one ``+Inf``.
  The page is served at ``/monitoring/prometheus/metrics`` on the REST port.
- servables/tensorflow/util.cc: ``request_count{model_name, status}`` (status is the canonical
  code name, ``OK``, ``INTERNAL``, ...); ``request_latency{model_name, API, entrypoint}``, in
  microseconds over ``Buckets::Exponential(10, 1.8, 33)``; model_servers/
  prediction_service_impl.cc and http_server.cc record a request's latency only when it
  succeeded, and count every request.
- batching/batching_session.cc: ``batching_session:queuing_latency{thread_pool_name}``,
  microseconds over ``Buckets::Exponential(100, 1.2, 52)``; no model label.
- servables/tensorflow/saved_model_warmup_util.cc: ``model_warmup_latency{model_path,
  status}`` (status: ``absl::Status::ToString``, ``OK`` on success), microseconds, one sample
  per warmup of a version.
- tensorflow/cc/saved_model/loader.cc: ``:tensorflow:cc:saved_model:load_attempt_count
  {model_path, status}``, status ``success`` or ``fail``.

None of them says which model version (or which of the toolkit's releases) served: the
target labels below (model, host, instance, slot, release, version) add it at scrape time,
and since one TFServing process here serves one model, ``model`` also names the model of the
metrics that have none (batching, load, warmup). A metric label a target label shadows is
kept by Prometheus as ``exported_<name>`` (``request_example_counts{model}``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import model_ports
from tfsdeploy.core.inventory.monitoring import Monitoring
from tfsdeploy.core.observe.guard import CLIENT_ERRORS

DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"
REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY = ":tensorflow:serving:request_latency"
QUEUING_LATENCY = ":tensorflow:serving:batching_session:queuing_latency"
WARMUP_LATENCY = ":tensorflow:serving:model_warmup_latency"
LOAD_ATTEMPTS = ":tensorflow:cc:saved_model:load_attempt_count"
# request_latency's bucket limits (util.cc: Buckets::Exponential(10, 1.8, 33)), microseconds
LATENCY_SCALE, LATENCY_GROWTH, LATENCY_BUCKETS = 10.0, 1.8, 33
# Multi-window burn-rate pairs (the Google SRE Workbook, "Alerting on SLOs", table 5-8):
# (long window, short window, burn rate, for, severity). 14.4 over 1 h spends 2% of a 30-day
# budget; 6 over 6 h spends 5%.
BURN_WINDOWS = (("1h", "5m", 14.4, "2m", "page"), ("6h", "30m", 6.0, "15m", "ticket"))
SLO_WINDOWS = ("5m", "30m", "1h", "6h")
TARGET_LABELS = ("model", "host", "instance", "slot", "release", "version")
TEXTFILE_JOB = "tfsdeploy-textfile"


def job_name(model: str) -> str:
    """The scrape job of one model's serving processes."""
    return f"tfserving-{model}"


def targets_file(model: str) -> str:
    """The file_sd file that holds one model's targets (the toolkit owns it)."""
    return f"{model}.json"


def latency_limits() -> list[float]:
    """request_latency's bucket limits in microseconds, as TensorFlow computes them
    (``bound *= growth`` from ``scale``)."""
    limits, bound = [], LATENCY_SCALE
    for _ in range(LATENCY_BUCKETS):
        limits.append(bound)
        bound *= LATENCY_GROWTH
    return limits


def le_text(limit: float) -> str:
    """A bucket limit as TFServing prints it: absl::StrCat(double), six significant digits."""
    return f"{limit:.6g}"


@dataclass(frozen=True)
class SloBucket:
    """The histogram bucket the latency SLO is judged at: the largest limit at or below
    ``latency_slo_ms`` (a request between it and the SLO counts as slow: the alert errs
    towards firing); ``le_pattern`` matches the limit as TFServing prints it and as a
    Prometheus that normalises ``le`` (3.x) stores it."""

    micros: float
    le_pattern: str


def slo_bucket(latency_slo_ms: float) -> SloBucket:
    """The bucket for one model's SLO (the smallest limit when the SLO is below all)."""
    limits = latency_limits()
    below = [limit for limit in limits if limit <= latency_slo_ms * 1000.0]
    chosen = below[-1] if below else limits[0]
    text = le_text(chosen)
    forms = dict.fromkeys([text, repr(float(text)), f"{float(text):.1f}"
                           if float(text).is_integer() else text])
    return SloBucket(micros=chosen, le_pattern="|".join(f.replace(".", "\\\\.") for f in forms))


# -- file_sd targets -----------------------------------------------------------------------

@dataclass(frozen=True)
class ServingProcess:
    """One running TFServing process of a model (a server container in a slot)."""

    host: str
    instance: int
    slot: str
    release: str
    version: int


def scrape_address(address: str, port: int) -> str:
    """A file_sd target, ``host:port``, as Prometheus reads it: an IPv6 literal in brackets
    (``[fd00::1]:8511``). Prometheus splits ``__address__`` with Go's net.SplitHostPort, which
    wants the brackets, and takes it whole as the scrape URL's host (prometheus
    scrape/target.go: PopulateLabels, Target.URL); a zone stays as written (``%eth0``: Go
    escapes it when it prints the URL, and dials it as it is)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return f"{address}:{port}"  # a DNS name
    return f"[{address}]:{port}" if parsed.version == 6 else f"{address}:{port}"


def target_groups(model: Model, hosts: Sequence[ResolvedHost],
                  processes: Iterable[ServingProcess]) -> list[dict[str, Any]]:
    """file_sd target groups, one per process: its REST port (where the metrics page is) and
    the labels that say which model, host, instance, slot, release and version it is."""
    by_name = {h.name: h for h in hosts}
    groups = []
    for p in sorted(processes, key=lambda p: (p.host, p.instance, p.slot)):
        host = by_name.get(p.host)
        if host is None:
            continue
        port = model_ports(host, model).slot_rest(p.slot, p.instance)
        labels = {"model": model.name, "host": host.name, "instance": str(p.instance),
                  "slot": p.slot, "release": p.release, "version": str(p.version)}
        if host.vars.monitoring_path != DEFAULT_METRICS_PATH:
            labels["__metrics_path__"] = host.vars.monitoring_path
        groups.append({"targets": [scrape_address(host.address, port)], "labels": labels})
    return groups


# -- prometheus.yml --------------------------------------------------------------------------

def seconds(value: int) -> str:
    """A Prometheus duration."""
    return f"{value}s"


def prometheus_config(models: Sequence[Model], monitoring: Monitoring, *,
                      targets_dir: str, rules_dir: str = "rules") -> dict[str, Any]:
    """prometheus.yml: one job per model reading its file_sd file, and the textfile job."""
    jobs: list[dict[str, Any]] = [{
        "job_name": job_name(m.name),
        "metrics_path": DEFAULT_METRICS_PATH,
        "file_sd_configs": [{"files": [f"{targets_dir}/{targets_file(m.name)}"],
                             "refresh_interval": seconds(max(5, monitoring.scrape_interval_s))}],
        # the target labels are the toolkit's: a metric's own label of the same name is kept
        # as exported_<name>
        "honor_labels": False,
    } for m in models]
    if monitoring.node_exporters:
        jobs.append({
            "job_name": TEXTFILE_JOB,
            "static_configs": [{"targets": list(monitoring.node_exporters)}],
            # only the toolkit's textfile metrics: the host's own are another job's
            "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": "tfsdeploy_.*",
                                        "action": "keep"}],
        })
    return {
        "global": {"scrape_interval": seconds(monitoring.scrape_interval_s),
                   "evaluation_interval": seconds(monitoring.evaluation_interval_s)},
        "rule_files": [f"{rules_dir}/*.yml"],
        "scrape_configs": jobs,
    }


# -- rules -----------------------------------------------------------------------------------

def _client_errors() -> str:
    return "|".join(sorted(CLIENT_ERRORS))


def _rate(metric: str, selector: str, window: str) -> str:
    return f"sum by (model) (rate({metric}{{{selector}}}[{window}]))"


def server_errors(model: str, window: str) -> str:
    """Server errors/s of one model; 0 (not nothing) while it has requests but no error:
    TFServing creates a status's series at its first request."""
    sel = f'job="{job_name(model)}"'
    failed = f'{sel},status!~"OK|{_client_errors()}"'
    return f"({_rate(REQUEST_COUNT, failed, window)} or {_rate(REQUEST_COUNT, sel, window)} * 0)"


def slow_requests(model: Model, window: str) -> str:
    """Successful requests/s slower than the SLO bucket; 0 while it has requests but none
    succeeded (request_latency's series appear at a first success)."""
    sel = f'job="{job_name(model.name)}"'
    le = f'{sel},le=~"{slo_bucket(model.latency_slo_ms).le_pattern}"'
    return (f"(({_rate(REQUEST_LATENCY + '_count', sel, window)} - "
            f"{_rate(REQUEST_LATENCY + '_bucket', le, window)})"
            f" or {_rate(REQUEST_COUNT, sel, window)} * 0)")


def recording_rules(model: Model, monitoring: Monitoring) -> list[dict[str, Any]]:
    """Per model: request rate, server-error ratio, P50/P99 (seconds, per model and per
    release), and the SLO's bad-request ratio over each burn-rate window."""
    m, w = model.name, seconds(monitoring.rate_window_s)
    sel = f'job="{job_name(m)}"'
    rules: list[dict[str, Any]] = [
        {"record": "model:tfserving_requests:rate", "labels": {"window": w},
         "expr": _rate(REQUEST_COUNT, sel, w)},
        {"record": "model:tfserving_server_errors:ratio_rate", "labels": {"window": w},
         "expr": f"{server_errors(m, w)} / {_rate(REQUEST_COUNT, sel, w)}"},
    ]
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        rules.append({
            "record": f"model:tfserving_request_latency_seconds:{name}", "labels": {"window": w},
            "expr": f"histogram_quantile({q}, sum by (model, le) "
                    f"(rate({REQUEST_LATENCY}_bucket{{{sel}}}[{w}]))) / 1e6"})
        rules.append({
            "record": f"model_release:tfserving_request_latency_seconds:{name}",
            "labels": {"window": w},
            "expr": f"histogram_quantile({q}, sum by (model, release, version, le) "
                    f"(rate({REQUEST_LATENCY}_bucket{{{sel}}}[{w}]))) / 1e6"})
    for window in SLO_WINDOWS:
        # bad = server errors + successful requests slower than the SLO bucket, out of every
        # request but those a client caused (request_latency counts successes only)
        total = _rate(REQUEST_COUNT, f'{sel},status!~"{_client_errors()}"', window)
        rules.append({"record": "model:tfsdeploy_slo_bad_requests:ratio_rate",
                      "labels": {"window": window},
                      "expr": f"({server_errors(m, window)} + {slow_requests(model, window)})"
                              f" / {total}"})
    return rules


def _alert(name: str, expr: str, for_: str | None, severity: str, summary: str,
           **labels: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **labels}
    rule["annotations"] = {"summary": summary}
    return rule


def model_alerts(model: Model, monitoring: Monitoring) -> list[dict[str, Any]]:
    """The alerts of one model's serving processes."""
    m, w = model.name, seconds(monitoring.rate_window_s)
    sel = f'job="{job_name(m)}"'
    budget = monitoring.error_budget
    slo_s = model.latency_slo_ms / 1000.0
    bucket = slo_bucket(model.latency_slo_ms)
    alerts = []
    for long, short, burn, for_, severity in BURN_WINDOWS:
        ratio = "model:tfsdeploy_slo_bad_requests:ratio_rate"
        alerts.append(_alert(
            f"TFServingSLOBurnRate{long}",
            f'{ratio}{{model="{m}",window="{long}"}} > ({burn} * {budget}) and on (model) '
            f'{ratio}{{model="{m}",window="{short}"}} > ({burn} * {budget})',
            for_, severity,
            f"{m}: failed or slower than {model.latency_slo_ms:g} ms (judged at the "
            f"{bucket.micros / 1000:.4g} ms bucket) at {burn}x the error budget ({budget:g}) "
            f"over {long} and {short}", model=m))
    alerts += target_alerts(model, monitoring)
    alerts.append(_alert(
        "TFServingP99AboveSLO",
        f'model:tfserving_request_latency_seconds:p99{{model="{m}",window="{w}"}} > {slo_s:g}',
        seconds(monitoring.p99_for_s), "page",
        f"{m}: P99 {{{{ $value | humanizeDuration }}}} above its {model.latency_slo_ms:g} ms SLO",
        model=m))
    fail = f'{LOAD_ATTEMPTS}{{{sel},status="fail"}}'
    alerts.append(_alert(
        "TFServingModelLoadFailed",
        f"increase({fail}[10m]) > 0 or ({fail} > 0 unless {fail} offset 10m)", None, "page",
        f"{m}: a version failed to load on {{{{ $labels.host }}}} (slot {{{{ $labels.slot }}}}, "
        "release {{ $labels.release }})", model=m))
    alerts.append(_alert(
        "TFServingWarmupSlow",
        f"{WARMUP_LATENCY}_sum{{{sel}}} / {WARMUP_LATENCY}_count{{{sel}}} / 1e6 > "
        f"{monitoring.warmup_max_s}", None, "ticket",
        f"{m}: warmup took {{{{ $value | humanizeDuration }}}} on {{{{ $labels.host }}}} "
        f"(over {monitoring.warmup_max_s} s)", model=m))
    if model.batching.enabled:
        limit = slo_s * monitoring.queue_slo_share
        alerts.append(_alert(
            "TFServingBatchQueueSlow",
            f"histogram_quantile(0.99, sum by (model, host, instance, slot, release, le) "
            f"(rate({QUEUING_LATENCY}_bucket{{{sel}}}[{w}]))) / 1e6 > {limit:g}",
            seconds(monitoring.alert_for_s), "ticket",
            f"{m}: requests wait {{{{ $value | humanizeDuration }}}} (P99) in the batching "
            f"queue on {{{{ $labels.host }}}}, over {monitoring.queue_slo_share:g} of the SLO",
            model=m))
    return alerts


# Prometheus' discovery manager hands changed targets to the scrapers at most every 5 s
# (discovery/manager.go, updatert)
DISCOVERY_UPDATE_S = 5


def retired_target_s(monitoring: Monitoring) -> int:
    """How long a stopped process can answer ``up == 0``: the toolkit rewrites the targets
    once the step that stopped it ends (about a scrape interval with every host read), the
    discovery manager passes the change on within 5 s, and the dropped target's last
    scrape is marked stale up to two intervals later (scrape/scrape.go, endOfRunStaleness)."""
    return DISCOVERY_UPDATE_S + 3 * int(monitoring.scrape_interval_s)


def target_alerts(model: Model, monitoring: Monitoring) -> list[dict[str, Any]]:
    """A serving process that does not answer its scrape (``up == 0``: its host lost, its
    server dead; a host a run could not read keeps its targets, so it is alerted on here
    rather than dropped), and a model with no target at all (its targets file empty, missing
    or not read: nothing of the model is watched). Both hold for ``alert_for_s``, and at least
    as long as a process a roll retires can stay a target after it stopped
    (``retired_target_s``)."""
    m = model.name
    sel = f'job="{job_name(m)}"'
    hold = seconds(max(monitoring.alert_for_s, retired_target_s(monitoring)))
    return [
        _alert("TFServingTargetDown", f"up{{{sel}}} == 0", hold, "page",
               f"{m}: the serving process on {{{{ $labels.host }}}} (instance "
               "{{ $labels.instance }}, slot {{ $labels.slot }}, release {{ $labels.release }})"
               " does not answer its metrics scrape", model=m),
        _alert("TFServingTargetsAbsent", f"absent(up{{{sel}}})", hold, "page",
               f"{m}: no serving process is scraped (job {job_name(m)} has no target): its "
               "targets file is empty, missing or not read", model=m),
    ]


def toolkit_alerts(model: Model, monitoring: Monitoring) -> list[dict[str, Any]]:
    """Alerts on the toolkit's textfile metrics (``--metrics-file``): a paused canary held too
    long, a cron command whose last success is older than its period."""
    if not monitoring.node_exporters:
        return []
    m = model.name
    run = "tfsdeploy_last_run_timestamp_seconds"
    code = "tfsdeploy_last_run_exit_code"
    success = "tfsdeploy_last_success_timestamp_seconds"
    duration = "tfsdeploy_last_run_duration_seconds"
    deploy = f'{{model="{m}",command="deploy"}}'
    guard = f'{{model="{m}",command="guard"}}'
    paused_at = f"max by (model) ({run}{deploy})"
    # `fab deploy --pause` exits 6 and holds the canary until a promote or an abort, or a
    # guard that aborts it (exit 2), runs after it; a guard that only watched (exit 0) does not
    ended = (f'(max by (model) ({run}{{model="{m}",command=~"promote|abort"}}) > on (model) '
             f"{paused_at}) or (max by (model) ({run}{guard} and on (model, command, instance) "
             f"({code}{guard} == 2)) > on (model) {paused_at})")
    alerts = [_alert(
        "TfsdeployCanaryPausedTooLong",
        f"(max by (model) ({code}{deploy}) == 6) and on (model) "
        f"(time() - {paused_at} > {monitoring.canary_pause_max_s}) unless on (model) ({ended})",
        None, "ticket",
        f"{m}: a canary has been paused for over {monitoring.canary_pause_max_s} s: "
        f"`fab promote --model {m}` or `fab abort --model {m}`", model=m)]
    for command, period in sorted(monitoring.cron_periods.items()):
        sel = f'{{model="{m}",command="{command}"}}'
        alerts.append(_alert(
            f"TfsdeployCron{command.capitalize()}NotSucceeding",
            f"time() - max by (model, command) ({success}{sel}) > {period} + "
            f"max by (model, command) ({duration}{sel}) or (max by (model, command) "
            f"({run}{sel}) unless on (model, command) {success}{sel})",
            None, "page",
            f"{m}: `fab {command}` has not succeeded for longer than its {period} s period",
            model=m, command=command))
    return alerts


def rule_groups(model: Model, monitoring: Monitoring) -> dict[str, Any]:
    """The rules file of one model."""
    interval = seconds(monitoring.evaluation_interval_s)
    return {"groups": [
        {"name": f"tfsdeploy.{model.name}.recording", "interval": interval,
         "rules": recording_rules(model, monitoring)},
        {"name": f"tfsdeploy.{model.name}.alerts", "interval": interval,
         "rules": model_alerts(model, monitoring) + toolkit_alerts(model, monitoring)},
    ]}


def to_yaml(data: Mapping[str, Any]) -> str:
    """YAML as Prometheus reads it (block style, keys in the order built)."""
    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False, width=1000)
