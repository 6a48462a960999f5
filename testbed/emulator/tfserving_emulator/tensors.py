"""TensorProto <-> numpy, with TensorFlow's ``Tensor::FromProto`` / ``AsProtoField`` rules.

FromProto (tensorflow/core/framework/tensor.cc) refuses an invalid dtype or shape (negative or
unknown dimensions) and a ``tensor_content`` of the wrong byte size; typed value fields are
lenient: no values gives zeros, fewer values than elements repeat the last one, extra values
are ignored. Written without TensorFlow calls so that a request costs microseconds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2

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


class ProtoError(ValueError):
    """The TensorProto cannot become a tensor (FromProto returned false)."""


def dtype_name(dtype: int) -> str:
    """TF's short name for a DataType, as in "Expects arg[0] to be float"."""
    return types_pb2.DataType.Name(dtype)[3:].lower() if dtype else "invalid"


def tf_dtype(array: np.ndarray) -> int:
    """TF DataType for a numpy array."""
    if array.dtype == object or array.dtype.kind in ("S", "U"):
        return int(types_pb2.DT_STRING)
    return int(_BY_NUMPY[array.dtype])


def to_numpy(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Decode a TensorProto like Tensor::FromProto; raise ProtoError where it returns false."""
    dtype, field = _DTYPES.get(proto.dtype, (None, ""))
    if dtype is None:
        raise ProtoError(f"unsupported dtype {proto.dtype}")
    if proto.tensor_shape.unknown_rank:
        raise ProtoError("unknown rank")
    shape = tuple(int(d.size) for d in proto.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise ProtoError("negative dimension")
    size = math.prod(shape)
    if proto.tensor_content:
        if dtype is object:
            raise ProtoError("string tensor_content")
        if len(proto.tensor_content) != size * np.dtype(dtype).itemsize:
            raise ProtoError("tensor_content size")
        return np.frombuffer(proto.tensor_content, dtype=dtype).reshape(shape)
    values = getattr(proto, field)
    count = len(values)
    if dtype is object:
        flat = np.empty(size, dtype=object)
        if count == 0:
            flat[:] = b""
        else:
            taken = list(values[:size])
            flat[: len(taken)] = taken
            flat[len(taken):] = taken[-1] if taken else b""
        return flat.reshape(shape)
    if count == 0:
        return np.zeros(shape, dtype=dtype)
    if field == "half_val":
        flat = np.array(values[:size], dtype=np.uint16).view(np.float16)
    else:
        flat = np.array(values[:size], dtype=dtype)
    if flat.size < size:
        flat = np.concatenate([flat, np.full(size - flat.size, flat[-1], dtype=dtype)])
    return flat.reshape(shape)


def fill_proto(proto: tensor_pb2.TensorProto, array: np.ndarray, *,
               as_content: bool = False) -> None:
    """Write ``array`` into an empty ``proto`` like Tensor::AsProtoField (or
    AsProtoTensorContent)."""
    dtype = tf_dtype(array)
    proto.dtype = dtype
    proto.tensor_shape.SetInParent()  # AsProtoField always writes the shape, even a scalar's
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add().size = int(size)
    if dtype == types_pb2.DT_STRING:
        proto.string_val.extend(as_bytes(v) for v in array.ravel())
    elif as_content:
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
    else:
        field = _DTYPES[dtype][1]
        flat = array.ravel()
        if field == "half_val":
            flat = flat.view(np.uint16)
        getattr(proto, field).extend(flat.tolist())


def to_proto(array: np.ndarray, *, as_content: bool = False) -> tensor_pb2.TensorProto:
    """A new TensorProto holding ``array`` (see fill_proto)."""
    proto = tensor_pb2.TensorProto()
    fill_proto(proto, array, as_content=as_content)
    return proto


def as_bytes(value: Any) -> bytes:
    """A string tensor element as bytes."""
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")
