"""Request data for the load generator: JSON files and SavedModel warmup records.

Everything is turned into serialized ``PredictRequest`` bytes once, before the run, so the hot
loop never touches protobuf (gRPC), or into ready JSON bodies (REST).

Accepted JSON (one object, or a list of them for round-robin request data):

* ghz style, the protobuf JSON mapping of ``PredictRequest``::

    {"model_spec": {"name": "m"}, "inputs": {"x": {"dtype": "DT_FLOAT",
     "tensor_shape": {"dim": [{"size": 2}]}, "float_val": [1.0, 2.0]}}}

* TFServing REST style: ``{"signature_name": "s", "inputs": {"x": [[1.0], [2.0]]}}`` (columnar)
  or ``{"instances": [...]}`` (rows). JSON numbers become ``DT_FLOAT`` and strings
  ``DT_STRING`` unless ``input_dtypes`` names another dtype for that input.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving.tensors import NUMERIC_DTYPES as _DTYPES
from tfsdeploy.core.tfserving.tensors import STRING, TensorError, tensor


class PayloadError(ValueError):
    """Request data that cannot be turned into a Predict request."""


@dataclass(frozen=True)
class RequestSpec:
    """What the command line says about the requests, overriding the data file."""

    model: str | None = None
    signature: str | None = None
    version: int | None = None
    version_label: str | None = None
    input_dtypes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Payloads:
    """Ready-to-send request bodies, used round-robin."""

    grpc: tuple[bytes, ...]
    rest: tuple[tuple[str, bytes], ...]  # (URL path, JSON body)
    model: str


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    return str(value).encode("utf-8")


def _infer_dtype(values: Any) -> str:
    """DT_STRING when the first leaf is text or a {"b64": ...} object, else DT_FLOAT."""
    leaf = values
    while isinstance(leaf, list) and leaf:
        leaf = leaf[0]
    if isinstance(leaf, (str, dict)):
        return "DT_STRING"
    if isinstance(leaf, bool):
        return "DT_BOOL"
    return "DT_FLOAT"


def tensor_from_json(name: str, values: Any, dtypes: Mapping[str, str]) -> Message:
    """A TensorProto from a JSON value (nested lists of equal length, or a scalar)."""
    dtype = dtypes.get(name) or _infer_dtype(values)
    if dtype not in _DTYPES and dtype != STRING:
        raise PayloadError(f"unsupported dtype {dtype} (use one of {sorted(_DTYPES)} or DT_STRING)")
    if dtype == STRING:
        values = _map_leaves(_to_bytes, values)
    try:
        return tfsapi.tensor_proto(tensor(values, dtype))
    except TensorError as err:
        raise PayloadError(f"input {name!r}: {err}") from err


def _map_leaves(change: Callable[[Any], Any], values: Any) -> Any:
    """Nested lists with ``change`` applied to each leaf."""
    if isinstance(values, list):
        return [_map_leaves(change, v) for v in values]
    return change(values)


def tensor_to_json(tensor: Any) -> Any:
    """Nested lists (TFServing REST columnar form) from a TensorProto."""
    dtype = tfsapi.dtype_name(int(tensor.dtype))
    if dtype not in _DTYPES and dtype != STRING:
        raise PayloadError(f"cannot convert {dtype} to JSON")
    try:
        found = tfsapi.tensor_from_proto(tensor)
    except TensorError as err:
        raise PayloadError(f"cannot convert the {dtype} tensor to JSON: {err}") from err
    return _map_leaves(_text_or_b64, found.tolist()) if dtype == STRING else found.tolist()


def _text_or_b64(value: bytes) -> Any:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(value).decode("ascii")}


def _is_proto_json(obj: Mapping[str, Any]) -> bool:
    """True for the protobuf JSON mapping of PredictRequest (ghz's data format)."""
    if "model_spec" in obj or "modelSpec" in obj or "output_filter" in obj:
        return True
    inputs = obj.get("inputs")
    return isinstance(inputs, dict) and any(
        isinstance(v, dict) and ("dtype" in v or "tensor_shape" in v or "tensorShape" in v)
        for v in inputs.values()
    )


def _rows_to_columns(instances: Sequence[Any]) -> dict[str, Any]:
    """``instances`` (row format) to named columns; unnamed rows become input "inputs"."""
    if not instances:
        raise PayloadError('"instances" is empty')
    if all(isinstance(row, dict) and "b64" not in row for row in instances):
        names = list(instances[0])
        return {name: [row[name] for row in instances] for name in names}
    return {"inputs": list(instances)}


def request_from_json(obj: Any, dtypes: Mapping[str, str]) -> Message:
    """One PredictRequest from one JSON object in either accepted style."""
    request = tfsapi.new_message(tfsapi.PREDICT_REQUEST)
    if not isinstance(obj, dict):
        raise PayloadError("each request must be a JSON object")
    if _is_proto_json(obj):
        try:
            json_format.ParseDict(obj, request)
        except json_format.ParseError as err:
            raise PayloadError(f"not a PredictRequest in protobuf JSON: {err}") from err
        return request
    if "inputs" in obj:
        columns = obj["inputs"]
        if not isinstance(columns, dict):
            raise PayloadError('name the inputs: {"inputs": {"<input name>": [...]}}')
    elif "instances" in obj:
        columns = _rows_to_columns(obj["instances"])
    else:
        raise PayloadError('expected "inputs", "instances" or a protobuf-JSON PredictRequest')
    for name, values in columns.items():
        request.inputs[name].CopyFrom(tensor_from_json(name, values, dtypes))
    if obj.get("signature_name"):
        request.model_spec.signature_name = str(obj["signature_name"])
    return request


def requests_from_json_file(path: Path, spec: RequestSpec) -> list[Message]:
    """PredictRequests from a JSON data file (one object or a list of objects)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise PayloadError(f"{path}: {err}") from err
    items = data if isinstance(data, list) else [data]
    if not items:
        raise PayloadError(f"{path}: empty list of requests")
    return [request_from_json(item, spec.input_dtypes) for item in items]


def apply_spec(request: Any, spec: RequestSpec) -> None:
    """Let the command line override the request's model spec."""
    model_spec = request.model_spec
    if spec.model:
        model_spec.name = spec.model
    if spec.signature:
        model_spec.signature_name = spec.signature
    if spec.version is not None:
        model_spec.version.value = spec.version
    elif spec.version_label:
        model_spec.version_label = spec.version_label
    if not model_spec.name:
        raise PayloadError("no model name: pass --model or put model_spec.name in the data")


def rest_path(request: Any) -> str:
    """TFServing REST path for a request's model spec."""
    spec = request.model_spec
    path = f"/v1/models/{spec.name}"
    if spec.HasField("version"):
        path += f"/versions/{spec.version.value}"
    elif spec.version_label:
        path += f"/labels/{spec.version_label}"
    return path + ":predict"


def rest_body(request: Any) -> bytes:
    """TFServing REST JSON body (columnar ``inputs``) equivalent to a PredictRequest."""
    body: dict[str, Any] = {
        "inputs": {name: tensor_to_json(t) for name, t in sorted(request.inputs.items())}}
    if request.model_spec.signature_name:
        body["signature_name"] = request.model_spec.signature_name
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def build_payloads(requests: Sequence[Message], spec: RequestSpec, *, rest: bool) -> Payloads:
    """Apply the overrides and serialize every request once."""
    for request in requests:
        apply_spec(request, spec)
    grpc_bodies = tuple(r.SerializeToString() for r in requests)
    rest_bodies = tuple((rest_path(r), rest_body(r)) for r in requests) if rest else ()
    model = str(requests[0].model_spec.name)
    return Payloads(grpc=grpc_bodies, rest=rest_bodies, model=model)
