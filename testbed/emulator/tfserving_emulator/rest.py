"""HTTP/REST front end (model_servers/http_server.cc, http_rest_api_handler.cc,
http_rest_api_util.cc, util/json_tensor.cc).

Paths are matched case-insensitively with TFServing's own regular expressions; errors are
``{"error": "<message>"}`` with the real code -> HTTP status mapping; Prometheus metrics are
served at the monitoring path when enabled.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2

from .core import ServerCore
from .grpc_service import SIGNATURE_DEF, get_metadata, get_status, record_request
from .metrics import Metrics
from .servable import Servable
from .status import Code, ServingError, invalid_argument
from .tensors import json_to_numpy, numpy_to_json

_API_PATH = re.compile(r"/v1/.*", re.I)
_PREDICT = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
    r"(classify|regress|predict)", re.I)
_STATUS = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.I)


class RestApi:
    """Routes one REST request to the core and renders the JSON answer."""

    def __init__(self, core: ServerCore, metrics: Metrics, cors: bool) -> None:
        self.core = core
        self.metrics = metrics
        self.cors = cors

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
        """Process one API request: (HTTP status, model name, JSON body)."""
        started = time.monotonic()
        model = ""
        api = ""
        try:
            model, api, output = self._process(method, path, body)
            error = None
        except ServingError as exc:
            error = exc
            output = json.dumps({"error": exc.message}, indent=4)
        record_request(self.metrics, model, api, "REST", error, started)
        return (200 if error is None else error.http_status), model, output

    def _process(self, method: str, path: str, body: bytes) -> tuple[str, str, str]:
        malformed = invalid_argument(f"Malformed request: {method} {path}")
        if method == "POST":
            match = _PREDICT.fullmatch(path)
            if not match:
                raise malformed
            name, version, label, verb = match.groups()
            spec = _model_spec(name, version, label)
            if verb.lower() != "predict":
                raise ServingError(Code.UNIMPLEMENTED,
                                   f"{verb} is not supported by the TFServing emulator")
            return spec.name, verb, self._predict(spec, body)
        if method == "GET":
            match = _STATUS.fullmatch(path)
            if not match:
                raise malformed
            name, version, label, sub = match.groups()
            if not name:
                raise invalid_argument("Missing model name in request.")
            spec = _model_spec(name, version, label)
            if sub:
                return spec.name, "", self._metadata(spec)
            return spec.name, "", self._status(spec)
        raise malformed

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
        model_spec = json_format.MessageToJson(response.model_spec, **options)
        signatures = json_format.MessageToJson(signature_map, **options)
        return (f'{{\n"model_spec":{model_spec},\n"metadata": {{"signature_def": '
                f"{signatures}}}\n}}\n")

    def _predict(self, spec: model_pb2.ModelSpec, body: bytes) -> str:
        document = _parse_json(body)
        signature_name = document.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise invalid_argument("'signature_name' key must be a string value.")
        spec.signature_name = signature_name
        result = self.core.with_servable(spec, lambda s: _predict_json(s, document))
        assert isinstance(result, str)
        return result


def _model_spec(name: str, version: str | None, label: str | None) -> model_pb2.ModelSpec:
    spec = model_pb2.ModelSpec(name=urllib.parse.unquote(name))
    if version:
        try:
            spec.version.value = int(version)
        except ValueError as exc:
            raise invalid_argument(f"Failed to convert version: {version} to numeric.") from exc
    if label:
        spec.version_label = urllib.parse.unquote(label)
    return spec


def _parse_json(body: bytes) -> dict[str, Any]:
    if not body:
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        document = json.loads(body)
    except json.JSONDecodeError as exc:
        raise invalid_argument(f"JSON Parse error: {exc.msg} at offset: {exc.pos}") from exc
    except UnicodeDecodeError as exc:
        raise invalid_argument("JSON Parse error: Invalid encoding in string.") from exc
    if not isinstance(document, dict):
        raise invalid_argument(f"JSON Value: {body.decode(errors='replace')} Is not object")
    return document


def _is_named(value: Any) -> bool:
    return isinstance(value, dict) and not (len(value) == 1 and "b64" in value)


def _row_inputs(instances: Any, specs: dict[str, Any]) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid_argument("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    named = _is_named(instances[0])
    if not named and len(specs) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map")
    columns: dict[str, list[Any]] = {name: [] for name in specs}
    for index, item in enumerate(instances):
        if named != _is_named(item):
            kind = "object but got list" if named else "value/list but got object"
            raise invalid_argument(f"Expecting {kind} at item {index} of input list")
        if not named:
            columns[next(iter(specs))].append(item)
            continue
        if set(item) != set(specs):
            raise invalid_argument(
                f"Failed to process element: {index} of 'instances' list. JSON object: "
                f"{json.dumps(item)} keys must be equal to: {','.join(sorted(specs))}")
        for name, value in item.items():
            columns[name].append(value)
    return {name: json_to_numpy(values, specs[name].dtype) for name, values in columns.items()}


def _columnar_inputs(inputs: Any, specs: dict[str, Any]) -> dict[str, np.ndarray]:
    if not _is_named(inputs):
        if len(specs) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map")
        name = next(iter(specs))
        return {name: json_to_numpy(inputs, specs[name].dtype)}
    out = {}
    for name, spec in specs.items():
        if name not in inputs:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        out[name] = json_to_numpy(inputs[name], spec.dtype)
    return out


def _predict_json(servable: Servable, document: dict[str, Any]) -> str:
    key = document.get("signature_name") or "serving_default"
    signature = servable.model.signatures.get(key)
    if signature is None:
        raise invalid_argument(f'Serving signature name: "{key}" not found in signature def')
    if not signature.inputs:
        raise invalid_argument(f"Failed to get input map for signature: {key}")
    has_rows, has_cols = "instances" in document, "inputs" in document
    if has_rows and has_cols:
        raise invalid_argument("Not formatted correctly expecting only one of 'inputs' or "
                               "'instances' keys to exist")
    if has_rows:
        inputs = _row_inputs(document["instances"], signature.inputs)
    elif has_cols:
        inputs = _columnar_inputs(document["inputs"], signature.inputs)
    else:
        raise invalid_argument("Missing 'inputs' or 'instances' key")
    outputs = servable.run(key, inputs)
    if has_rows:
        return json.dumps({"predictions": _rows(outputs)}, indent=4)
    if len(outputs) == 1:
        name, value = next(iter(outputs.items()))
        return json.dumps({"outputs": numpy_to_json(value, name)}, indent=4)
    return json.dumps({"outputs": {k: numpy_to_json(v, k) for k, v in outputs.items()}},
                      indent=4)


def _rows(outputs: dict[str, np.ndarray]) -> list[Any]:
    sizes = {name: (v.shape[0] if v.ndim else None) for name, v in outputs.items()}
    batch = next(iter(sizes.values()))
    for name, size in sizes.items():
        if size is None or size != batch:
            raise invalid_argument(f"Tensor name: {name} has inconsistent batch size: {size} "
                                   f"expecting: {batch}")
    if len(outputs) == 1:
        name, value = next(iter(outputs.items()))
        converted = numpy_to_json(value, name)
        return converted if isinstance(converted, list) else [converted]
    columns = {name: numpy_to_json(value, name) for name, value in outputs.items()}
    return [{name: columns[name][i] for name in columns} for i in range(batch or 0)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: RestApi
    metrics_path: str | None

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _reply(self, status: int, body: str, content_type: str = "application/json") -> None:
        data = body.encode("utf-8")
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
            if self.command != "GET":
                self._reply(400, "", "text/plain")
                return
            self._reply(200, self.api.metrics.page(), "text/plain")
            return
        if not _API_PATH.fullmatch(path):
            self._reply(404, "", "text/html")
            return
        if self.command == "OPTIONS":
            self._options()
            return
        status, _model, output = self.api.handle(self.command, path, body)
        self._reply(status, output)

    def _options(self) -> None:
        if re.search(r"https?://", self.headers.get("Origin", "")):
            self._reply(200, "")
        else:
            self._reply(400, json.dumps({"error": "Origin header is missing in CORS "
                                                  "preflight"}, indent=4))

    do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_HEAD = _dispatch


class RestServer:
    """A threaded HTTP server on 0.0.0.0:port, started in the background."""

    def __init__(self, port: int, api: RestApi, metrics_path: str | None) -> None:
        handler = type("Handler", (_Handler,), {"api": api, "metrics_path": metrics_path})
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("0.0.0.0", port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="http",
                                       daemon=True)

    def start(self) -> None:
        """Start serving in a background thread."""
        self.thread.start()
