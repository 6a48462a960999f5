"""The automatic guard: read each host's TFServing metrics and decide when a release breaks
its SLO for long enough to roll it back.

Pure parsing and arithmetic here; scraping and the rollback itself are done by the caller
(`fab guard`). TFServing exports `:tensorflow:serving:request_count{model_name,status}` and
the `:tensorflow:serving:request_latency` histogram (microseconds, successful requests only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

REQUEST_COUNT = ":tensorflow:serving:request_count"
# Statuses a client causes (a malformed or unknown request): never a release's failure, so they
# never count toward the error rate (else anyone able to send bad requests could walk the
# fleet back through its history). The rest (INTERNAL, UNAVAILABLE, RESOURCE_EXHAUSTED,
# DEADLINE_EXCEEDED, UNKNOWN, DATA_LOSS ...) are the server's.
CLIENT_ERRORS = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS",
                           "PERMISSION_DENIED", "UNAUTHENTICATED", "FAILED_PRECONDITION",
                           "OUT_OF_RANGE", "CANCELLED", "UNIMPLEMENTED"})
LATENCY_BUCKET = ":tensorflow:serving:request_latency_bucket"
LINE = re.compile(r'^(?P<name>[^\s{]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class GuardPolicy:
    """When `fab guard` acts. Its defaults are `fab guard`'s (``cli.verbs.GuardArgs`` takes
    each from here)."""

    max_error_rate: float = 0.01
    slo_p99_ms: float | None = None  # None: the model's latency SLO
    for_s: float = 30.0
    interval_s: float = 5.0
    duration_s: float | None = None  # None: until a rollback (or forever)
    min_requests: int = 20
    lock_wait: float = 60.0
    # client errors (malformed requests) count only when asked: anyone able to send bad
    # requests could otherwise roll a good release back
    count_client_errors: bool = False
    # how often a paused canary is looked for again (SSH to every host)
    paused_refresh_s: float = 60.0


@dataclass(frozen=True)
class Scrape:
    """The counters of one model at one moment."""

    requests: Mapping[str, float]  # status -> count
    buckets: Mapping[float, float]  # le (microseconds) -> cumulative count


def parse_metrics(text: str, model: str) -> Scrape:
    """Sum the model's request counts by status and latency buckets by bound."""
    requests: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if not match or line.startswith("#"):
            continue
        labels = dict(LABEL.findall(match["labels"] or ""))
        if labels.get("model_name") != model:
            continue
        value = float(match["value"])
        if match["name"] == REQUEST_COUNT:
            status = labels.get("status", "OK")
            requests[status] = requests.get(status, 0.0) + value
        elif match["name"] == LATENCY_BUCKET:
            bound = math.inf if labels.get("le") in ("+Inf", "inf") else float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
    return Scrape(requests, buckets)


@dataclass(frozen=True)
class Window:
    """Traffic between two scrapes of one server process (client errors left out)."""

    total: float
    errors: float
    p99_ms: float | None

    @property
    def error_rate(self) -> float:
        """Failed requests over all requests (0 with no traffic)."""
        return self.errors / self.total if self.total else 0.0


def _increase(before: float, after: float) -> float:
    """A counter's increase; a smaller value means the server restarted (a switch to the
    other slot does that): everything it counted is new."""
    return after - before if after >= before else after


def window(before: Scrape, after: Scrape, *, count_client_errors: bool = False) -> Window:
    """Requests, errors and P99 latency between two scrapes."""
    delta = {s: _increase(before.requests.get(s, 0.0), v) for s, v in after.requests.items()}
    total = sum(v for s, v in delta.items() if count_client_errors or s not in CLIENT_ERRORS)
    errors = total - delta.get("OK", 0.0)
    return Window(total=total, errors=errors,
                  p99_ms=_quantile(bucket_deltas(before, after), 0.99))


def _quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    target = q * cumulative[-1][1]
    for bound, count in cumulative:
        if count >= target:
            finite = bound if math.isfinite(bound) else cumulative[-2][0] if len(
                cumulative) > 1 else 0.0
            return finite / 1000.0
    return None


def restarted(before: Scrape, after: Scrape) -> bool:
    """Whether the process restarted between two scrapes: a counter went back or vanished.

    Counters only grow while a process lives, and a restart sets every one of them back to
    zero; testing them one by one (as ``window`` does) misses the counters that grew past
    their old value again after the restart, so judging the whole scrape is exact.
    """
    return any(after.requests.get(status, -1.0) < count
               for status, count in before.requests.items()) or any(
        after.buckets.get(bound, -1.0) < count for bound, count in before.buckets.items())


def interpolated_quantile_ms(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile (milliseconds) of a cumulative histogram in microseconds, assuming
    the samples are spread evenly inside the bucket it falls in (Prometheus's
    ``histogram_quantile`` rule); None with no samples.

    TFServing's latency buckets grow by a factor 1.8 (``Buckets::Exponential(10, 1.8, 33)``
    in tensorflow_serving/servables/tensorflow/util.cc), so a bucket's upper bound (what
    ``window`` reports, the conservative reading against an absolute SLO) cannot tell apart
    two figures less than 1.8 times apart: a ratio between two servers needs this reading.
    A quantile in the open +Inf bucket is the highest finite bound.
    """
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank and count > below:
            if not math.isfinite(bound):
                return lower / 1000.0
            return (lower + (bound - lower) * (rank - below) / (count - below)) / 1000.0
        lower, below = bound, count
    return lower / 1000.0


def count_above(cumulative: list[tuple[float, float]], limit_us: float) -> float:
    """How many samples of a cumulative histogram (bounds in microseconds) are above
    ``limit_us``, with the samples spread evenly inside each bucket as
    ``interpolated_quantile_ms`` reads them. A limit inside the open +Inf bucket counts that
    bucket whole."""
    if not cumulative:
        return 0.0
    total = cumulative[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if limit_us < bound:
            if not math.isfinite(bound):
                return total - below
            return total - (below + (count - below) * (limit_us - lower) / (bound - lower))
        lower, below = bound, count
    return total - below


@dataclass
class Breach:
    """How long a host has been out of its SLO."""

    since: dict[str, float] = field(default_factory=dict)

    def observe(self, host: str, w: Window, *, now: float, max_error_rate: float,
                slo_p99_ms: float, min_requests: int = 20) -> str | None:
        """Record one window; returns why the host is breaking its SLO, or None."""
        reason = None
        if w.total >= min_requests and w.error_rate > max_error_rate:
            reason = (f"error rate {w.error_rate:.2%} > {max_error_rate:.2%} "
                      f"({w.errors:.0f} of {w.total:.0f})")
        elif w.total >= min_requests and w.p99_ms is not None and w.p99_ms > slo_p99_ms:
            reason = f"P99 {w.p99_ms:.0f} ms > SLO {slo_p99_ms:g} ms"
        if reason is None:
            self.since.pop(host, None)
        else:
            self.since.setdefault(host, now)
        return reason

    def sustained(self, host: str, *, now: float, for_s: float) -> bool:
        """Whether the host has been breaking its SLO for at least ``for_s``."""
        return host in self.since and now - self.since[host] >= for_s


def merge(windows: list[Window], buckets: list[list[tuple[float, float]]]) -> Window:
    """Several processes' windows of one host as one (P99 from their summed buckets)."""
    total = sum(w.total for w in windows)
    errors = sum(w.errors for w in windows)
    summed: dict[float, float] = {}
    for series in buckets:
        for bound, count in series:
            summed[bound] = summed.get(bound, 0.0) + count
    return Window(total=total, errors=errors, p99_ms=_quantile(sorted(summed.items()), 0.99))


def bucket_deltas(before: Scrape, after: Scrape) -> list[tuple[float, float]]:
    """The latency buckets' increases between two scrapes of one process."""
    return sorted((le, _increase(before.buckets.get(le, 0.0), v))
                  for le, v in after.buckets.items())
