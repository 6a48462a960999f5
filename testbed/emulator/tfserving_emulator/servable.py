"""A servable version: a loaded SavedModel plus its batching queues, predict and warmup.

Predict follows servables/tensorflow/predict_util.cc (signature lookup, input size check,
output filter, response model_spec); warmup follows saved_model_warmup_util.cc (TFRecord of
PredictionLog under assets.extra/tf_serving_warmup_requests, at most 1000 records, DATA_LOSS
for a non-TFRecord file, each record replayed num_request_iterations times, inside load).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import threading
import time

import numpy as np
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from . import log
from .batching import BatchingOptions, BatchQueue, SharedBatchScheduler, validate_for_session
from .metrics import Metrics
from .model import LoadedModel, Signature
from .status import Code, ServingError, failed_precondition, invalid_argument
from .tensors import to_numpy, to_proto

DEFAULT_SIGNATURE = "serving_default"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000
PREDICT_METHODS = ("tensorflow/serving/predict", "tensorflow/serving/classify",
                   "tensorflow/serving/regress")


@dataclasses.dataclass(frozen=True)
class ServableOptions:
    """Server-wide knobs that shape how a version is loaded and run."""

    tags: tuple[str, ...] = ("serve",)
    batching: BatchingOptions | None = None
    enable_warmup: bool = True
    warmup_iterations: int = 0
    method_name_check: bool = False
    tensor_content: bool = False


class Servable:
    """One loaded model version, ready to answer Predict."""

    def __init__(self, name: str, version: int, model: LoadedModel,
                 options: ServableOptions) -> None:
        self.name = name
        self.version = version
        self.model = model
        self.options = options
        self.metrics: Metrics | None = None
        self.queues: dict[str, BatchQueue] = {}
        self._inflight = 0
        self._idle = threading.Condition()

    # ---------------------------------------------------------------- lifecycle

    def attach_batching(self, scheduler: SharedBatchScheduler) -> None:
        """Create one batching queue per signature (like CreateBatchingSession)."""
        assert self.options.batching is not None
        validate_for_session(self.options.batching)
        for key in self.model.signatures:
            if key.startswith("__"):
                continue

            def run(inputs: dict[str, np.ndarray], key: str = key) -> dict[str, np.ndarray]:
                return self.model.run(key, inputs)

            self.queues[key] = scheduler.add_queue(self.options.batching, run)

    def detach_batching(self, scheduler: SharedBatchScheduler) -> None:
        """Remove this version's queues from the shared scheduler."""
        for queue in self.queues.values():
            scheduler.remove_queue(queue)
        self.queues.clear()

    def acquire(self) -> None:
        """Count an in-flight request (unload waits for them, like ServableHandle)."""
        with self._idle:
            self._inflight += 1

    def release(self) -> None:
        """End of an in-flight request."""
        with self._idle:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        """Block until no request holds this version."""
        with self._idle:
            while self._inflight:
                self._idle.wait()

    # ---------------------------------------------------------------- predict

    def signature(self, key: str) -> Signature:
        """The signature ``key`` (empty = serving_default) or FAILED_PRECONDITION."""
        key = key or DEFAULT_SIGNATURE
        try:
            return self.model.signatures[key]
        except KeyError as exc:
            raise failed_precondition(f'Serving signature key "{key}" not found.') from exc

    def predict(self, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
        """Run a PredictRequest and build the PredictResponse (blocking)."""
        signature, inputs, aliases = self._prepare(request)
        started = time.monotonic()
        outputs = self.run(signature.key, inputs)
        return self._respond(signature, outputs, aliases, started)

    async def predict_async(self, request: predict_pb2.PredictRequest,
                            executor: concurrent.futures.Executor | None
                            ) -> predict_pb2.PredictResponse:
        """Predict from an event loop: batch queues are awaited, direct runs go to ``executor``."""
        signature, inputs, aliases = self._prepare(request)
        started = time.monotonic()
        queue = self.queues.get(signature.key)
        if queue is not None:
            outputs = await queue.scheduler.submit_async(queue, inputs)
        else:
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(executor, self.model.run, signature.key, inputs)
        return self._respond(signature, outputs, aliases, started)

    def _prepare(self, request: predict_pb2.PredictRequest
                 ) -> tuple[Signature, dict[str, np.ndarray], list[str]]:
        signature = self.signature(request.model_spec.signature_name)
        self._check_method(signature)
        _check_inputs_size(signature, set(request.inputs.keys()))
        inputs = {}
        for alias, proto in request.inputs.items():
            if alias not in signature.inputs:
                raise invalid_argument(
                    f"input tensor alias not found in signature: {alias}. Inputs expected to "
                    f"be in the set {{{','.join(sorted(signature.inputs))}}}.")
            inputs[alias] = to_numpy(proto)
        aliases = _output_aliases(signature, list(request.output_filter))
        return signature, inputs, aliases

    def _respond(self, signature: Signature, outputs: dict[str, np.ndarray], aliases: list[str],
                 started: float) -> predict_pb2.PredictResponse:
        if self.metrics is not None:
            self.metrics.runtime_latency.observe((time.monotonic() - started) * 1e6, self.name,
                                                 "Predict", "TF1")
        response = predict_pb2.PredictResponse()
        response.model_spec.name = self.name
        response.model_spec.version.value = self.version
        response.model_spec.signature_name = signature.key
        for alias in aliases:
            response.outputs[alias].CopyFrom(
                to_proto(outputs[alias], as_content=self.options.tensor_content))
        return response

    def run(self, key: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a signature, through its batching queue when batching is on."""
        queue = self.queues.get(key)
        if queue is not None:
            return queue.scheduler.submit(queue, inputs)
        return self.model.run(key, inputs)

    def _check_method(self, signature: Signature) -> None:
        if self.options.method_name_check and signature.method_name not in PREDICT_METHODS:
            raise ServingError(
                Code.INTERNAL,
                "Expected prediction signature method_name to be one of {"
                + ", ".join(PREDICT_METHODS) + f"}}. Was: {signature.method_name}")

    # ---------------------------------------------------------------- warmup

    def warmup(self, metrics: Metrics) -> None:
        """Replay the warmup records, if any; raise on failure (a failed load)."""
        path = os.path.join(self.model.export_dir, WARMUP_FILE)
        if not os.path.exists(path):
            log.info("saved_model_warmup_util.cc:86", f"No warmup data file found at {path}")
            return
        iterations = self.options.warmup_iterations if self.options.warmup_iterations > 0 \
            else 1
        log.info("saved_model_warmup_util.cc:97",
                 f"Starting to read warmup data for model at {path} with model-warmup-options "
                 + (f"num_request_iterations {{ value: {iterations} }}"
                    if self.options.warmup_iterations > 0 else ""))
        start = time.monotonic()
        count, error = self._replay(path, iterations)
        latency = (time.monotonic() - start) * 1e6
        status = "OK" if error is None else str(error)
        metrics.warmup_latency.observe(latency, self.model.export_dir, status)
        metrics.warmup_records_read.add(self.model.export_dir, status, amount=count)
        if error is not None:
            raise error
        log.info("saved_model_warmup_util.cc:240",
                 f"Finished reading warmup data for model at {path}. Number of warmup records "
                 f"read: {count}. Elapsed time (microseconds): {int(latency)}.")

    def _replay(self, path: str, iterations: int) -> tuple[int, ServingError | None]:
        import tensorflow as tf

        count = 0
        try:
            for record in tf.compat.v1.io.tf_record_iterator(path):
                log_entry = prediction_log_pb2.PredictionLog()
                try:
                    log_entry.ParseFromString(record)
                except Exception:
                    return count, invalid_argument(
                        f"Failed to parse warmup record: {record!r} from {path}")
                for _ in range(iterations):
                    self._replay_one(log_entry)
                count += 1
                if count > MAX_WARMUP_RECORDS:
                    return count, invalid_argument(
                        f"Number of warmup records exceeds the maximum ({MAX_WARMUP_RECORDS}) "
                        f"at {path}")
        except ServingError as exc:
            return count, exc
        except tf.errors.DataLossError as exc:
            return count, ServingError(
                Code.DATA_LOSS,
                f"{exc.message}. Please verify your warmup data is in TFRecord format.")
        except tf.errors.OpError as exc:
            return count, ServingError(Code(exc.error_code), exc.message)
        return count, None

    def _replay_one(self, entry: prediction_log_pb2.PredictionLog) -> None:
        kind = entry.WhichOneof("log_type")
        if kind == "predict_log":
            request = predict_pb2.PredictRequest()
            request.CopyFrom(entry.predict_log.request)
            self.predict(request)
            return
        if kind in ("classify_log", "regress_log", "multi_inference_log"):
            raise ServingError(Code.UNIMPLEMENTED,
                               f"Warmup {kind} records are not supported by the emulator")
        raise invalid_argument("Unsupported log_type for warmup: " + str(kind))


def _check_inputs_size(signature: Signature, request_inputs: set[str]) -> None:
    expected = set(signature.inputs)
    # predict_util.cc VerifyRequestInputsSize (signatures here never have defaults)
    if len(request_inputs) != len(expected):
        extra = sorted(request_inputs - expected)
        missing = sorted(expected - request_inputs)
        raise invalid_argument(
            f"input size does not match signature: {len(request_inputs)}!={len(expected)} "
            f"len({{{','.join(sorted(request_inputs))}}}) != "
            f"len({{{','.join(sorted(expected))}}}). Sent extra: {{{','.join(extra)}}}. "
            f"Missing but required: {{{','.join(missing)}}}.")


def _output_aliases(signature: Signature, output_filter: list[str]) -> list[str]:
    seen: set[str] = set()
    for alias in output_filter:
        if alias not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be "
                f"in the set {{{','.join(sorted(signature.outputs))}}}.")
        if alias in seen:
            raise invalid_argument("duplicate output tensor alias: " + alias)
        seen.add(alias)
    return output_filter or list(signature.outputs)
