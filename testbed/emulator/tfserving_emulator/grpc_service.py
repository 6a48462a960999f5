"""gRPC front end: tensorflow.serving.PredictionService and ModelService, and the thread quota.

Behaviour per model_servers/prediction_service_impl.cc, model_service_impl.cc,
get_model_status_impl.cc, servables/tensorflow/get_model_metadata_impl.cc,
classification_service.cc, regression_service.cc and multi_inference_helper.cc.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
    status_pb2,
)

from . import log
from .core import ServerCore
from .metrics import Metrics
from .servable import Servable
from .status import Code, ServingError, invalid_argument

SIGNATURE_DEF = "signature_def"


def record_request(metrics: Metrics, model: str, api: str, entrypoint: str,
                   error: ServingError | None, started: float) -> None:
    """request_count for every request; request_latency for successful ones only."""
    metrics.request_count.add(model, error.code.name if error else "OK")
    if error is None:
        metrics.request_latency.observe((time.monotonic() - started) * 1e6, model, api,
                                        entrypoint)


def record_cut_at_deadline(metrics: Metrics, context: grpc.aio.ServicerContext, model: str,
                           api: str, started: float) -> None:
    """A handler that grpc.aio cancelled: counted DEADLINE_EXCEEDED when the call's deadline
    has passed. TFServing's handler is synchronous and runs on after the deadline: its run,
    whose timeout is that deadline, ends DEADLINE_EXCEEDED, and RecordModelRequestCount counts
    it (prediction_service_impl.cc, Predict, Classify and Regress). A call the client
    cancelled before its deadline is not counted here: the real run would go on to its own
    end, which the emulator no longer runs."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        record_request(metrics, model, api, "GRPC",
                       ServingError(Code.DEADLINE_EXCEEDED, "Deadline Exceeded"), started)


def model_metadata(servable: Servable) -> get_model_metadata_pb2.GetModelMetadataResponse:
    """GetModelMetadataResponse with every SignatureDef of the version's MetaGraphDef."""
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for key, signature in servable.model.meta_graph.signature_def.items():
        signature_map.signature_def[key].CopyFrom(signature)
    response.metadata[SIGNATURE_DEF].Pack(signature_map)
    return response


def get_metadata(core: ServerCore, request: get_model_metadata_pb2.GetModelMetadataRequest
                 ) -> get_model_metadata_pb2.GetModelMetadataResponse:
    """GetModelMetadataImpl::GetModelMetadata."""
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    if not request.metadata_field:
        raise invalid_argument("GetModelMetadataRequest must specify at least one "
                               "metadata_field")
    for field in request.metadata_field:
        if field != SIGNATURE_DEF:
            raise invalid_argument(f"Metadata field {field} is not supported")
    result = core.with_servable(request.model_spec, model_metadata)
    assert isinstance(result, get_model_metadata_pb2.GetModelMetadataResponse)
    return result


def get_status(core: ServerCore, request: get_model_status_pb2.GetModelStatusRequest
               ) -> get_model_status_pb2.GetModelStatusResponse:
    """GetModelStatusImpl::GetModelStatus (a version_label in the spec is ignored)."""
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    spec = request.model_spec
    version = spec.version.value if spec.HasField("version") else None
    response = get_model_status_pb2.GetModelStatusResponse()
    for number, state, error in core.version_states(spec.name, version):
        entry = response.model_version_status.add(version=number, state=int(state))
        entry.status.SetInParent()  # the real server always fills status (OK included)
        if error is not None:
            entry.status.error_code = int(error.code)
            entry.status.error_message = error.message
    return response


RESOURCE_EXHAUSTED_MESSAGE = "Server Threadpool Exhausted"


class ThreadQuota:
    """``--grpc_max_threads``: grpc::ResourceQuota::SetMaxThreads on the sync server.

    grpc's ThreadManager (src/cpp/thread_manager/thread_manager.cc) keeps one thread polling;
    when a request arrives and no thread can be reserved to poll after it, that request gets
    RESOURCE_EXHAUSTED "Server Threadpool Exhausted" (src/cpp/server/server_cc.cc). With one
    completion queue (ServerBuilder's default) a quota of N threads therefore runs at most
    N - 1 RPCs at once, whatever the service. A negative quota wraps to unlimited (size_t).
    Every handler of the server runs on one event loop, so a plain counter is enough.
    """

    def __init__(self, max_threads: int) -> None:
        self.capacity = max_threads - 1 if max_threads > 0 else None
        self.active = 0

    def enter(self) -> bool:
        """Take a thread for one RPC; False when the quota is used up."""
        if self.capacity is not None and self.active >= self.capacity:
            return False
        self.active += 1
        return True

    def leave(self) -> None:
        """Give the RPC's thread back."""
        self.active -= 1


Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def with_quota(method: Handler) -> Handler:
    """Run a servicer method under its ``self.quota`` (refused before the method runs)."""
    @functools.wraps(method)
    async def run(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        quota: ThreadQuota = self.quota
        if not quota.enter():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RESOURCE_EXHAUSTED_MESSAGE)
        try:
            return await method(self, request, context)
        finally:
            quota.leave()
    return run


def timeout_ms(context: grpc.aio.ServicerContext) -> int:
    """DeadlineToTimeoutMillis: the client's deadline becomes the TF run timeout (0: none)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > 2**31 / 1000:
        return 0
    return max(0, int(remaining * 1000))


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):  # type: ignore[misc]
    """tensorflow.serving.PredictionService on grpc.aio (prediction_service_impl.cc).

    Predict requests wait in batch queues as futures, not as blocked threads; the other APIs
    run on the executor."""

    def __init__(self, core: ServerCore, metrics: Metrics,
                 executor: concurrent.futures.Executor, quota: ThreadQuota) -> None:
        self.core = core
        self.metrics = metrics
        self.executor = executor
        self.quota = quota

    @with_quota
    async def Predict(self, request: predict_pb2.PredictRequest,
                      context: grpc.aio.ServicerContext) -> predict_pb2.PredictResponse:
        """PredictionService.Predict."""
        started = time.monotonic()
        error: ServingError | None = None
        response = None
        try:
            if not request.HasField("model_spec"):
                raise invalid_argument("Missing ModelSpec")
            servable = self.core.acquire(request.model_spec)
            try:
                plan = servable.prepare_predict(request)
                run_started = time.monotonic()
                outputs = await servable.session_run_async(plan.call, timeout_ms(context),
                                                           self.executor)
                response = servable.finish_predict(request, plan, outputs, run_started,
                                                   servable.version)
            finally:
                servable.release()
        except ServingError as exc:
            error = exc
        except asyncio.CancelledError:
            record_cut_at_deadline(self.metrics, context, request.model_spec.name, "Predict",
                                   started)
            raise
        record_request(self.metrics, request.model_spec.name, "Predict", "GRPC", error,
                       started)
        if error is not None:
            await context.abort(error.grpc_code, error.message)
        return response

    async def _blocking(self, api: str, request: Any, context: grpc.aio.ServicerContext,
                        run: Callable[[Servable, int], Any], *, record: bool = True) -> Any:
        started = time.monotonic()
        spec = request.tasks[0].model_spec if api == "MultiInference" and request.tasks \
            else getattr(request, "model_spec", model_pb2.ModelSpec())
        deadline = timeout_ms(context)
        error: ServingError | None = None
        response = None
        try:
            if api != "MultiInference" and not request.HasField("model_spec"):
                raise invalid_argument("Missing ModelSpec")
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(
                self.executor, self.core.with_servable, spec, lambda s: run(s, deadline))
        except ServingError as exc:
            error = exc
        except asyncio.CancelledError:
            if record:
                record_cut_at_deadline(self.metrics, context, spec.name, api, started)
            raise
        if record:
            record_request(self.metrics, spec.name, api, "GRPC", error, started)
        if error is not None:
            await context.abort(error.grpc_code, error.message)
        return response

    @with_quota
    async def Classify(self, request: classification_pb2.ClassificationRequest,
                       context: grpc.aio.ServicerContext
                       ) -> classification_pb2.ClassificationResponse:
        """PredictionService.Classify (classification_service.cc)."""
        return await self._blocking("Classify", request, context,
                                    lambda s, t: s.classify(request, t))

    @with_quota
    async def Regress(self, request: regression_pb2.RegressionRequest,
                      context: grpc.aio.ServicerContext) -> regression_pb2.RegressionResponse:
        """PredictionService.Regress (regression_service.cc)."""
        return await self._blocking("Regress", request, context,
                                    lambda s, t: s.regress(request, t))

    @with_quota
    async def MultiInference(self, request: inference_pb2.MultiInferenceRequest,
                             context: grpc.aio.ServicerContext
                             ) -> inference_pb2.MultiInferenceResponse:
        """PredictionService.MultiInference (multi_inference_helper.cc: the first task's
        ModelSpec picks the servable; no request metrics are recorded)."""
        return await self._blocking("MultiInference", request, context,
                                    lambda s, t: s.multi_inference(request, t), record=False)

    @with_quota
    async def GetModelMetadata(
            self, request: get_model_metadata_pb2.GetModelMetadataRequest,
            context: grpc.aio.ServicerContext) -> get_model_metadata_pb2.GetModelMetadataResponse:
        """PredictionService.GetModelMetadata."""
        try:
            return get_metadata(self.core, request)
        except ServingError as exc:
            await context.abort(exc.grpc_code, exc.message)
            raise


class ModelService(model_service_pb2_grpc.ModelServiceServicer):  # type: ignore[misc]
    """GetModelStatus and HandleReloadConfigRequest."""

    def __init__(self, core: ServerCore, metrics: Metrics,
                 executor: concurrent.futures.Executor, quota: ThreadQuota) -> None:
        self.core = core
        self.metrics = metrics
        self.executor = executor
        self.quota = quota

    @with_quota
    async def GetModelStatus(
            self, request: get_model_status_pb2.GetModelStatusRequest,
            context: grpc.aio.ServicerContext) -> get_model_status_pb2.GetModelStatusResponse:
        """ModelService.GetModelStatus."""
        try:
            return get_status(self.core, request)
        except ServingError as exc:
            await context.abort(exc.grpc_code, exc.message)
            raise

    @with_quota
    async def HandleReloadConfigRequest(
            self, request: model_management_pb2.ReloadConfigRequest,
            context: grpc.aio.ServicerContext) -> model_management_pb2.ReloadConfigResponse:
        """ModelService.HandleReloadConfigRequest: replace the model list, wait for new ones."""
        loop = asyncio.get_running_loop()
        response, error = await loop.run_in_executor(self.executor, self._reload, request)
        if error is not None:
            await context.abort(error.grpc_code, error.message)
        return response

    def _reload(self, request: model_management_pb2.ReloadConfigRequest
                ) -> tuple[model_management_pb2.ReloadConfigResponse, ServingError | None]:
        before = {name: self._metric_value(name) for name in request.metric_names}
        error: ServingError | None = None
        if request.config.WhichOneof("config") != "model_config_list":
            error = invalid_argument(
                "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
                "ModelConfigList is currently supported")
        else:
            for index, config in enumerate(request.config.model_config_list.config):
                log.info("model_service_impl.cc:47",
                         f"\nConfig entry\n\tindex : {index}\n\tpath : {config.base_path}"
                         f"\n\tname : {config.name}\n\tplatform : {config.model_platform}")
            try:
                self.core.reload_config(request.config)
            except ServingError as exc:
                error = exc
        response = model_management_pb2.ReloadConfigResponse()
        if error is not None:
            log.error("model_service_impl.cc:64", f"ReloadConfig failed: {error.message}")
            return response, error
        response.status.CopyFrom(status_pb2.StatusProto(error_code=int(Code.OK)))
        for name in request.metric_names:
            response.metric.add(name=name,
                                int64_value_increase=self._metric_value(name) - before[name])
        return response, None

    def _metric_value(self, name: str) -> int:
        for metric in vars(self.metrics).values():
            if metric.name == name and hasattr(metric, "value"):
                cells = getattr(metric, "_cells", {})
                if cells:
                    first = next(iter(cells.values()))
                    return int(first) if isinstance(first, int) else 0
        return 0
