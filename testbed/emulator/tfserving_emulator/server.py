"""Server::BuildAndStart and main() (model_servers/server.cc, main.cc).

Start-up order as in the real server: option validation, model config, batching parameters,
session config, parallelism, then ServerCore (batch scheduler, then the initial models, blocking
until they settle), then the gRPC port, then the monitoring config and the REST port. A start-up
error prints ``Failed to start server. Error: <status>`` on stdout; before gRPC started the
process exits 255, after it (a bad monitoring config) ``~Server()`` waits on the running gRPC
server, so gRPC keeps serving without REST.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import os
import signal
import sys
import threading
from typing import Any

import grpc

from . import SERVING_VERSION, flags, log, protos
from .status import Code, ServingError, invalid_argument

PROGRAM = "tensorflow_model_server"
DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"
_MAX_MESSAGE = 2**31 - 1


def single_model_config(name: str, base_path: str) -> Any:
    """BuildSingleModelConfig: one model with platform tensorflow."""
    log.info("server.cc:78", "Building single TensorFlow model file config:  model_name: "
             f"{name} model_base_path: {base_path}")
    config = protos.model_server_config()
    model = config.model_config_list.config.add()
    model.name = name
    model.base_path = base_path
    model.model_platform = "tensorflow"
    return config


def channel_arguments(text: str) -> list[tuple[str, Any]]:
    """parseGrpcChannelArgs: ``k=v,k=v``; values that parse as int32 are passed as ints."""
    out: list[tuple[str, Any]] = []
    if not text:
        return out
    for item in text.split(","):
        key, _, value = item.partition("=")
        try:
            number = int(value.strip())
            out.append((key, number if -(2**31) <= number < 2**31 else value))
        except ValueError:
            out.append((key, value))
    return out


def _validate_options(values: dict[str, Any]) -> None:
    if values["port"] == 0 and not values["grpc_socket_path"]:
        raise invalid_argument("At least one of server_options.grpc_port or "
                               "server_options.grpc_socket_path must be set.")
    if values["use_alts_credentials"] and values["ssl_config_file"]:
        raise invalid_argument("Either use_alts_credentials must be false or ssl_config_file "
                               "must be empty.")
    if not values["model_base_path"] and not values["model_config_file"]:
        raise invalid_argument("Both server_options.model_base_path and "
                               "server_options.model_config_file are empty!")


def _batching_parameters(values: dict[str, Any]) -> Any | None:
    if values["enable_batching"]:
        params = protos.batching_parameters()
        if values["batching_parameters_file"]:
            protos.parse_text_file(values["batching_parameters_file"], params)
        else:
            params.thread_pool_name.value = "model_server_batch_threads"
        return params
    if values["batching_parameters_file"]:
        raise invalid_argument("server_options.batching_parameters_file is set without setting "
                               "server_options.enable_batching to true.")
    return None


def _check_parallelism(values: dict[str, Any]) -> None:
    if (values["tensorflow_intra_op_parallelism"] > 0
            and values["tensorflow_inter_op_parallelism"] > 0
            and values["tensorflow_session_parallelism"] > 0):
        raise invalid_argument(
            "Either configure server_options.tensorflow_session_parallelism or "
            "(server_options.tensorflow_intra_op_parallelism, "
            "server_options.tensorflow_inter_op_parallelism) separately. You cannot "
            "configure all.")


def _session_config(values: dict[str, Any]) -> tuple[Any, bool]:
    """The session ConfigProto as server.cc builds it, and the effective gpu allow_growth.

    --tensorflow_session_config_file first, then the fraction flag over its gpu_options, then
    the parallelism flags (intra/inter when either is set, else session_parallelism for both).
    """
    from tensorflow.core.protobuf import config_pb2

    config = config_pb2.ConfigProto()
    path = values["tensorflow_session_config_file"]
    if path:
        protos.parse_text_file(path, config)
    config.gpu_options.per_process_gpu_memory_fraction = \
        values["per_process_gpu_memory_fraction"]
    intra, inter = (values["tensorflow_intra_op_parallelism"],
                    values["tensorflow_inter_op_parallelism"])
    if intra <= 0 and inter <= 0:
        intra = inter = values["tensorflow_session_parallelism"]
    config.intra_op_parallelism_threads = max(0, intra)
    config.inter_op_parallelism_threads = max(0, inter)
    allow_growth = bool(config.gpu_options.allow_growth)
    forced = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").lower()
    if forced in ("true", "false"):  # the env var overrides the config (gpu_device.cc)
        allow_growth = forced == "true"
    return config, allow_growth


class Server:
    """The whole model server: core, gRPC, REST, pollers."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.grpc_server: grpc.aio.Server | None = None
        self.rest: Any = None
        self.core: Any = None

    def build_and_start(self) -> None:
        """Server::BuildAndStart: raises ServingError on any start-up failure."""
        values = self.values
        _validate_options(values)
        if values["model_config_file"]:
            config = protos.parse_text_file(values["model_config_file"],
                                            protos.model_server_config())
        else:
            config = single_model_config(values["model_name"], values["model_base_path"])
        if values["platform_config_file"]:
            log.warning("server.cc", "--platform_config_file is not supported by the TFServing "
                        "emulator; using the flags instead")
        batching = _batching_parameters(values)
        session_config, allow_growth = _session_config(values)
        _check_parallelism(values)
        self.core = self._create_core(batching, session_config, allow_growth)
        self.core.reload_config(config)
        self._start_config_poller()
        self._start_grpc()
        self._start_rest()

    def _create_core(self, batching: Any | None, session_config: Any, allow_growth: bool
                     ) -> Any:
        from .batching import SharedBatchScheduler, options_from_proto
        from .core import CoreOptions, ServerCore
        from .metrics import Metrics
        from .servable import ServableOptions
        from .simgpu import reserve

        values = self.values
        self.metrics = Metrics()
        batching_options = options_from_proto(batching) if batching is not None else None
        scheduler = None
        if batching_options is not None:
            # SavedModelBundleFactory::Create, while ServerCore is created: before any load
            scheduler = SharedBatchScheduler(batching_options, self.metrics)
        gpu = reserve(values["per_process_gpu_memory_fraction"], allow_growth=allow_growth)
        self._gpu = gpu  # keeps the reservation (and its flocks) alive
        servable = ServableOptions(
            tags=tuple(values["saved_model_tags"].split(",")),
            batching=batching_options,
            enable_warmup=values["enable_model_warmup"],
            warmup_iterations=values["num_request_iterations_for_warmup"],
            method_name_check=values["enable_signature_method_name_check"],
            tensor_content=values["enable_serialization_as_tensor_content"])
        options = CoreOptions(
            servable=servable,
            file_system_poll_wait_seconds=values["file_system_poll_wait_seconds"],
            max_num_load_retries=values["max_num_load_retries"],
            load_retry_interval_micros=values["load_retry_interval_micros"],
            allow_version_labels_for_unavailable_models=values[
                "allow_version_labels_for_unavailable_models"],
            num_load_threads=values["num_load_threads"],
            session_config=session_config)
        return ServerCore(options, self.metrics, scheduler, gpu)

    def _start_config_poller(self) -> None:
        seconds = self.values["model_config_file_poll_wait_seconds"]
        path = self.values["model_config_file"]
        if seconds <= 0 or not path:
            return

        def poll() -> None:
            stop = threading.Event()
            while not stop.wait(seconds):
                self._reload_from_file(path)

        threading.Thread(target=poll, name="Server_fs_model_config_poll_thread",
                         daemon=True).start()

    def _reload_from_file(self, path: str) -> None:
        try:
            config = protos.parse_text_file(path, protos.model_server_config())
        except ServingError as exc:
            log.error("server.cc:168", f"Failed to read ModelServerConfig file: {exc.message}")
            return
        try:
            self.core.reload_config(config)
        except ServingError as exc:
            log.error("server.cc:175",
                      f"PollFilesystemAndReloadConfig failed to ReloadConfig: {exc.message}")

    def _start_grpc(self) -> None:
        """Build the grpc.aio server on its own event-loop thread and start it."""
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="grpc_loop", daemon=True).start()
        future = asyncio.run_coroutine_threadsafe(self._grpc_server(), self._loop)
        self.grpc_server = future.result()
        values = self.values
        if values["port"] != 0:
            log.info("server.cc:400", f"Running gRPC ModelServer at 0.0.0.0:{values['port']} ...")
        if values["grpc_socket_path"]:
            log.info("server.cc:404", "Running gRPC ModelServer at UNIX socket "
                     f"{values['grpc_socket_path']} ...")

    async def _grpc_server(self) -> grpc.aio.Server:
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        from .grpc_service import ModelService, PredictionService, ThreadQuota

        values = self.values
        options = [("grpc.max_send_message_length", _MAX_MESSAGE),
                   ("grpc.max_receive_message_length", _MAX_MESSAGE)]
        options += channel_arguments(values["grpc_channel_arguments"])
        max_threads = values["grpc_max_threads"]
        if max_threads == 0:
            # ThreadManager::Initialize cannot reserve its one polling thread: grpc aborts
            log.error("thread_manager.cc", "No thread quota available to even create the "
                      "minimum required polling threads (i.e 1). Unable to start the thread "
                      "manager")
            sys.stderr.flush()
            os.abort()
        # Threads for blocking work: model runs without batching, Classify/Regress, reloads.
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(4, min(max_threads, 512) if max_threads > 0 else 512),
            thread_name_prefix="grpc_work")
        quota = ThreadQuota(max_threads)
        server = grpc.aio.server(options=options)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelService(self.core, self.metrics, executor, quota), server)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionService(self.core, self.metrics, executor, quota), server)
        if values["enable_grpc_healthcheck_service"]:
            from .health import handler

            server.add_generic_rpc_handlers((handler(quota),))
        try:
            if values["port"] != 0 and server.add_insecure_port(
                    f"0.0.0.0:{values['port']}") == 0:
                raise RuntimeError(values["port"])
            if values["grpc_socket_path"]:
                server.add_insecure_port("unix:" + values["grpc_socket_path"])
        except RuntimeError as exc:
            raise invalid_argument("Failed to BuildAndStart gRPC server") from exc
        await server.start()
        return server

    def _start_rest(self) -> None:
        from .rest import RestApi, RestServer

        values = self.values
        port = values["rest_api_port"]
        if port == 0:
            return
        if port == values["port"]:
            log.error("server.cc:430", "server_options.http_port cannot be same as grpc_port. "
                      "Please use a different port for HTTP/REST API. Skipped exporting "
                      "HTTP/REST API.")
            return
        monitoring = protos.monitoring_config()
        if values["monitoring_config_file"]:
            protos.parse_text_file(values["monitoring_config_file"], monitoring)
        metrics_path = None
        if monitoring.prometheus_config.enable:
            metrics_path = monitoring.prometheus_config.path or DEFAULT_METRICS_PATH
        address = f"localhost:{port}"
        try:
            self.rest = RestServer(port, RestApi(self.core, self.metrics,
                                                 values["rest_api_enable_cors_support"],
                                                 values["rest_api_timeout_in_ms"]),
                                   metrics_path)
        except OSError:
            log.error("server.cc:427", f"Failed to start HTTP Server at {address}")
            return
        self.rest.start()
        log.info("server.cc:421", f"Exporting HTTP/REST API at:{address} ...")

    def wait_for_termination(self) -> None:
        """Block forever (the real server has no clean shutdown path either)."""
        threading.Event().wait()


def _versions() -> str:
    tf_version = "unknown"
    for distribution in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu"):
        try:
            tf_version = importlib.metadata.version(distribution)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return (f"TensorFlow ModelServer: {SERVING_VERSION}-emulator\n"
            f"TensorFlow Library: {tf_version}\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse flags like TF, then build and run the server."""
    args = sys.argv[1:] if argv is None else argv
    result = flags.parse(args)
    for message in result.errors:
        log.error("tensorflow/core/util/command_line_flags.cc", message)
    usage = flags.usage(os.environ.get("TFS_EMULATOR_PROGRAM", PROGRAM))
    if not result.ok:
        sys.stdout.write(usage)
        sys.stdout.flush()
        return 255
    if result.values["version"]:
        sys.stdout.write(_versions())
        return 0
    if result.unknown:
        sys.stdout.write(f"unknown argument: {result.unknown[0]}\n{usage}")
        sys.stdout.flush()
    # No SIGTERM handler, like the real binary: the default action ends the process at once,
    # except as PID 1 of a container, where the kernel drops signals that have no handler.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    server = Server(result.values)
    try:
        server.build_and_start()
    except Exception as exc:
        error = exc if isinstance(exc, ServingError) else \
            ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
        sys.stdout.write(f"Failed to start server. Error: {error}\n")
        sys.stdout.flush()
        if server.grpc_server is None:
            return 255
        # main() returns, but ~Server() waits for the gRPC server, which keeps serving: with
        # no REST port and no metrics endpoint (server.cc BuildAndStart, ~Server)
    server.wait_for_termination()
    return 0
