"""A Predict that grpc.aio cancels at its deadline is still counted, as TFServing counts it.

TFServing's gRPC handlers are synchronous (prediction_service_impl.cc): the run, whose timeout
is the call's deadline, goes on after the deadline, ends DEADLINE_EXCEEDED, and
RecordModelRequestCount counts it. grpc.aio instead cancels the emulator's handler task when
the deadline passes; on a busy machine that can come before the run's own timeout does, and
the request was then missing from ``request_count``. The race is driven here directly: the
handler is awaiting a run that never ends, and the task is cancelled as grpc.aio does."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from emulator_support import EMULATOR_DIR
from tensorflow_serving.apis import predict_pb2

sys.path.insert(0, str(EMULATOR_DIR))
from tfserving_emulator.grpc_service import PredictionService, ThreadQuota
from tfserving_emulator.metrics import Metrics


class NeverEndingRun:
    """A servable whose run waits for ever (the emulator's part of a slow run)."""

    version = 1

    def prepare_predict(self, request: predict_pb2.PredictRequest) -> Any:
        return type("Plan", (), {"call": None})()

    async def session_run_async(self, call: Any, timeout_ms: int, executor: Any) -> Any:
        await asyncio.Event().wait()

    def release(self) -> None:
        return None


class Core:
    def acquire(self, spec: Any) -> NeverEndingRun:
        return NeverEndingRun()


class Context:
    """The call's context: ``remaining`` seconds to its deadline when the handler is cut."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


def cut(remaining: float | None) -> Metrics:
    """Run Predict until it awaits the run, cancel it as grpc.aio does; the metrics."""
    metrics = Metrics()
    service = PredictionService(Core(), metrics, executor=None, quota=ThreadQuota(0))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"

    async def scenario() -> None:
        call = asyncio.ensure_future(service.Predict(request, Context(remaining)))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(scenario())
    return metrics


def test_a_call_cut_at_its_deadline_counts_as_deadline_exceeded() -> None:
    metrics = cut(remaining=-0.001)
    assert metrics.request_count.value("m", "DEADLINE_EXCEEDED") == 1
    assert metrics.request_count.value("m", "OK") == 0


def test_a_call_the_client_cancelled_before_its_deadline_is_not_counted() -> None:
    for remaining in (5.0, None):
        metrics = cut(remaining=remaining)
        assert metrics.request_count.value("m", "DEADLINE_EXCEEDED") == 0
        assert metrics.request_count.value("m", "OK") == 0
