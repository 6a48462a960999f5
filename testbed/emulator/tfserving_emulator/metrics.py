"""TF monitoring-style metrics and their Prometheus page.

Names, labels and buckets follow TFServing (servables/tensorflow/util.cc,
batching/batching_session.cc, batching/batching_util.h, saved_model_warmup_util.cc) and TF's
cc/saved_model/loader.cc; the page follows util/prometheus_exporter.cc: names with every
character outside [a-zA-Z0-9_] turned into ':', only ``# TYPE`` lines, histograms as
``_bucket{le}``/``_sum``/``_count`` with the last bucket ``+Inf``. PrometheusExporter::GeneratePage
walks every registered metric, so a metric that has no value yet still gets its ``# TYPE`` line.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Sequence


def exponential_buckets(scale: float, growth: float, count: int) -> list[float]:
    """TF ``Buckets::Exponential``: ``count`` limits scale*growth^i; +inf is added after."""
    limits = []
    bound = scale
    for _ in range(count):
        limits.append(bound)
        bound *= growth
    return limits


def _number(value: float) -> str:
    # absl::StrCat(double) prints 6 significant digits
    text = f"{value:.6g}"
    return text


def prometheus_name(name: str) -> str:
    """util/prometheus_exporter.cc GetPrometheusMetricName."""
    new = re.sub(r"[^a-zA-Z0-9_]", ":", name)
    return "_" + new if new[:1].isdigit() else new


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class Counter:
    """A cumulative int64 counter with labels."""

    def __init__(self, name: str, labels: Sequence[str]) -> None:
        self.name = name
        self.labels = tuple(labels)
        self._cells: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def add(self, *label_values: str, amount: int = 1) -> None:
        """Increase the cell for ``label_values`` by ``amount``."""
        with self._lock:
            self._cells[label_values] = self._cells.get(label_values, 0) + int(amount)

    def value(self, *label_values: str) -> int:
        """Current value of one cell (0 if never touched)."""
        with self._lock:
            return self._cells.get(label_values, 0)

    def lines(self) -> list[str]:
        """Prometheus lines for this metric: its ``# TYPE`` line, then one line per cell."""
        with self._lock:
            cells = dict(self._cells)
        pname = prometheus_name(self.name)
        out = [f"# TYPE {pname} counter"]
        for values, count in cells.items():
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(self.labels, values,
                                                                     strict=True))
            out.append(f"{pname}{{{labels}}} {count}")
        return out


class Histogram:
    """A TF Sampler: a histogram over fixed bucket limits, with labels."""

    def __init__(self, name: str, labels: Sequence[str], limits: list[float]) -> None:
        self.name = name
        self.labels = tuple(labels)
        self.limits = limits
        self._cells: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, *label_values: str) -> None:
        """Add one sample to the cell for ``label_values``."""
        # TF histograms put v into the first bucket whose limit is > v.
        index = bisect.bisect_right(self.limits, value)
        with self._lock:
            cell = self._cells.get(label_values)
            if cell is None:
                cell = ([0] * (len(self.limits) + 1), [0.0])
                self._cells[label_values] = cell
            cell[0][index] += 1
            cell[1][0] += value

    def count(self, *label_values: str) -> int:
        """Number of samples in one cell."""
        with self._lock:
            cell = self._cells.get(label_values)
            return sum(cell[0]) if cell else 0

    def lines(self) -> list[str]:
        """Prometheus lines for this metric: its ``# TYPE`` line, then each cell's buckets."""
        with self._lock:
            cells = {k: (list(v[0]), v[1][0]) for k, v in self._cells.items()}
        pname = prometheus_name(self.name)
        out = [f"# TYPE {pname} histogram"]
        for values, (buckets, total) in cells.items():
            labels = [f'{k}="{_escape(v)}"' for k, v in zip(self.labels, values, strict=True)]
            prefix = f"{pname}_bucket{{{','.join(labels)}{',' if labels else ''}"
            cumulative = 0
            for i, bucket in enumerate(buckets):
                cumulative += bucket
                limit = _number(self.limits[i]) if i < len(self.limits) else "+Inf"
                out.append(f'{prefix}le="{limit}"}} {cumulative}')
            out.append(f"{pname}_sum{{{','.join(labels)}}} {_number(total)}")
            out.append(f"{pname}_count{{{','.join(labels)}}} {cumulative}")
        return out


class Metrics:
    """Every metric the emulator exports, under TFServing's names."""

    def __init__(self) -> None:
        latency = exponential_buckets(10, 1.8, 33)
        sizes = exponential_buckets(1, 2, 14)
        self.request_count = Counter("/tensorflow/serving/request_count",
                                     ("model_name", "status"))
        self.request_latency = Histogram("/tensorflow/serving/request_latency",
                                         ("model_name", "API", "entrypoint"), latency)
        self.runtime_latency = Histogram("/tensorflow/serving/runtime_latency",
                                         ("model_name", "API", "runtime"), latency)
        self.example_counts = Histogram("/tensorflow/serving/request_example_counts",
                                        ("model",), exponential_buckets(1, 2, 15))
        self.example_count_total = Counter("/tensorflow/serving/request_example_count_total",
                                           ("model",))
        self.load_attempt_count = Counter("/tensorflow/cc/saved_model/load_attempt_count",
                                          ("model_path", "status"))
        self.load_latency = Counter("/tensorflow/cc/saved_model/load_latency", ("model_path",))
        self.warmup_latency = Histogram("/tensorflow/serving/model_warmup_latency",
                                        ("model_path", "status"), latency)
        self.warmup_records_read = Counter("/tensorflow/serving/model_warmup_records_read",
                                           ("model_path", "status"))
        self.queuing_latency = Histogram("/tensorflow/serving/batching_session/queuing_latency",
                                         ("thread_pool_name",),
                                         exponential_buckets(100, 1.2, 52))
        self.wrapped_run_count = Counter(
            "/tensorflow/serving/batching_session/wrapped_run_count", ())
        self.input_batch_size = Histogram(
            "/tensorflow/serving/batching_session/input_batch_size", (), sizes)
        self.processed_batch_size = Histogram(
            "/tensorflow/serving/batching_session/processed_batch_size", (), sizes)
        self.padding_size = Histogram("/tensorflow/serving/batching_session/padding_size",
                                      ("execution_batch_size",), sizes)

    def page(self) -> str:
        """The whole Prometheus text page, metrics sorted by name like TF's registry."""
        metrics = sorted(vars(self).values(), key=lambda m: m.name)
        lines: list[str] = []
        for metric in metrics:
            lines.extend(metric.lines())
        return "\n".join(lines) + "\n"
