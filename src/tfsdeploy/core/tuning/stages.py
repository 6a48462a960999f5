"""Where a TFServing request's time goes, from the server's own metrics between two reads
of its Prometheus page (pure).

The names are TFServing's (util/prometheus_exporter.cc turns every character outside
[a-zA-Z0-9_] into ':'; histograms export ``_sum`` and ``_count``, latencies in microseconds):

- ``/tensorflow/serving/request_latency`` (servables/tensorflow/util.cc): a successful
  request, from the handler's start to its answer; labels model_name, API, entrypoint;
- ``/tensorflow/serving/runtime_latency`` (util.cc): the time in Session::Run;
- ``/tensorflow/serving/batching_session/queuing_latency`` (batching/batching_session.cc):
  the time a task waits in the batch queue, label thread_pool_name;
- ``/tensorflow/serving/batching_session/processed_batch_size`` (batching/batching_util.cc):
  each batch's size after padding;
- ``/tensorflow/serving/request_count`` (util.cc): requests by status: UNAVAILABLE is what the
  batch scheduler answers when its queue is full (shared_batch_scheduler.h: "The batch
  scheduling queue to which this task was submitted is full").

The batching metrics carry no model label (one server process serves one model here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tfsdeploy.core.observe.guard import LABEL, LINE

PREFIX = ":tensorflow:serving:"
REQUEST_LATENCY = PREFIX + "request_latency"
RUNTIME_LATENCY = PREFIX + "runtime_latency"
QUEUING_LATENCY = PREFIX + "batching_session:queuing_latency"
PROCESSED_BATCH = PREFIX + "batching_session:processed_batch_size"
REQUEST_COUNT = PREFIX + "request_count"
QUEUE_FULL = "UNAVAILABLE"
MODEL_LABELLED = (REQUEST_LATENCY, RUNTIME_LATENCY)


@dataclass(frozen=True)
class Totals:
    """The cumulative sums and counts of one server's histograms, and its request counts by
    status, at one read."""

    sums: Mapping[str, float] = field(default_factory=dict)
    counts: Mapping[str, float] = field(default_factory=dict)
    requests: Mapping[str, float] = field(default_factory=dict)


def parse_totals(text: str, model: str) -> Totals:
    """A Prometheus page -> the histograms' ``_sum``/``_count`` by metric (the model's own
    series where the metric names the model) and the model's request counts by status."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    requests: dict[str, float] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if not match or line.startswith("#"):
            continue
        name = match["name"]
        labels = dict(LABEL.findall(match["labels"] or ""))
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if name == REQUEST_COUNT:
            if labels.get("model_name") == model:
                status = labels.get("status", "OK")
                requests[status] = requests.get(status, 0.0) + value
            continue
        base, _, part = name.rpartition("_")
        if part not in ("sum", "count") or base not in (*MODEL_LABELLED, QUEUING_LATENCY,
                                                        PROCESSED_BATCH):
            continue
        if base in MODEL_LABELLED and labels.get("model_name") != model:
            continue
        into = sums if part == "sum" else counts
        into[base] = into.get(base, 0.0) + value
    return Totals(sums, counts, requests)


def _increase(before: Mapping[str, float], after: Mapping[str, float], key: str) -> float:
    """A counter's increase (a smaller value: the server restarted, all of it is new)."""
    old, new = before.get(key, 0.0), after.get(key, 0.0)
    return new - old if new >= old else new


@dataclass(frozen=True)
class StageWindow:
    """Between two reads: mean request, run and queueing latency (ms), the mean processed
    batch size, and the requests by status."""

    requests_ok: float
    request_ms: float | None
    runtime_ms: float | None
    queue_ms: float | None
    mean_batch: float | None
    batches: float
    statuses: Mapping[str, float]

    @property
    def queue_share(self) -> float | None:
        """The share of a request's latency spent waiting in the batch queue."""
        if self.queue_ms is None or not self.request_ms:
            return None
        return min(1.0, self.queue_ms / self.request_ms)

    @property
    def queue_full(self) -> float:
        """Requests the batch scheduler refused (its queue was full)."""
        return self.statuses.get(QUEUE_FULL, 0.0)


def stage_window(before: Totals, after: Totals) -> StageWindow:
    """The figures between two reads of one server."""
    def mean(metric: str, scale: float) -> float | None:
        count = _increase(before.counts, after.counts, metric)
        if count <= 0:
            return None
        return _increase(before.sums, after.sums, metric) / count * scale

    statuses = {s: _increase(before.requests, after.requests, s) for s in after.requests}
    return StageWindow(requests_ok=statuses.get("OK", 0.0),
                       request_ms=mean(REQUEST_LATENCY, 1e-3),
                       runtime_ms=mean(RUNTIME_LATENCY, 1e-3),
                       queue_ms=mean(QUEUING_LATENCY, 1e-3),
                       mean_batch=mean(PROCESSED_BATCH, 1.0),
                       batches=_increase(before.counts, after.counts, PROCESSED_BATCH),
                       statuses=statuses)

