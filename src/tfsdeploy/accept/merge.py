"""Every generator's results merged exactly, and the time series of the run (pure).

Each generator process returns HdrHistograms (whole run, and one per completion second,
counted from the common start) and exact counters (stats.ProcResult). Merging adds histograms
bucket by bucket and counters by key, so the fleet's figures are the ones a single generator
sending every request would have recorded: percentiles are never averaged, a request is
counted once, and second ``s`` of one generator is second ``s`` of every other (they share the
start instant; seconds are taken from it, not from each machine's clock reading).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from tfsdeploy.loadtest import stats

OK, FAILED, LOST = "ok", "failed", "lost"
SERIES_PERCENTILES = (50.0, 95.0, 99.0, 99.9)


@dataclass
class GeneratorOutcome:
    """What one generator did: its results (when it returned them) or why it has none."""

    name: str
    share_qps: float
    status: str  # OK, FAILED (ended without results) or LOST (died or unreachable mid-run)
    results: list[stats.ProcResult] = field(default_factory=list)
    host_cpu: Mapping[str, Any] | None = None
    error: str = ""
    ended_s: float | None = None  # seconds after the common start when its command returned
    procs: int = 0
    workers: int = 0
    warmup: int = 0  # requests sent before the window (not counted; a server sees them)
    clock_offset_ms: float | None = None

    @property
    def measured(self) -> bool:
        """Whether it returned results."""
        return self.status == OK and bool(self.results)


@dataclass
class FleetMerge:
    """The fleet's merged results and each generator's own (None without results)."""

    fleet: stats.Merged | None
    generators: dict[str, stats.Merged | None]

    @property
    def count(self) -> int:
        """Completed requests in the fleet's merge."""
        return self.fleet.count if self.fleet is not None else 0

    @property
    def generator_count_sum(self) -> int:
        """Sum of every generator's own count (must equal ``count``)."""
        return sum(m.count for m in self.generators.values() if m is not None)


def merge_fleet(outcomes: Sequence[GeneratorOutcome]) -> FleetMerge:
    """Merge all processes of all generators at once, and each generator alone."""
    every = [r for o in outcomes if o.measured for r in o.results]
    return FleetMerge(
        fleet=stats.merge_results(every) if every else None,
        generators={o.name: stats.merge_results(o.results) if o.measured else None
                    for o in outcomes})


# -- time series ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slice:
    """The merged figures of a span of whole seconds ``[start_s, end_s)``."""

    start_s: int
    end_s: int
    count: int
    errors: int
    hist: HdrHistogram

    @property
    def ok(self) -> int:
        """OK responses completed in the span."""
        return self.count - self.errors

    def percentile_ms(self, percentile: float) -> float | None:
        """OK-latency percentile in ms, None when no OK response completed in the span."""
        if self.hist.get_total_count() == 0:
            return None
        return stats.percentile_ns(self.hist, percentile) / 1e6

    def qps(self) -> float:
        """Completions per second over the span."""
        return self.count / max(self.end_s - self.start_s, 1)


def last_second(merged: stats.Merged, duration_s: float) -> int:
    """The last second of the series: the window's, or a later one that saw completions
    (requests sent before the window ended and answered after it)."""
    window_last = max(math.ceil(duration_s) - 1, 0)
    return max([window_last, *merged.per_second])


def slice_of(merged: stats.Merged, start_s: int, end_s: int) -> Slice:
    """Seconds ``[start_s, end_s)`` merged: counts added, per-second histograms added."""
    hist = stats.merge_histograms(merged.interval_hists.get(s) for s in range(start_s, end_s))
    count = errors = 0
    for second in range(start_s, end_s):
        done, failed = merged.per_second.get(second, (0, 0))
        count += done
        errors += failed
    return Slice(start_s, end_s, count, errors, hist)


def slices(merged: stats.Merged, duration_s: float, width_s: int = 1) -> list[Slice]:
    """Consecutive spans of ``width_s`` seconds from the start to the last second."""
    end = last_second(merged, duration_s) + 1
    return [slice_of(merged, s, min(s + width_s, end)) for s in range(0, end, width_s)]


def seconds_touching(start_s: float, end_s: float) -> tuple[int, int]:
    """The whole seconds ``[first, last)`` that overlap the span ``[start_s, end_s]``."""
    return max(math.floor(start_s), 0), max(math.ceil(end_s), math.floor(start_s) + 1)


def series_rows(items: Iterable[Slice]) -> list[dict[str, Any]]:
    """The per-second series for the JSON report (latencies in ms; ``hdr`` keeps each
    second's merged histogram so that the series can be merged again)."""
    out = []
    for item in items:
        row: dict[str, Any] = {"second": item.start_s, "count": item.count, "ok": item.ok,
                               "errors": item.errors, "qps": item.qps()}
        for percentile in SERIES_PERCENTILES:
            row[f"p{percentile:g}".replace(".", "")] = item.percentile_ms(percentile)
        row["maxMs"] = (item.hist.get_max_value() / 1e3 if item.hist.get_total_count()
                        else None)
        row["hdr"] = (item.hist.encode().decode("ascii") if item.hist.get_total_count()
                      else None)
        out.append(row)
    return out
