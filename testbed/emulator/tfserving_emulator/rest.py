"""HTTP/REST front end (model_servers/http_server.cc, http_rest_api_handler.cc,
http_rest_api_util.cc; JSON in json_tensor.py).

- Paths match TFServing's case-insensitive regular expressions, but the verb after ``:`` is then
  compared case-sensitively (``:PREDICT`` is "Malformed request"), and so is ``/metadata``.
- The model name comes from the path (URL-decoded) before anything else, so every request,
  failed ones included, is counted under it in ``request_count``; latency only for successes.
- Predict reads the JSON, then takes the servable to learn the signature's inputs, builds the
  same PredictRequest as gRPC and answers in the request's layout; classify and regress read
  ``examples`` (and ``context``) into tf.Examples. Model runs get ``--rest_api_timeout_in_ms``
  as their RunOptions timeout.
- Errors are ``{"error": "<message>"}`` with ToHTTPStatusCode's status.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)

from . import json_tensor
from .core import ServerCore
from .grpc_service import SIGNATURE_DEF, get_metadata, get_status, record_request
from .metrics import Metrics
from .servable import Servable
from .status import Code, ServingError, failed_precondition, invalid_argument

_API_PATH = re.compile(r"/v1/.*", re.I)
_PREDICT = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
    r"(classify|regress|predict)", re.I)
_STATUS = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.I)


@dataclasses.dataclass
class ParsedPath:
    """ParseModelInfo's outputs."""

    matched: bool
    model: str = ""
    version: str = ""
    label: str = ""
    method: str = ""
    subresource: str = ""


def parse_path(method: str, path: str) -> ParsedPath:
    """ParseModelInfo: match the path, URL-decode the model name and label."""
    match = None
    if method == "POST":
        match = _PREDICT.fullmatch(path)
    elif method == "GET":
        match = _STATUS.fullmatch(path)
    if match is None:
        return ParsedPath(False)
    groups = [g or "" for g in match.groups()]
    parsed = ParsedPath(True, urllib.parse.unquote(groups[0]), groups[1],
                        urllib.parse.unquote(groups[2]))
    if method == "POST":
        parsed.method = groups[3]
    else:
        parsed.subresource = groups[3]
    return parsed


def model_spec(parsed: ParsedPath) -> model_pb2.ModelSpec:
    """FillModelSpecWithNameVersionAndLabel."""
    spec = model_pb2.ModelSpec(name=parsed.model)
    if parsed.version:
        version = int(parsed.version)
        if not -(2**63) <= version < 2**63:
            raise invalid_argument(f"Failed to convert version: {parsed.version} to numeric.")
        spec.version.value = version
    if parsed.label:
        spec.version_label = parsed.label
    return spec


class RestApi:
    """Routes one REST request to the core and renders the JSON answer."""

    def __init__(self, core: ServerCore, metrics: Metrics, cors: bool, timeout_ms: int) -> None:
        self.core = core
        self.metrics = metrics
        self.cors = cors
        self.timeout_ms = max(0, timeout_ms)

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
        """Process one API request: (HTTP status, model name, JSON body)."""
        started = time.monotonic()
        parsed = parse_path(method, path)
        try:
            output = self._process(method, path, parsed, body)
            error = None
        except Exception as exc:  # an emulator bug must still answer like the server
            error = exc if isinstance(exc, ServingError) else \
                ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
            output = json_tensor.error_json(error.message)
        record_request(self.metrics, parsed.model, parsed.method, "REST", error, started)
        return (200 if error is None else error.http_status), parsed.model, output

    def _process(self, method: str, path: str, parsed: ParsedPath, body: bytes) -> str:
        malformed = invalid_argument(f"Malformed request: {method} {path}")
        if not parsed.matched:
            raise malformed
        if method == "POST":
            handler = {"predict": self._predict, "classify": self._classify,
                       "regress": self._regress}.get(parsed.method)
            if handler is None:  # the regex ignores case, this comparison does not
                raise malformed
            return handler(parsed, body)
        if not parsed.model:
            raise invalid_argument("Missing model name in request.")
        spec = model_spec(parsed)
        if parsed.subresource == "metadata":
            return self._metadata(spec)
        return self._status(spec)

    def _status(self, spec: model_pb2.ModelSpec) -> str:
        request = get_model_status_pb2.GetModelStatusRequest(model_spec=spec)
        response = get_status(self.core, request)
        return str(json_format.MessageToJson(response,
                                             always_print_fields_with_no_presence=True))

    def _metadata(self, spec: model_pb2.ModelSpec) -> str:
        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec, metadata_field=[SIGNATURE_DEF])
        response = get_metadata(self.core, request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata[SIGNATURE_DEF].Unpack(signature_map)
        options: dict[str, Any] = {"always_print_fields_with_no_presence": True,
                                   "preserving_proto_field_name": True}
        model = json_format.MessageToJson(response.model_spec, **options)
        signatures = json_format.MessageToJson(signature_map, **options)
        return (f'{{\n"model_spec":{model},\n"metadata": {{"signature_def": '
                f"{signatures}}}\n}}\n")

    def _predict(self, parsed: ParsedPath, body: bytes) -> str:
        spec = model_spec(parsed)
        document = json_tensor.parse_json(body)
        spec.signature_name = json_tensor.signature_name(document)

        def run(servable: Servable) -> str:
            # HttpRestApiHandler::GetInfoMap, then the same Predict as gRPC
            name = spec.signature_name or "serving_default"
            signature = servable.model.signature_defs.get(name)
            if signature is None:
                raise invalid_argument(f'Serving signature name: "{name}" not found in '
                                       "signature def")
            tensors, layout = json_tensor.predict_inputs(document, spec.signature_name,
                                                         signature.inputs)
            request = predict_pb2.PredictRequest(model_spec=spec)
            for alias, tensor in tensors.items():
                request.inputs[alias].CopyFrom(tensor)
            plan, outputs = servable.predict_arrays(request, self.timeout_ms)
            return json_tensor.tensors_json(dict(zip(plan.aliases, outputs, strict=True)),
                                            layout)

        result = self.core.with_servable(spec, run)
        assert isinstance(result, str)
        return result

    def _classify(self, parsed: ParsedPath, body: bytes) -> str:
        spec = model_spec(parsed)
        document = json_tensor.parse_json(body)
        spec.signature_name = json_tensor.signature_name(document)
        request = classification_pb2.ClassificationRequest(
            model_spec=spec, input=json_tensor.examples_input(document))
        response = self.core.with_servable(spec, lambda s: s.classify(request, self.timeout_ms))
        assert isinstance(response, classification_pb2.ClassificationResponse)
        return json_tensor.classification_json(response.result)

    def _regress(self, parsed: ParsedPath, body: bytes) -> str:
        spec = model_spec(parsed)
        document = json_tensor.parse_json(body)
        spec.signature_name = json_tensor.signature_name(document)
        request = regression_pb2.RegressionRequest(
            model_spec=spec, input=json_tensor.examples_input(document))
        response = self.core.with_servable(spec, lambda s: s.regress(request, self.timeout_ms))
        assert isinstance(response, regression_pb2.RegressionResponse)
        return json_tensor.regression_json(response.result)

    def options(self, origin: str) -> ServingError | None:
        """CORS preflight: OK when an http(s) Origin header is present."""
        if re.search(r"https?://", origin):
            return None
        return failed_precondition("Origin header is missing in CORS preflight")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A reply leaves in one write, as TFServing's does: EvHTTPRequest::EvSendReply
    # (tensorflow_serving/util/net_http/server/internal/evhttp_request.cc) hands its body to
    # libevent's evhttp_send_reply, which puts the status line, the headers and the body in
    # the connection's one output buffer. Written unbuffered (socketserver's default), the
    # headers and the body went out as two writes, and on a kept-alive connection the body
    # waited for the client's delayed ACK of the headers (Nagle): 40 ms on every request after
    # a connection's first (measured: 44 ms per model status GET on one connection, 0.8 ms on
    # a new one). The buffered writer is flushed once per request (BaseHTTPRequestHandler's
    # handle_one_request); a reply larger than its buffer goes out at once too (TCP_NODELAY).
    wbufsize = -1
    disable_nagle_algorithm = True
    api: RestApi
    metrics_path: str | None

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _reply(self, status: int, body: str, content_type: str = "application/json") -> None:
        data = body.encode("utf-8") if self.command != "HEAD" else b""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if self.api.cors:
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Access-Control-Allow-Methods", "POST, GET")
            self.send_header("Access-Control-Allow-Headers", "Content-Type")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urllib.parse.urlsplit(self.path).path
        if self.metrics_path is not None and path == self.metrics_path:
            self._reply(200, self.api.metrics.page(), "text/plain")
            return
        if not _API_PATH.fullmatch(path):
            self._reply(404, "", "text/html")
            return
        if self.command == "OPTIONS":
            # http_server.cc: no handler runs, the body stays empty, the model name too
            error = self.api.options(self.headers.get("Origin", ""))
            record_request(self.api.metrics, "", "", "REST", error, time.monotonic())
            self._reply(200 if error is None else error.http_status, "")
            return
        status, _model, output = self.api.handle(self.command, path, body)
        self._reply(status, output)

    do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_HEAD = do_PATCH = _dispatch


class _QuietHTTPServer(ThreadingHTTPServer):
    """A client that went away (a reset or a closed connection) ends its connection in
    silence, as in TFServing's libevent server (util/net_http/server/internal/
    evhttp_server.cc: evhttp frees the connection and logs nothing): socketserver printed a
    traceback for each one, and HAProxy's health checks end theirs with a reset (about one
    a second per server behind a gateway, 20 lines each, into the container's log)."""

    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class RestServer:
    """A threaded HTTP server on 0.0.0.0:port, started in the background."""

    def __init__(self, port: int, api: RestApi, metrics_path: str | None) -> None:
        handler = type("Handler", (_Handler,), {"api": api, "metrics_path": metrics_path})
        self.httpd = _QuietHTTPServer(("0.0.0.0", port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="http",
                                       daemon=True)

    def start(self) -> None:
        """Start serving in a background thread."""
        self.thread.start()

