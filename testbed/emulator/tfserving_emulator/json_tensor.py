"""The REST API's JSON: requests to TensorProtos/Examples and results to JSON (util/json_tensor.cc).

Requests are read like rapidjson reads them (numbers are Int, Int64, Uint, Uint64 or Double by
their token and range; ``NaN``/``Infinity`` accepted; anything after the first complete value
ignored) and turned into the same TensorProtos and Examples the gRPC API receives, with
json_tensor.cc's checks and error texts (``JSON Value: <value> ...`` quotes the value as
rapidjson's pretty writer prints it, cut at 256 bytes). Responses print floats like WriteDecimal:
six significant digits when that round-trips, else full precision, ``.0`` added to whole
numbers, ``NaN``/``Infinity``/``-Infinity`` tokens.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import classification_pb2, input_pb2, regression_pb2

from .status import Code, ServingError, invalid_argument
from .tensors import dtype_name, tf_dtype

MAX_DEBUG_BYTES = 256
ROW, COLUMNAR = "row", "columnar"

# Python's json messages -> rapidjson's GetParseError_En texts
_PARSE_ERRORS = (
    ("Expecting value", "Invalid value."),
    ("Expecting ',' delimiter", "Missing a comma or ']' after an array element."),
    ("Expecting property name enclosed in double quotes", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid control character", "Invalid encoding in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
)


# ------------------------------------------------------------------ reading JSON


def parse_json(body: bytes) -> dict[str, Any]:
    """ParseJson: the document must be an object."""
    if not body:
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_argument(f"JSON Parse error: Invalid encoding in string. at offset: "
                               f"{exc.start}") from exc
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise invalid_argument(f"JSON Parse error: The document is empty. at offset: {start}")
    try:
        document, _end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        message = next((new for old, new in _PARSE_ERRORS if exc.msg.startswith(old)),
                       exc.msg + ".")
        if exc.msg.startswith("Expecting ',' delimiter") and _in_object(text, exc.pos):
            message = "Missing a comma or '}' after an object member."
        raise invalid_argument(f"JSON Parse error: {message} at offset: {exc.pos}") from exc
    if not isinstance(document, dict):
        raise invalid_argument(f"JSON Value: {debug_string(document)} Is not object")
    return document


def _in_object(text: str, position: int) -> bool:
    depth: list[str] = []
    for char in re.sub(r'"(?:\\.|[^"\\])*"', '""', text[:position]):
        if char in "[{":
            depth.append(char)
        elif char in "]}" and depth:
            depth.pop()
    return bool(depth) and depth[-1] == "{"


def json_type(value: Any) -> str:
    """JsonTypeString."""
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def _debug(value: Any, indent: int) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_debug(v, indent) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        pad = " " * (indent + 4)
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {_debug(v, indent + 4)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return json.dumps(value, ensure_ascii=False)


def debug_string(value: Any) -> str:
    """JsonValueToDebugString: the pretty writer's text, cut once 256 bytes are written."""
    text = _debug(value, 0)
    data = text.encode("utf-8")
    return data[:MAX_DEBUG_BYTES].decode("utf-8", errors="ignore") \
        if len(data) > MAX_DEBUG_BYTES else text


def _format_error(document: Any, *parts: str) -> ServingError:
    return invalid_argument(f"JSON Value: {debug_string(document)} " + "".join(parts))


def _type_error(value: Any, dtype: int) -> ServingError:
    return invalid_argument(f"JSON Value: {debug_string(value)} Type: {json_type(value)} is not "
                            f"of expected type: {dtype_name(dtype)}")


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _b64(value: Any) -> bytes:
    if not _is_b64(value):
        raise invalid_argument(f"JSON Value: {debug_string(value)} not formatted correctly for "
                               "base64 data")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid_argument("Unable to base64 decode") from exc


_INT32 = (-(2**31), 2**31)
_INT64 = (-(2**63), 2**63)


def _add_value(value: Any, dtype: int, tensor: tensor_pb2.TensorProto) -> None:
    """AddValueToTensor."""
    if dtype in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE):
        if not _is_number(value):
            raise _type_error(value, dtype)
        field = tensor.float_val if dtype == types_pb2.DT_FLOAT else tensor.double_val
        field.append(float(value))
    elif dtype in (types_pb2.DT_INT32, types_pb2.DT_INT16, types_pb2.DT_INT8,
                   types_pb2.DT_UINT8):
        if not _is_int(value, *_INT32):
            raise _type_error(value, dtype)
        tensor.int_val.append(value)
    elif dtype == types_pb2.DT_STRING:
        if not isinstance(value, str):
            raise _type_error(value, dtype)
        tensor.string_val.append(value.encode("utf-8"))
    elif dtype == types_pb2.DT_INT64:
        if not _is_int(value, *_INT64):
            raise _type_error(value, dtype)
        tensor.int64_val.append(value)
    elif dtype == types_pb2.DT_BOOL:
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        tensor.bool_val.append(value)
    elif dtype == types_pb2.DT_UINT32:
        if not _is_int(value, 0, 2**32):
            raise _type_error(value, dtype)
        tensor.uint32_val.append(value)
    elif dtype == types_pb2.DT_UINT64:
        if not _is_int(value, 0, 2**64):
            raise _type_error(value, dtype)
        tensor.uint64_val.append(value)
    else:
        raise ServingError(Code.UNIMPLEMENTED, f"Conversion of JSON Value: "
                           f"{debug_string(value)} to type: {dtype_name(dtype)}")


def _dense_shape(value: Any) -> list[int]:
    """GetDenseTensorShape: follow the first element of each list."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value: Any, level: int, dtype: int, tensor: tensor_pb2.TensorProto,
          shape: list[int]) -> int:
    """FillTensorProto: values at the leaf level only, lists of the expected sizes."""
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid_argument(
                f"JSON Value: {debug_string(value)} found at incorrect level: {level + 1} in "
                f"the JSON DOM. Expected at level: {rank}")
        if isinstance(value, dict):
            if dtype != types_pb2.DT_STRING:
                raise _type_error(value, dtype)
            tensor.string_val.append(_b64(value))
        else:
            _add_value(value, dtype, tensor)
        return 1
    if level >= rank:
        raise invalid_argument(f"Encountered list at unexpected level: {level} expected < "
                               f"{rank}")
    if len(value) != shape[level]:
        raise invalid_argument(f"Encountered list at unexpected size: {len(value)} at level: "
                               f"{level} expected size: {shape[level]}")
    return sum(_fill(v, level + 1, dtype, tensor, shape) for v in value)


def _tensor(value: Any, dtype: int) -> tuple[tensor_pb2.TensorProto, int]:
    tensor = tensor_pb2.TensorProto(dtype=dtype)
    shape = _dense_shape(value)
    for size in shape:
        tensor.tensor_shape.dim.add(size=size)
    count = _fill(value, 0, dtype, tensor, shape)
    return tensor, count


def _shape_text(tensor: tensor_pb2.TensorProto) -> str:
    return "[" + ",".join(str(d.size) for d in tensor.tensor_shape.dim) + "]"


def _status_text(error: ServingError) -> str:
    return str(error)


def _instances(document: dict[str, Any], infos: Mapping[str, meta_graph_pb2.TensorInfo]
               ) -> dict[str, tensor_pb2.TensorProto]:
    """FillTensorMapFromInstancesList."""
    instances = document["instances"]
    if not isinstance(instances[0], dict) and len(infos) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map")
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    names = sorted(infos)
    rows: dict[str, list[tensor_pb2.TensorProto]] = {}
    counts: dict[str, int] = {}
    for index, item in enumerate(instances):
        is_object = isinstance(item, dict) and not _is_b64(item)
        if objects and not is_object:
            raise invalid_argument(f"Expecting object but got list at item {index} of input "
                                   "list")
        if not objects and is_object:
            raise invalid_argument(f"Expecting value/list but got object at item {index} of "
                                   "input list")
        entries = item.items() if objects else [(names[0], item)]
        for name, value in entries:
            try:
                _instance_item(value, name, infos, rows, counts)
            except ServingError as exc:
                key = f" key: {name}" if objects else ""
                raise invalid_argument(f"Failed to process element: {index}{key} of "
                                       f"'instances' list. Error: {_status_text(exc)}") from exc
        if objects and set(item) != set(names):
            raise invalid_argument(
                f"Failed to process element: {index} of 'instances' list. JSON object: "
                f"{debug_string(item)} keys must be equal to: {','.join(names)}")
    return {name: _stack(parts, infos[name].dtype) for name, parts in rows.items()}


def _instance_item(value: Any, name: str, infos: Mapping[str, meta_graph_pb2.TensorInfo],
                   rows: dict[str, list[tensor_pb2.TensorProto]], counts: dict[str, int]
                   ) -> None:
    """AddInstanceItem: every instance of a name has the same size and shape."""
    if name not in infos:
        raise invalid_argument(f"JSON object: does not have named input: {name}")
    tensor, count = _tensor(value, infos[name].dtype)
    if name not in counts:
        counts[name] = count
    elif counts[name] != count:
        raise invalid_argument(f"Expecting tensor size: {counts[name]} but got: {count}")
    elif _shape_text(rows[name][0]) != _shape_text(tensor):
        raise invalid_argument(f"Expecting shape {_shape_text(rows[name][0])} but got: "
                               f"{_shape_text(tensor)}")
    rows.setdefault(name, []).append(tensor)


def _stack(parts: list[tensor_pb2.TensorProto], dtype: int) -> tensor_pb2.TensorProto:
    out = tensor_pb2.TensorProto(dtype=dtype)
    out.tensor_shape.dim.add(size=len(parts))
    for dim in parts[0].tensor_shape.dim:
        out.tensor_shape.dim.add(size=dim.size)
    for part in parts:
        out.MergeFrom(tensor_pb2.TensorProto(
            float_val=part.float_val, double_val=part.double_val, int_val=part.int_val,
            int64_val=part.int64_val, bool_val=part.bool_val, string_val=part.string_val,
            uint32_val=part.uint32_val, uint64_val=part.uint64_val))
    return out


def _inputs(document: dict[str, Any], infos: Mapping[str, meta_graph_pb2.TensorInfo]
            ) -> dict[str, tensor_pb2.TensorProto]:
    """FillTensorMapFromInputsMap: extra keys in an ``inputs`` object are ignored."""
    value = document["inputs"]
    if not isinstance(value, dict) or _is_b64(value):
        if len(infos) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map")
        name = next(iter(infos))
        return {name: _tensor(value, infos[name].dtype)[0]}
    out = {}
    for name in sorted(infos):
        if name not in value:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        out[name] = _tensor(value[name], infos[name].dtype)[0]
    return out


def signature_name(document: dict[str, Any]) -> str:
    """FillSignature: the optional ``signature_name`` must be a string."""
    name = document.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid_argument(f"JSON Value: {debug_string(document)} not formatted correctly. "
                               "'signature_name' key must be a string value.")
    return name


def predict_inputs(document: dict[str, Any], signature: str,
                   infos: Mapping[str, meta_graph_pb2.TensorInfo]
                   ) -> tuple[dict[str, tensor_pb2.TensorProto], str]:
    """FillPredictRequestFromJson after the signature's inputs are known: (tensors, format)."""
    if not infos:
        raise invalid_argument("Failed to get input map for signature: "
                               f"{signature or 'DEFAULT'}")
    if "instances" in document:
        if "inputs" in document:
            raise _format_error(document, "Not formatted correctly expecting only one of "
                                "'inputs' or 'instances' keys to exist ")
        if not isinstance(document["instances"], list):
            raise _format_error(document, "Expecting 'instances' to be an list/array")
        if not document["instances"]:
            raise _format_error(document, "No values in 'instances' array")
        return _instances(document, infos), ROW
    if "inputs" in document:
        return _inputs(document, infos), COLUMNAR
    raise invalid_argument("Missing 'inputs' or 'instances' key")


# ------------------------------------------------------------------ Examples


def _feature_kind_error(name: str, feature: feature_pb2.Feature) -> ServingError:
    kind = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}.get(
        str(feature.WhichOneof("kind")), "UNKNOWN")
    return invalid_argument(f"Unexpected element type in feature: {name} expecting type: "
                            f"{kind}")


def _add_feature_value(value: Any, name: str, feature: feature_pb2.Feature) -> None:
    """AddValueToFeature: bools and integers go to int64_list, decimals to float_list."""
    kind = feature.WhichOneof("kind")

    def require(wanted: str) -> None:
        if kind not in (None, wanted):
            raise _feature_kind_error(name, feature)

    if value is None or isinstance(value, list) or (isinstance(value, dict)
                                                     and not _is_b64(value)):
        raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: "
                               f"{json_type(value)}")
    if isinstance(value, bool):
        require("int64_list")
        feature.int64_list.value.append(int(value))
    elif isinstance(value, dict):
        require("bytes_list")
        feature.bytes_list.value.append(_b64(value))
    elif isinstance(value, str):
        require("bytes_list")
        feature.bytes_list.value.append(value.encode("utf-8"))
    elif isinstance(value, float) or not _is_int(value, -(2**63), 2**64):
        require("float_list")
        feature.float_list.value.append(float(value))
    else:
        require("int64_list")
        if value >= 2**63:
            raise invalid_argument(f"Feature: {name} has uint64_t element. Only int64_t is "
                                   "supported.")
        feature.int64_list.value.append(value)


def _example(value: Any) -> example_pb2.Example:
    """MakeExampleFromJsonObject."""
    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {json_type(value)}")
    example = example_pb2.Example()
    for name, content in value.items():
        feature = feature_pb2.Feature()
        for item in content if isinstance(content, list) else [content]:
            _add_feature_value(item, name, feature)
        example.features.feature[name].CopyFrom(feature)
    return example


def examples_input(document: dict[str, Any]) -> input_pb2.Input:
    """FillClassifyRegressRequestFromJson: ``examples`` and the optional ``context``."""
    result = input_pb2.Input()
    has_context = "context" in document
    if has_context:
        result.example_list_with_context.context.CopyFrom(_example(document["context"]))
    examples = document.get("examples")
    if "examples" not in document:
        raise _format_error(document, "When method is classify, key 'examples' is expected and "
                            "was not found")
    if not isinstance(examples, list):
        raise _format_error(document, "Expecting 'examples' value to be an list/array")
    if not examples:
        raise _format_error(document, "'examples' value is an empty array")
    target = result.example_list_with_context.examples if has_context \
        else result.example_list.examples
    for item in examples:
        target.add().CopyFrom(_example(item))
    return result


# ------------------------------------------------------------------ writing JSON


def decimal(value: float, *, single: bool) -> str:
    """WriteDecimal: StrCat's six digits if they round-trip, else max_digits10."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    text = f"{value:.6g}"
    parsed = float(np.float32(text)) if single else float(text)
    if parsed != value:
        text = f"{value:.9g}" if single else f"{value:.17g}"
    if "." not in text and "e" not in text:
        text += ".0"
    return text


_WRITERS: dict[Any, str] = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double",
    np.dtype(np.int32): "int", np.dtype(np.int16): "int", np.dtype(np.int8): "int",
    np.dtype(np.uint8): "int", np.dtype(np.int64): "int", np.dtype(np.uint32): "int",
    np.dtype(np.uint64): "int", np.dtype(np.bool_): "bool",
}


def _scalar(value: Any, kind: str, as_bytes: bool) -> str:
    if kind == "float":
        return decimal(float(value), single=True)
    if kind == "double":
        return decimal(float(value), single=False)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "int":
        return str(int(value))
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    if as_bytes:
        return '{ "b64": ' + json.dumps(base64.b64encode(data).decode("ascii")) + " }"
    return json.dumps(data.decode("utf-8", errors="replace"), ensure_ascii=False)


def _writer_kind(value: np.ndarray) -> str:
    if value.dtype == object or value.dtype.kind in ("S", "U"):
        return "string"
    kind = _WRITERS.get(value.dtype)
    if kind is None:
        raise invalid_argument("Failed to write JSON value for tensor type: "
                               f"{dtype_name(tf_dtype(value))}")
    return kind


def _values(value: Any, kind: str, as_bytes: bool) -> str:
    """AddTensorValues: nested single-line arrays (a scalar stays a scalar)."""
    if isinstance(value, (bytes, str)):
        return _scalar(value, kind, as_bytes)
    if value.ndim == 0:
        return _scalar(value.item() if kind != "string" else value[()], kind, as_bytes)
    return "[" + ", ".join(_values(v, kind, as_bytes) for v in value) + "]"


def tensors_json(outputs: Mapping[str, np.ndarray], layout: str) -> str:
    """MakeJsonFromTensors in the request's layout (row: predictions, columnar: outputs)."""
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    kinds = {name: _writer_kind(value) for name, value in outputs.items()}
    as_bytes = {name: kinds[name] == "string" and name.endswith("_bytes") for name in outputs}
    if layout == COLUMNAR:
        if len(outputs) == 1:
            name, value = next(iter(outputs.items()))
            body = _values(value, kinds[name], as_bytes[name])
        else:
            body = "{\n" + ",\n".join(
                f"        {json.dumps(name)}: {_values(v, kinds[name], as_bytes[name])}"
                for name, v in outputs.items()) + "\n    }"
        return '{\n    "outputs": ' + body + "\n}"
    batch = -1
    for name, value in outputs.items():
        if value.ndim == 0:
            raise invalid_argument(f"Tensor name: {name} has no shape information ")
        if batch >= 0 and value.shape[0] != batch:
            raise invalid_argument(f"Tensor name: {name} has inconsistent batch size: "
                                   f"{value.shape[0]} expecting: {batch}")
        batch = value.shape[0]
    rows = []
    for index in range(batch):
        if len(outputs) == 1:
            name, value = next(iter(outputs.items()))
            rows.append(_values(value[index], kinds[name], as_bytes[name]))
        else:
            rows.append("{\n" + ",\n".join(
                f"            {json.dumps(name)}: "
                f"{_values(v[index], kinds[name], as_bytes[name])}"
                for name, v in outputs.items()) + "\n        }")
    return '{\n    "predictions": [\n        ' + ",\n        ".join(rows) + "\n    ]\n}"


def classification_json(result: classification_pb2.ClassificationResult) -> str:
    """MakeJsonFromClassificationResult: ``results`` of [label, score] pairs per example."""
    if not result.classifications:
        raise invalid_argument("Cannot convert empty ClassificationResults to JSON")
    rows = []
    for entry in result.classifications:
        pairs = ", ".join(
            f"[{json.dumps(c.label, ensure_ascii=False)}, "
            f"{decimal(c.score, single=True)}]" for c in entry.classes)
        rows.append(f"[{pairs}]")
    return '{\n    "results": [\n        ' + ",\n        ".join(rows) + "\n    ]\n}"


def regression_json(result: regression_pb2.RegressionResult) -> str:
    """MakeJsonFromRegressionResult: ``results`` as one single-line array."""
    if not result.regressions:
        raise invalid_argument("Cannot convert empty RegressionResults to JSON")
    values = ", ".join(decimal(r.value, single=True) for r in result.regressions)
    return '{\n    "results": [' + values + "]\n}"


def error_json(message: str) -> str:
    """MakeJsonFromStatus."""
    return json.dumps({"error": message}, indent=4, ensure_ascii=False)
