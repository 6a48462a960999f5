"""Probes of one TFServing server: gRPC version status, signature and predict; over HTTP its REST
status and its metrics.

Messages come from ``tfsapi`` (the toolkit's own definitions of TFServing's messages), called
by their method paths (``/tensorflow.serving.PredictionService/Predict`` ...) on a plain gRPC
channel: no generated stubs, no TensorFlow.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from tfsdeploy.core.inventory.layout import host_port
from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving.tensors import Tensor

STATE_NAMES = {0: "UNKNOWN", 10: "START", 20: "LOADING", 30: "AVAILABLE", 40: "UNLOADING",
               50: "END"}


@dataclass(frozen=True)
class VersionStatus:
    """One version as GetModelStatus reports it."""

    version: int
    state: str
    error_code: int
    error_message: str


def http_url(address: str, port: int, path: str = "") -> str:
    """``http://<address>:<port><path>`` with an IPv6 address bracketed (``layout.host_port``:
    written bare, ``fd00::11:8511`` is no URL of port 8511)."""
    return f"http://{host_port(address, port)}{path}"


# The probes go straight to the hosts, never through a proxy named by the environment: httpx
# honours HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY by default (``trust_env=True``,
# httpx's _api.py and _utils.get_environment_proxies), and gRPC's C core honours grpc_proxy,
# https_proxy and http_proxy (grpc doc/environment_variables.md) unless the channel argument
# ``grpc.enable_http_proxy`` (GRPC_ARG_ENABLE_HTTP_PROXY) is 0. A proxy in cron's
# environment would otherwise answer for the fleet (an error page, or a 200 without metrics).
TRUST_ENV = False
GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.enable_http_proxy", 0)]


@functools.cache
def tls() -> ssl.SSLContext:
    """The TLS context httpx would build for the probes' clients (verifying, certifi's CAs,
    ``trust_env`` as theirs), made once per process: httpx builds one for every client it
    makes unless given one, 19-36 ms of CPU each here (`httpx.Client()`; 0.1-0.2 ms when
    given this one). The probes' URLs are plain HTTP (``http_url``): the context is never
    used on them, only no longer rebuilt per probe."""
    return httpx.create_ssl_context(trust_env=TRUST_ENV)


def _method(channel: grpc.Channel, path: str, response: str) -> Any:
    return channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=tfsapi.message_class(response).FromString)


class SlotClient:
    """One gRPC channel to one slot of one host."""

    def __init__(self, address: str, port: int, model: str) -> None:
        self.target = host_port(address, port)
        self.model = model
        self._channel = grpc.insecure_channel(self.target, options=GRPC_OPTIONS)
        self._status = _method(self._channel, tfsapi.STATUS_METHOD, tfsapi.STATUS_RESPONSE)
        self._metadata = _method(self._channel, tfsapi.METADATA_METHOD,
                                 tfsapi.METADATA_RESPONSE)
        self._predict = _method(self._channel, tfsapi.PREDICT_METHOD, tfsapi.PREDICT_RESPONSE)

    def status(self, *, timeout: float = 5.0) -> list[VersionStatus]:
        """All versions the server knows for the model (NOT_FOUND -> empty list)."""
        request: Any = tfsapi.new_message(tfsapi.STATUS_REQUEST)
        request.model_spec.name = self.model
        try:
            reply = self._status(request, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise
        return [VersionStatus(int(v.version), STATE_NAMES.get(v.state, str(v.state)),
                              int(v.status.error_code), v.status.error_message)
                for v in reply.model_version_status]

    def signatures(self, version: int, *, timeout: float = 10.0
                   ) -> dict[str, dict[str, dict[str, tuple[str, tuple[int, ...]]]]]:
        """Every signature of the version (GetModelMetadata): name -> {"inputs"|"outputs":
        {tensor: (dtype name, shape)}}."""
        request: Any = tfsapi.new_message(tfsapi.METADATA_REQUEST)
        request.model_spec.name = self.model
        request.model_spec.version.value = version
        request.metadata_field.append("signature_def")
        reply = self._metadata(request, timeout=timeout)
        defs: Any = tfsapi.new_message(tfsapi.SIGNATURE_DEF_MAP)
        defs.ParseFromString(reply.metadata["signature_def"].value)
        return {name: {kind: {key: (tfsapi.dtype_name(info.dtype),
                                    tuple(-1 if info.tensor_shape.unknown_rank else d.size
                                          for d in info.tensor_shape.dim))
                              for key, info in getattr(sig, kind).items()}
                       for kind in ("inputs", "outputs")}
                for name, sig in defs.signature_def.items()}

    def signature(self, version: int, name: str, *, timeout: float = 10.0
                  ) -> dict[str, dict[str, tuple[str, tuple[int, ...]]]]:
        """{"inputs"|"outputs": {tensor: (dtype name, shape)}} of one signature ({} when the
        version has none of that name)."""
        return self.signatures(version, timeout=timeout).get(name, {})

    def predict(self, inputs: Mapping[str, Tensor], *, version: int | None = None,
                signature: str = "serving_default", timeout: float = 30.0
                ) -> tuple[dict[str, Tensor], float]:
        """Outputs of one Predict call and its latency in seconds."""
        request: Any = tfsapi.new_message(tfsapi.PREDICT_REQUEST)
        request.model_spec.name = self.model
        request.model_spec.signature_name = signature
        if version is not None:
            request.model_spec.version.value = version
        for name, tensor in inputs.items():
            request.inputs[name].CopyFrom(tfsapi.tensor_proto(tensor))
        start = time.perf_counter()
        reply = self._predict(request, timeout=timeout)
        elapsed = time.perf_counter() - start
        return {k: tfsapi.tensor_from_proto(v) for k, v in reply.outputs.items()}, elapsed

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


# TensorFlow and TFServing export their metrics as ":tensorflow:..." in Prometheus's format
# (a loaded model always has :tensorflow:cc:saved_model:load_attempt_count, for one)
METRIC_PREFIX = ":tensorflow:"


class NotMetrics(ValueError):
    """The page read on a metrics path is not a TFServing server's metrics."""


def metrics(address: str, port: int, path: str, *, timeout_s: float = 5.0) -> str:
    """One read of a server process's metrics (Prometheus text) on its REST port; raises
    (httpx.HTTPError, NotMetrics) when there is none: a page without TFServing's metric
    names is no measurement."""
    reply = httpx.get(http_url(address, port, path), timeout=timeout_s, trust_env=TRUST_ENV,
                      verify=tls())
    reply.raise_for_status()
    if METRIC_PREFIX not in reply.text:
        raise NotMetrics(f"GET {path} answered HTTP {reply.status_code} without TFServing's "
                         f"metric names ({METRIC_PREFIX}...)")
    return reply.text


def rest_problems(address: str, port: int, model: str, version: int, *,
                  metrics_path: str | None, timeout_s: float = 3.0) -> list[str]:
    """What is wrong with a server's REST side (empty when nothing is): the model's version
    status must say AVAILABLE, and the metrics path (when given) must serve TFServing's
    metric names."""
    problems = []
    base = http_url(address, port)
    try:
        with httpx.Client(timeout=timeout_s, trust_env=TRUST_ENV, verify=tls()) as client:
            reply = client.get(f"{base}/v1/models/{model}/versions/{version}")
            states = [v.get("state") for v in reply.json().get("model_version_status", [])] \
                if reply.status_code == 200 else []
            if "AVAILABLE" not in states:
                problems.append(f"GET /v1/models/{model}/versions/{version}: HTTP "
                                f"{reply.status_code} {states or reply.text[:120]!r}")
            if metrics_path:
                metrics = client.get(f"{base}{metrics_path}")
                if metrics.status_code != 200 or METRIC_PREFIX not in metrics.text:
                    problems.append(f"GET {metrics_path}: HTTP {metrics.status_code}, "
                                    "no TFServing metric names")
    except (httpx.HTTPError, ValueError) as error:
        problems.append(f"REST :{port}: {type(error).__name__}: {error}")
    return problems
