"""Latency recording in one process and exact merging of several processes' results.

Latencies go into HdrHistograms (microsecond units, 1 us .. 1 h, 3 significant digits: every
recorded value is kept within 0.1%). Count, sum, min and max are also kept exactly beside the
histograms, so ``average``, ``fastest`` and ``slowest`` are exact. A histogram is encoded
(HdrHistogram's compressed base64 form) in each worker process and added bucket by bucket in
the parent: merging loses nothing, the merged histogram equals the one a single process that
saw every request would have built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000
SIGNIFICANT_DIGITS = 3
MAX_ERROR_KINDS = 100  # distinct error strings kept per process (the rest are lumped)
NS_PER_S = 1_000_000_000


def new_histogram() -> HdrHistogram:
    """An empty latency histogram (microseconds)."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def _us(latency_ns: int) -> int:
    """Nanoseconds to the histogram's microseconds, kept inside its range."""
    return min(max(latency_ns // 1000, LOWEST_US), HIGHEST_US)


@dataclass
class Moments:
    """Exact count, sum, min and max of a set of latencies (ns)."""

    count: int = 0
    total_ns: int = 0
    min_ns: int = 0
    max_ns: int = 0

    def add(self, latency_ns: int) -> None:
        """Account for one latency."""
        if self.count == 0 or latency_ns < self.min_ns:
            self.min_ns = latency_ns
        if latency_ns > self.max_ns:
            self.max_ns = latency_ns
        self.count += 1
        self.total_ns += latency_ns

    def merge(self, other: Moments) -> None:
        """Add another set of latencies."""
        if other.count == 0:
            return
        if self.count == 0 or other.min_ns < self.min_ns:
            self.min_ns = other.min_ns
        self.max_ns = max(self.max_ns, other.max_ns)
        self.count += other.count
        self.total_ns += other.total_ns


class IntervalHistograms:
    """OK latencies by completion second: one live histogram, finished seconds encoded."""

    def __init__(self) -> None:
        self.total = new_histogram()  # every second added: the whole run
        self.encoded: dict[int, str] = {}
        self._second: int | None = None
        self._live = new_histogram()

    def record(self, second: int, latency_us: int) -> None:
        """One OK latency (microseconds) completed in ``second``."""
        if second != self._second:
            self.flush()
            self._second = second
        self._live.record_value(latency_us)

    def flush(self) -> None:
        """Encode the live second and start an empty one."""
        live, second = self._live, self._second
        if second is None or live.get_total_count() == 0:
            return
        self.total.add(live)
        if second in self.encoded:  # a completion out of time order: add to what was kept
            live.add(decode(self.encoded[second]))
        self.encoded[second] = live.encode().decode("ascii")
        self._live = new_histogram()  # a fresh one costs less than reset()


class Recorder:
    """Collects the results of one process's requests; cheap enough for the hot loop."""

    def __init__(self, *, keep_service_time: bool, keep_details: int = 0,
                 intervals: bool = False) -> None:
        self.ok_hist = new_histogram()
        self.intervals = IntervalHistograms() if intervals else None
        self.err_hist = new_histogram()
        self.service_hist = new_histogram() if keep_service_time else None
        self.ok = Moments()
        self.err = Moments()
        self.status_codes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.per_second: Counter[int] = Counter()
        self.per_second_errors: Counter[int] = Counter()
        self.details: list[tuple[int, int, str, str]] = []
        self._keep_details = keep_details
        self.origin_ns = 0  # set when the measured window starts

    def record_ok(self, latency_ns: int, done_ns: int) -> None:
        """One OK response that took ``latency_ns`` and completed at ``done_ns``."""
        second = (done_ns - self.origin_ns) // NS_PER_S
        if self.intervals is None:
            self.ok_hist.record_value(_us(latency_ns))
        else:
            self.intervals.record(second, _us(latency_ns))
        self.ok.add(latency_ns)
        self.per_second[second] += 1
        if self._keep_details:
            self._detail(latency_ns, done_ns, "", "OK")

    def record_error(self, latency_ns: int, done_ns: int, status: str, message: str) -> None:
        """One failed request."""
        self.err_hist.record_value(_us(latency_ns))
        self.err.add(latency_ns)
        self.status_codes[status] += 1
        if message in self.errors or len(self.errors) < MAX_ERROR_KINDS:
            self.errors[message] += 1
        else:
            self.errors["(other errors)"] += 1
        second = (done_ns - self.origin_ns) // NS_PER_S
        self.per_second[second] += 1
        self.per_second_errors[second] += 1
        if self._keep_details:
            self._detail(latency_ns, done_ns, message, status)

    def record_service_time(self, latency_ns: int) -> None:
        """Open loop only: time from the actual send, beside the latency from intended time."""
        if self.service_hist is not None:
            self.service_hist.record_value(_us(latency_ns))

    def _detail(self, latency_ns: int, done_ns: int, error: str, status: str) -> None:
        if len(self.details) < self._keep_details:
            self.details.append((done_ns - latency_ns, latency_ns, error, status))


@dataclass
class ProcResult:
    """What one worker process sends back to the parent (plain, picklable data)."""

    ok_hist: str
    err_hist: str
    service_hist: str | None
    ok: Moments
    err: Moments
    status_codes: dict[str, int]
    errors: dict[str, int]
    per_second: dict[int, int]
    per_second_errors: dict[int, int]
    start_ns: int
    end_ns: int
    cpu_user_s: float
    cpu_system_s: float
    end_reason: str
    late_sends: int = 0
    details: list[tuple[int, int, str, str]] = field(default_factory=list)
    own_late_sends: int = 0  # late sends although a worker was free: the client's own lag
    max_send_lag_ns: int = 0  # the worst of those (0 when none)
    interval_hists: dict[int, str] = field(default_factory=dict)  # second -> encoded OK hist


def finish(recorder: Recorder, **run: Any) -> ProcResult:
    """Freeze a recorder into a ProcResult; ``run`` gives the timing and CPU fields."""
    ok_count = recorder.ok.count
    status = dict(recorder.status_codes)
    if ok_count:
        status["OK"] = ok_count
    ok_hist = recorder.ok_hist
    if recorder.intervals is not None:
        recorder.intervals.flush()
        ok_hist = recorder.intervals.total
        run["interval_hists"] = dict(recorder.intervals.encoded)
    return ProcResult(
        ok_hist=ok_hist.encode().decode("ascii"),
        err_hist=recorder.err_hist.encode().decode("ascii"),
        service_hist=(recorder.service_hist.encode().decode("ascii")
                      if recorder.service_hist is not None else None),
        ok=recorder.ok, err=recorder.err, status_codes=status, errors=dict(recorder.errors),
        per_second=dict(recorder.per_second), per_second_errors=dict(recorder.per_second_errors),
        details=recorder.details, **run)


def decode(encoded: str) -> HdrHistogram:
    """A histogram from its encoded form."""
    return HdrHistogram.decode(encoded.encode("ascii"))


def merge_histograms(encoded: Iterable[str | None]) -> HdrHistogram:
    """Bucket-wise sum of encoded histograms (exact)."""
    merged = new_histogram()
    for item in encoded:
        if item:
            merged.add(decode(item))
    return merged


@dataclass
class Merged:
    """All processes' results added together."""

    ok_hist: HdrHistogram
    err_hist: HdrHistogram
    service_hist: HdrHistogram | None
    ok: Moments
    err: Moments
    status_codes: Counter[str]
    errors: Counter[str]
    per_second: dict[int, tuple[int, int]]
    start_ns: int
    end_ns: int
    cpu_user_s: float
    cpu_system_s: float
    end_reason: str
    late_sends: int
    details: list[tuple[int, int, str, str]]
    own_late_sends: int = 0
    max_send_lag_ns: int = 0
    interval_hists: dict[int, str] = field(default_factory=dict)  # second -> merged, encoded

    @property
    def count(self) -> int:
        """Every completed request, OK or not (ghz's ``count``)."""
        return self.ok.count + self.err.count

    @property
    def wall_s(self) -> float:
        """Measured window: common start to the last completion."""
        return max(self.end_ns - self.start_ns, 1) / 1e9


def _end_reason(reasons: Sequence[str]) -> str:
    for reason in ("cancel", "timeout"):
        if reason in reasons:
            return reason
    return "normal"


def merge_results(results: Sequence[ProcResult]) -> Merged:
    """Merge the per-process results exactly (histograms, moments, counters)."""
    ok, err = Moments(), Moments()
    status: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    seconds: Counter[int] = Counter()
    second_errors: Counter[int] = Counter()
    for item in results:
        ok.merge(item.ok)
        err.merge(item.err)
        status.update(item.status_codes)
        errors.update(item.errors)
        seconds.update(item.per_second)
        second_errors.update(item.per_second_errors)
    services = [r.service_hist for r in results]
    return Merged(
        ok_hist=merge_histograms(r.ok_hist for r in results),
        err_hist=merge_histograms(r.err_hist for r in results),
        service_hist=merge_histograms(services) if any(services) else None,
        ok=ok, err=err, status_codes=status, errors=errors,
        per_second={s: (seconds[s], second_errors[s]) for s in sorted(seconds)},
        start_ns=min(r.start_ns for r in results), end_ns=max(r.end_ns for r in results),
        cpu_user_s=sum(r.cpu_user_s for r in results),
        cpu_system_s=sum(r.cpu_system_s for r in results),
        end_reason=_end_reason([r.end_reason for r in results]),
        late_sends=sum(r.late_sends for r in results),
        details=sorted(d for r in results for d in r.details),
        own_late_sends=sum(r.own_late_sends for r in results),
        max_send_lag_ns=max((r.max_send_lag_ns for r in results), default=0),
        interval_hists=merge_intervals(r.interval_hists for r in results))


def merge_intervals(items: Iterable[Mapping[int, str]]) -> dict[int, str]:
    """Per second, the bucket-wise sum of every result's histogram of that second (encoded)."""
    by_second: dict[int, list[str]] = {}
    for hists in items:
        for second, encoded in hists.items():
            by_second.setdefault(second, []).append(encoded)
    out = {}
    for second in sorted(by_second):
        parts = by_second[second]
        out[second] = parts[0] if len(parts) == 1 else \
            merge_histograms(parts).encode().decode("ascii")
    return out


def percentile_ns(hist: HdrHistogram, percentile: float) -> int:
    """Latency at ``percentile`` (0-100) in nanoseconds; 0 for an empty histogram."""
    if hist.get_total_count() == 0:
        return 0
    return int(hist.get_value_at_percentile(percentile)) * 1000


# -- results as JSON (merged later, possibly on another machine) --------------------------------

RESULT_FORMAT = 1


def _moments_json(moments: Moments) -> dict[str, int]:
    return {"count": moments.count, "totalNs": moments.total_ns, "minNs": moments.min_ns,
            "maxNs": moments.max_ns}


def _moments_from(data: Mapping[str, Any]) -> Moments:
    return Moments(count=int(data["count"]), total_ns=int(data["totalNs"]),
                   min_ns=int(data["minNs"]), max_ns=int(data["maxNs"]))


def _int_keys(data: Mapping[str, Any]) -> dict[int, Any]:
    return {int(key): value for key, value in data.items()}


def result_to_json(result: ProcResult, *, clock_offset_ns: int = 0) -> dict[str, Any]:
    """One process's result as JSON-ready data, every count and histogram kept exactly.

    ``clock_offset_ns`` is added to ``start_ns``/``end_ns``: the wall clock minus the
    monotonic clock, so that the results of several machines share one time base. Seconds
    (``perSecond``, ``intervals``) count from the common start and need no shift.
    """
    return {
        "format": RESULT_FORMAT,
        "okHist": result.ok_hist, "errHist": result.err_hist,
        "serviceHist": result.service_hist,
        "ok": _moments_json(result.ok), "err": _moments_json(result.err),
        "statusCodes": result.status_codes, "errors": result.errors,
        "perSecond": {str(k): v for k, v in result.per_second.items()},
        "perSecondErrors": {str(k): v for k, v in result.per_second_errors.items()},
        "startNs": result.start_ns + clock_offset_ns, "endNs": result.end_ns + clock_offset_ns,
        "cpuUserS": result.cpu_user_s, "cpuSystemS": result.cpu_system_s,
        "endReason": result.end_reason, "lateSends": result.late_sends,
        "ownLateSends": result.own_late_sends, "maxSendLagNs": result.max_send_lag_ns,
        "intervals": {str(k): v for k, v in result.interval_hists.items()},
    }


def result_from_json(data: Mapping[str, Any]) -> ProcResult:
    """The ProcResult that ``result_to_json`` wrote (ValueError when it is not one)."""
    if data.get("format") != RESULT_FORMAT:
        raise ValueError(f"not a load generator result of format {RESULT_FORMAT}: "
                         f"format {data.get('format')!r}")
    try:
        return ProcResult(
            ok_hist=str(data["okHist"]), err_hist=str(data["errHist"]),
            service_hist=data["serviceHist"], ok=_moments_from(data["ok"]),
            err=_moments_from(data["err"]), status_codes=dict(data["statusCodes"]),
            errors=dict(data["errors"]), per_second=_int_keys(data["perSecond"]),
            per_second_errors=_int_keys(data["perSecondErrors"]),
            start_ns=int(data["startNs"]), end_ns=int(data["endNs"]),
            cpu_user_s=float(data["cpuUserS"]), cpu_system_s=float(data["cpuSystemS"]),
            end_reason=str(data["endReason"]), late_sends=int(data["lateSends"]),
            own_late_sends=int(data["ownLateSends"]),
            max_send_lag_ns=int(data["maxSendLagNs"]),
            interval_hists=_int_keys(data["intervals"]))
    except (KeyError, TypeError) as err:
        raise ValueError(f"load generator result: missing or bad field {err}") from err
