"""A small, bounded, paced load client for the zero-downtime test.

Targets are the hosts' stable ports, gRPC and REST. Each target gets ``rate`` requests/s on an
open-loop schedule (request k is due at t0 + k / rate), sent by a few worker threads:

- gRPC: one long-lived channel per target, shared by its workers (HTTP/2 streams), as
  TFServing clients do;
- REST: one keep-alive HTTP/1.1 connection per worker.

Latency is measured from the request's due time (so a stall counts, no coordinated omission)
and from the actual send (``service``). Every answer records y, so the test can tell which
version served it. Only 10.87.0.x addresses are targeted.
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed_support import api, outputs_y, predict_request


@dataclass(frozen=True)
class Target:
    host: str
    address: str
    port: int
    kind: str  # grpc | rest

    @property
    def name(self) -> str:
        return f"{self.host}/{self.kind}"


@dataclass
class Sample:
    target: str
    kind: str
    due: float
    sent: float
    done: float
    ok: bool
    y: float | None
    error: str = ""

    @property
    def latency(self) -> float:
        return self.done - self.due

    @property
    def service(self) -> float:
        return self.done - self.sent


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (nan when empty)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), -(-int(pct * len(ordered)) // 100)))
    return ordered[rank - 1]


@dataclass
class SteadyLoad:
    """``rate`` requests/s to each target from ``start()`` until ``stop()`` (or ``max_s``)."""

    model: str
    targets: list[Target]
    rate: float
    workers: int = 4
    timeout_s: float = 10.0
    max_s: float = 600.0
    x: float = 2.0
    # another model's gRPC request and what of its reply to record as ``y`` (default: a
    # half_plus_two request of ``x`` and its y); REST targets always send half_plus_two's
    grpc_request: Callable[[], Any] | None = None
    grpc_answer: Callable[[Any], float] | None = None
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._channels: list[Any] = []
        self.t0 = 0.0
        self.stopped_at = 0.0

    def start(self) -> SteadyLoad:
        grpc = api()["grpc"]
        self.t0 = time.monotonic() + 0.5
        for target in self.targets:
            counter = itertools.count()
            stub = None
            if target.kind == "grpc":
                channel = grpc.insecure_channel(f"{target.address}:{target.port}")
                self._channels.append(channel)
                stub = api()["service"].PredictionServiceStub(channel)
            for _ in range(self.workers):
                thread = threading.Thread(target=self._work, args=(target, counter, stub),
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.stopped_at = time.monotonic()
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        for channel in self._channels:
            channel.close()

    def _work(self, target: Target, counter: itertools.count[int], stub: Any) -> None:
        grpc = api()["grpc"]
        request = (self.grpc_request() if self.grpc_request is not None
                   else predict_request(self.model, [self.x]))
        answer = self.grpc_answer or (lambda reply: outputs_y(reply)[0])
        body = json.dumps({"instances": [[self.x]]}).encode()
        path = f"/v1/models/{self.model}:predict"
        conn: http.client.HTTPConnection | None = None
        end = self.t0 + self.max_s
        while True:
            with self._lock:
                k = next(counter)
            due = self.t0 + k / self.rate
            if self._stop.is_set() or due > end:
                break
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            sent = time.monotonic()
            y: float | None = None
            error = ""
            try:
                if target.kind == "grpc":
                    y = answer(stub.Predict(request, timeout=self.timeout_s))
                else:
                    if conn is None:
                        conn = http.client.HTTPConnection(target.address, target.port,
                                                          timeout=self.timeout_s)
                    conn.request("POST", path, body, {"Content-Type": "application/json"})
                    reply = conn.getresponse()
                    data = reply.read()
                    if reply.status != 200:
                        raise RuntimeError(f"HTTP {reply.status}: {data[:200]!r}")
                    y = float(json.loads(data)["predictions"][0][0])
            except grpc.RpcError as exc:
                error = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if conn is not None:
                    conn.close()
                    conn = None
            sample = Sample(target.name, target.kind, due, sent, time.monotonic(), not error, y,
                            error)
            with self._lock:
                self.samples.append(sample)
        if conn is not None:
            conn.close()

    # reading the results -------------------------------------------------------------------
    def between(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if start <= s.due < end]

    def failures(self) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if not s.ok]

    @staticmethod
    def summary(samples: list[Sample]) -> dict[str, Any]:
        """Count, failures, and latency percentiles (ms) overall and per kind."""
        def stats(chosen: list[Sample]) -> dict[str, Any]:
            lat = [s.latency * 1000 for s in chosen if s.ok]
            svc = [s.service * 1000 for s in chosen if s.ok]
            return {"requests": len(chosen), "failed": sum(not s.ok for s in chosen),
                    "p50_ms": round(percentile(lat, 50), 1),
                    "p99_ms": round(percentile(lat, 99), 1),
                    "max_ms": round(max(lat), 1) if lat else float("nan"),
                    "p99_service_ms": round(percentile(svc, 99), 1)}

        result = {"all": stats(samples)}
        for kind in ("grpc", "rest"):
            result[kind] = stats([s for s in samples if s.kind == kind])
        return result
