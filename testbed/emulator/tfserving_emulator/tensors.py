"""TensorProto <-> numpy, and the REST JSON tensor formats (util/json_tensor.cc).

Written without TensorFlow calls so that a request costs microseconds, not a TF op.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from .status import invalid_argument

# DataType -> (numpy dtype, TensorProto value field)
_DTYPES: dict[int, tuple[Any, str]] = {
    types_pb2.DT_FLOAT: (np.float32, "float_val"),
    types_pb2.DT_DOUBLE: (np.float64, "double_val"),
    types_pb2.DT_INT32: (np.int32, "int_val"),
    types_pb2.DT_UINT8: (np.uint8, "int_val"),
    types_pb2.DT_INT16: (np.int16, "int_val"),
    types_pb2.DT_INT8: (np.int8, "int_val"),
    types_pb2.DT_UINT16: (np.uint16, "int_val"),
    types_pb2.DT_INT64: (np.int64, "int64_val"),
    types_pb2.DT_BOOL: (np.bool_, "bool_val"),
    types_pb2.DT_HALF: (np.float16, "half_val"),
    types_pb2.DT_UINT32: (np.uint32, "uint32_val"),
    types_pb2.DT_UINT64: (np.uint64, "uint64_val"),
    types_pb2.DT_STRING: (object, "string_val"),
}
_BY_NUMPY = {np.dtype(v[0]): k for k, v in _DTYPES.items() if v[0] is not object}


def dtype_name(dtype: int) -> str:
    """TF's short name for a DataType, as in "Expects arg[0] to be float"."""
    return types_pb2.DataType.Name(dtype)[3:].lower() if dtype else "invalid"


def numpy_dtype(dtype: int) -> Any:
    """numpy dtype for a TF DataType, or raise INVALID_ARGUMENT."""
    try:
        return _DTYPES[dtype][0]
    except KeyError as exc:
        raise invalid_argument(f"Unsupported tensor dtype {dtype_name(dtype)}") from exc


def tf_dtype(array: np.ndarray) -> int:
    """TF DataType for a numpy array."""
    if array.dtype == object or array.dtype.kind in ("S", "U"):
        return int(types_pb2.DT_STRING)
    return int(_BY_NUMPY[array.dtype])


def _shape(proto: tensor_pb2.TensorProto) -> tuple[int, ...]:
    return tuple(int(d.size) for d in proto.tensor_shape.dim)


def to_numpy(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Decode a TensorProto (tensor_content or typed *_val fields) into a numpy array."""
    dtype, field = _DTYPES.get(proto.dtype, (None, ""))
    if dtype is None:
        raise invalid_argument(f"Unsupported tensor dtype {dtype_name(proto.dtype)}")
    shape = _shape(proto)
    if any(d < 0 for d in shape):
        raise invalid_argument("Tensor shape has negative dimensions")
    size = math.prod(shape)
    if dtype is not object and proto.tensor_content:
        array = np.frombuffer(proto.tensor_content, dtype=dtype)
        if array.size != size:
            raise invalid_argument(
                f"Invalid TensorProto: tensor_content has {array.size} elements, shape "
                f"{list(shape)} needs {size}")
        return array.reshape(shape)
    values = getattr(proto, field)
    if dtype is object:
        flat = np.empty(len(values), dtype=object)
        flat[:] = list(values)
    elif field == "half_val":
        flat = np.array(values, dtype=np.uint16).view(np.float16)
    else:
        flat = np.array(values, dtype=dtype)
    if flat.size == size:
        return flat.reshape(shape)
    if flat.size == 0:
        fill: Any = b"" if dtype is object else 0
        return np.full(shape, fill, dtype=dtype)
    if flat.size < size:
        # Tensor::FromProto repeats the last value to fill the shape.
        padded = np.empty(size, dtype=dtype)
        padded[: flat.size] = flat
        padded[flat.size:] = flat[-1]
        return padded.reshape(shape)
    raise invalid_argument(f"Invalid TensorProto: {flat.size} values for shape {list(shape)}")


def to_proto(array: np.ndarray, *, as_content: bool = False) -> tensor_pb2.TensorProto:
    """Encode a numpy array like Tensor::AsProtoField (or AsProtoTensorContent)."""
    proto = tensor_pb2.TensorProto(dtype=tf_dtype(array))
    proto.tensor_shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=int(d)) for d in array.shape]))
    if proto.dtype == types_pb2.DT_STRING:
        proto.string_val.extend(_as_bytes(v) for v in array.ravel())
        return proto
    if as_content:
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
        return proto
    field = _DTYPES[proto.dtype][1]
    flat = array.ravel()
    if field == "half_val":
        flat = flat.view(np.uint16)
    getattr(proto, field).extend(flat.tolist())
    return proto


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


# ---------------------------------------------------------------- REST JSON

def _b64_object(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _decode_strings(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_strings(v) for v in value]
    if _b64_object(value):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError) as exc:
            raise invalid_argument("Unable to base64 decode") from exc
    if isinstance(value, str):
        return value.encode("utf-8")
    raise invalid_argument(f"JSON Value: {value!r} not formatted correctly for string type")


def json_to_numpy(value: Any, dtype: int) -> np.ndarray:
    """Convert one JSON (nested list) value to an array of the signature's dtype."""
    np_dtype = numpy_dtype(dtype)
    if np_dtype is object:
        decoded = _decode_strings(value)
        try:
            array = np.array(decoded, dtype=object)
        except ValueError as exc:
            raise invalid_argument(f"Failed to process JSON value: {exc}") from exc
        return array
    try:
        array = np.array(value, dtype=np_dtype)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(
            f"JSON Value: {value!r} not formatted correctly for {dtype_name(dtype)}: "
            f"{exc}") from exc
    if array.dtype == object:
        raise invalid_argument("Tensor shapes are inconsistent in the JSON list")
    return array


def _json_scalar_list(array: np.ndarray, name: str) -> Any:
    if array.dtype == object:
        def conv(v: Any) -> Any:
            data = _as_bytes(v)
            if name.endswith("_bytes"):
                return {"b64": base64.b64encode(data).decode("ascii")}
            return data.decode("utf-8", errors="replace")
        flat = [conv(v) for v in array.ravel()]
        return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim else flat[0]
    if array.dtype == np.float32 or array.dtype == np.float16:
        # print float32 like TFServing does (shortest form of the float, not the double)
        return array.astype(str).astype(np.float64).tolist()
    return array.tolist()


def numpy_to_json(array: np.ndarray, name: str) -> Any:
    """Convert an output array to its JSON value (nested lists)."""
    return _json_scalar_list(array, name)
