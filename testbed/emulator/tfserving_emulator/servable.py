"""A servable version: a loaded SavedModel, its BatchingSession queues, the APIs and warmup.

The "session" of a version is the model's Session::Run, wrapped like TFServing's
SavedModelBundleFactory does (servables/tensorflow/saved_model_bundle_factory.cc,
bundle_factory_util.cc WrapSessionForBatching): with batching on, a Run whose fed and fetched
tensor names match a queue goes through that queue, any other Run gets a queue of its own.
Warmup (saved_model_warmup.cc, saved_model_warmup_util.cc) replays predict, classify, regress
and multi_inference records through that session inside the load, before AVAILABLE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import threading
import time
from collections.abc import Sequence

import numpy as np
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

from . import inference, log, tfruntime
from .batching import BatchingOptions, BatchQueue, SharedBatchScheduler, check_allowed_sizes
from .inference import SessionCall
from .metrics import Metrics
from .model import LoadedModel
from .status import Code, ServingError, invalid_argument

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000
_LOG_TYPES = {"predict_streamed_log": 7, "session_run_log": 5}  # PredictionLog field numbers


@dataclasses.dataclass(frozen=True)
class ServableOptions:
    """Server-wide knobs that shape how a version is loaded and run."""

    tags: tuple[str, ...] = ("serve",)
    batching: BatchingOptions | None = None
    enable_warmup: bool = True
    warmup_iterations: int = 0
    method_name_check: bool = False
    tensor_content: bool = False


def deadline_for(timeout_ms: int) -> float | None:
    """The monotonic deadline of a RunOptions timeout (None: no timeout)."""
    return time.monotonic() + timeout_ms / 1000 if timeout_ms > 0 else None


class Servable:
    """One loaded model version, ready to answer the PredictionService APIs."""

    def __init__(self, name: str, version: int, model: LoadedModel,
                 options: ServableOptions, metrics: Metrics) -> None:
        self.name = name
        self.version = version
        self.model = model
        self.options = options
        self.metrics = metrics
        self.scheduler: SharedBatchScheduler | None = None
        self.queues: dict[tuple[frozenset[str], frozenset[str]], BatchQueue] = {}
        # the same tensor names in the same order: the common case, without building sets
        self._by_order: dict[tuple[tuple[str, ...], tuple[str, ...]], BatchQueue] = {}
        self._queues_lock = threading.Lock()
        self._inflight = 0
        self._idle = threading.Condition()

    # ---------------------------------------------------------------- lifecycle

    def attach_batching(self, scheduler: SharedBatchScheduler) -> None:
        """WrapSessionForBatching: check the sizes, then one queue per SignatureDef's tensors."""
        assert self.options.batching is not None
        check_allowed_sizes(self.options.batching)
        self.scheduler = scheduler
        for signature in self.model.signature_defs.values():
            self._queue([i.name for i in signature.inputs.values()],
                        [o.name for o in signature.outputs.values()])

    def _queue(self, inputs: Sequence[str], outputs: Sequence[str]) -> BatchQueue:
        fast = (tuple(inputs), tuple(outputs))
        queue = self._by_order.get(fast)
        if queue is not None:
            return queue
        key = (frozenset(inputs), frozenset(outputs))
        with self._queues_lock:
            queue = self.queues.get(key)
            if queue is None:
                assert self.scheduler is not None and self.options.batching is not None
                queue = self.scheduler.add_queue(self.options.batching, inputs, outputs,
                                                 self.model.run)
                self.queues[key] = queue
            self._by_order[fast] = queue
            return queue

    def detach_batching(self) -> None:
        """Remove this version's queues from the shared scheduler."""
        if self.scheduler is not None:
            for queue in self.queues.values():
                self.scheduler.remove_queue(queue)
        self.queues.clear()
        self._by_order.clear()

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

    # ---------------------------------------------------------------- the session

    def session_run(self, call: SessionCall, timeout_ms: int) -> list[np.ndarray]:
        """Session::Run through the batching wrapper when batching is on (blocking)."""
        if self.scheduler is None:
            return self.model.run(call.feeds, call.fetches, timeout_ms)
        queue = self._queue([n for n, _ in call.feeds], call.fetches)
        return self.scheduler.submit(queue, dict(call.feeds), call.fetches,
                                     deadline_for(timeout_ms))

    async def session_run_async(self, call: SessionCall, timeout_ms: int,
                                executor: concurrent.futures.Executor | None
                                ) -> list[np.ndarray]:
        """The same from an event loop: batch queues are awaited, direct runs use ``executor``."""
        if self.scheduler is None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, self.model.run, call.feeds,
                                              call.fetches, timeout_ms)
        queue = self._queue([n for n, _ in call.feeds], call.fetches)
        return await self.scheduler.submit_async(queue, dict(call.feeds), call.fetches,
                                                 deadline_for(timeout_ms))

    # ---------------------------------------------------------------- APIs

    def _latency(self, model: str, api: str, started: float) -> None:
        self.metrics.runtime_latency.observe((time.monotonic() - started) * 1e6, model, api,
                                             "TF1")

    def prepare_predict(self, request: predict_pb2.PredictRequest) -> inference.PredictPlan:
        """Signature, feeds and fetches of a PredictRequest (errors before any run)."""
        return inference.prepare_predict(self.model.signature_defs, request,
                                         method_check=self.options.method_name_check,
                                         indexes=self.model.indexes)

    def finish_predict(self, request: predict_pb2.PredictRequest, plan: inference.PredictPlan,
                       outputs: list[np.ndarray], started: float, version: int | None
                       ) -> predict_pb2.PredictResponse:
        """Record the runtime latency and build the PredictResponse."""
        self._latency(request.model_spec.name, "Predict", started)
        return inference.predict_response(plan, outputs, request.model_spec.name, version,
                                          tensor_content=self.options.tensor_content)

    def predict_arrays(self, request: predict_pb2.PredictRequest, timeout_ms: int = 0
                       ) -> tuple[inference.PredictPlan, list[np.ndarray]]:
        """Predict up to the fetched arrays (blocking; REST answers from these)."""
        plan = self.prepare_predict(request)
        started = time.monotonic()
        outputs = self.session_run(plan.call, timeout_ms)
        self._latency(request.model_spec.name, "Predict", started)
        return plan, outputs

    def predict(self, request: predict_pb2.PredictRequest, timeout_ms: int = 0,
                version: int | None = -1) -> predict_pb2.PredictResponse:
        """Predict, blocking (warmup)."""
        plan, outputs = self.predict_arrays(request, timeout_ms)
        return inference.predict_response(plan, outputs, request.model_spec.name,
                                          self.version if version == -1 else version,
                                          tensor_content=self.options.tensor_content)

    def _examples_call(self, signature_tensors: tuple[str, tuple[str, ...]],
                       examples: np.ndarray) -> SessionCall:
        feed, fetches = signature_tensors
        return SessionCall(((feed, examples),), fetches)

    def classify(self, request: classification_pb2.ClassificationRequest, timeout_ms: int = 0,
                 version: int | None = -1) -> classification_pb2.ClassificationResponse:
        """classifier.cc RunClassify."""
        check = self.options.method_name_check
        signature = inference.classify_signature(self.model.signature_defs,
                                                 request.model_spec, method_check=check)
        tensors = inference.classification_tensors(signature, method_check=check)
        examples = inference.serialized_examples(request.input)
        started = time.monotonic()
        outputs = self.session_run(self._examples_call(tensors, examples), timeout_ms)
        self._latency(request.model_spec.name, "Classify", started)
        response = classification_pb2.ClassificationResponse(
            model_spec=inference.make_model_spec(
                request.model_spec.name, request.model_spec.signature_name,
                self.version if version == -1 else version))
        response.result.CopyFrom(inference.classification_result(
            signature, len(examples), tensors[1], outputs))
        return response

    def regress(self, request: regression_pb2.RegressionRequest, timeout_ms: int = 0,
                version: int | None = -1) -> regression_pb2.RegressionResponse:
        """regressor.cc RunRegress."""
        check = self.options.method_name_check
        signature = inference.regress_signature(self.model.signature_defs, request.model_spec,
                                                method_check=check)
        tensors = inference.regression_tensors(signature, method_check=check)
        examples = inference.serialized_examples(request.input)
        started = time.monotonic()
        outputs = self.session_run(self._examples_call(tensors, examples), timeout_ms)
        self._latency(request.model_spec.name, "Regress", started)
        response = regression_pb2.RegressionResponse(
            model_spec=inference.make_model_spec(
                request.model_spec.name, request.model_spec.signature_name,
                self.version if version == -1 else version))
        response.result.CopyFrom(inference.regression_result(
            signature, len(examples), tensors[1], outputs))
        return response

    def multi_inference(self, request: inference_pb2.MultiInferenceRequest,
                        timeout_ms: int = 0, version: int | None = -1
                        ) -> inference_pb2.MultiInferenceResponse:
        """multi_inference.cc RunMultiInference (records request_example_counts)."""
        plan = inference.prepare_multi(self.model.signature_defs, request,
                                       method_check=self.options.method_name_check)
        outputs = self.session_run(plan.call, timeout_ms)
        examples = len(plan.call.feeds[0][1])
        self.metrics.example_counts.observe(examples, plan.model)
        self.metrics.example_count_total.add(plan.model, amount=examples)
        return inference.multi_response(plan, examples, outputs,
                                        self.version if version == -1 else version)

    # ---------------------------------------------------------------- warmup

    def warmup(self) -> None:
        """Replay the warmup records, if any; raise on failure (a failed load)."""
        path = os.path.join(self.model.export_dir, WARMUP_FILE)
        if not os.path.exists(path):
            log.info("saved_model_warmup_util.cc:86", f"No warmup data file found at {path}")
            return
        iterations = max(1, self.options.warmup_iterations)
        log.info("saved_model_warmup_util.cc:97",
                 f"Starting to read warmup data for model at {path} with model-warmup-options "
                 + (f"num_request_iterations {{ value: {iterations} }}"
                    if self.options.warmup_iterations > 0 else ""))
        start = time.monotonic()
        count, error = self._replay(path, iterations)
        latency = (time.monotonic() - start) * 1e6
        status = "OK" if error is None else str(error)
        self.metrics.warmup_latency.observe(latency, self.model.export_dir, status)
        self.metrics.warmup_records_read.add(self.model.export_dir, status, amount=count)
        if error is not None:
            raise error
        log.info("saved_model_warmup_util.cc:240",
                 f"Finished reading warmup data for model at {path}. Number of warmup records "
                 f"read: {count}. Elapsed time (microseconds): {int(latency)}.")

    def _replay(self, path: str, iterations: int) -> tuple[int, ServingError | None]:
        tf_errors = tfruntime.errors()
        count = 0
        try:
            for record in tfruntime.tf_record_iterator(path):
                entry = prediction_log_pb2.PredictionLog()
                try:
                    entry.ParseFromString(record)
                except Exception:
                    return count, invalid_argument(
                        f"Failed to parse warmup record: {record!r} from {path}")
                for _ in range(iterations):
                    self._replay_one(entry)
                count += 1
                if count > MAX_WARMUP_RECORDS:
                    return count, invalid_argument(
                        f"Number of warmup records exceeds the maximum ({MAX_WARMUP_RECORDS}) "
                        f"at {path}")
        except ServingError as exc:
            return count, exc
        except tf_errors.DataLossError as exc:
            return count, ServingError(
                Code.DATA_LOSS,
                f"{exc.message}. Please verify your warmup data is in TFRecord format.")
        except tf_errors.OpError as exc:
            return count, ServingError(Code(exc.error_code), exc.message)
        return count, None

    def _replay_one(self, entry: prediction_log_pb2.PredictionLog) -> None:
        """saved_model_warmup.cc RunWarmupRequest (no servable version in the responses)."""
        kind = entry.WhichOneof("log_type")
        if kind == "predict_log":
            self.predict(entry.predict_log.request, version=None)
        elif kind == "classify_log":
            self.classify(entry.classify_log.request, version=None)
        elif kind == "regress_log":
            self.regress(entry.regress_log.request, version=None)
        elif kind == "multi_inference_log":
            self.multi_inference(entry.multi_inference_log.request, version=None)
        elif kind in _LOG_TYPES:
            raise ServingError(Code.UNIMPLEMENTED,
                               f"Unsupported log_type for warmup: {_LOG_TYPES[kind]}")
