"""TFServing's API messages (PredictRequest, model status and metadata, PredictionLog ...) and
tensors in them, without TensorFlow.

The messages come from the toolkit's own definitions (``definitions.py``), loaded once per
process into a private descriptor pool (``schema.build_pool``): neither the ``tensorflow``
wheel nor ``tensorflow-serving-api`` is needed, and the classes are wire-identical to the
official ones (``tests/loadtest/test_protos.py`` compares them). The pool is built when this
module is first imported (under Python's import lock, so once, whichever thread imports it
first: a message built from another pool's classes is refused, "Parameter to CopyFrom() must
be instance of same class").
"""

from __future__ import annotations

import math
import threading
from typing import Any

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

from tfsdeploy.core.tfserving.definitions import FILES
from tfsdeploy.core.tfserving.schema import build_pool
from tfsdeploy.core.tfserving.tensors import (
    NUMERIC_DTYPES,
    STRING,
    Tensor,
    TensorError,
    halves,
    pack,
    unpack,
)

PREDICT_REQUEST = "tensorflow.serving.PredictRequest"
PREDICTION_LOG = "tensorflow.serving.PredictionLog"
TENSOR_PROTO = "tensorflow.TensorProto"
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
METADATA_METHOD = "/tensorflow.serving.PredictionService/GetModelMetadata"
STATUS_METHOD = "/tensorflow.serving.ModelService/GetModelStatus"
PREDICT_RESPONSE = "tensorflow.serving.PredictResponse"
STATUS_REQUEST = "tensorflow.serving.GetModelStatusRequest"
STATUS_RESPONSE = "tensorflow.serving.GetModelStatusResponse"
METADATA_REQUEST = "tensorflow.serving.GetModelMetadataRequest"
METADATA_RESPONSE = "tensorflow.serving.GetModelMetadataResponse"
SIGNATURE_DEF_MAP = "tensorflow.serving.SignatureDefMap"

POOL: descriptor_pool.DescriptorPool = build_pool(FILES)
_MAKING = threading.Lock()


def message_class(full_name: str) -> type[Message]:
    """The class of a message of the toolkit's definitions, e.g. ``PREDICT_REQUEST`` (made
    once, on first use, for every thread)."""
    descriptor = POOL.FindMessageTypeByName(full_name)
    with _MAKING:
        cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


def new_message(full_name: str, **fields: Any) -> Message:
    """A new message of type ``full_name``."""
    return message_class(full_name)(**fields)


_DATA_TYPE = POOL.FindEnumTypeByName("tensorflow.DataType")


def dtype_value(name: str) -> int:
    """Numeric value of a ``tensorflow.DataType`` name such as ``DT_FLOAT``."""
    value = _DATA_TYPE.values_by_name.get(name)
    if value is None:
        raise KeyError(f"unknown tensorflow dtype {name!r}")
    return int(value.number)


def dtype_name(number: int) -> str:
    """Name of a ``tensorflow.DataType`` value."""
    value = _DATA_TYPE.values_by_number.get(number)
    return value.name if value is not None else f"DT_{number}"


def tensor_proto(item: Tensor) -> Message:
    """A TensorProto holding ``item``: numbers as little-endian ``tensor_content``, text in
    ``string_val``."""
    proto: Any = new_message(TENSOR_PROTO)
    proto.dtype = dtype_value(item.dtype)
    for size in item.shape:
        proto.tensor_shape.dim.add(size=size)
    if item.dtype == STRING:
        proto.string_val.extend(item.values)
    else:
        proto.tensor_content = pack(item)
    return proto


def tensor_from_proto(proto: Any) -> Tensor:
    """A tensor from a TensorProto of a numeric dtype or DT_STRING: from ``tensor_content`` or
    the typed value list; one value is repeated to fill the shape, as TFServing allows
    (tensor_util's MakeNdarray). A KeyError names any other dtype."""
    shape = tuple(int(d.size) for d in proto.tensor_shape.dim)
    count = math.prod(shape)
    name = dtype_name(int(proto.dtype))
    if name == STRING:
        values: tuple[Any, ...] = tuple(proto.string_val)
    elif name not in NUMERIC_DTYPES:
        raise KeyError(name)
    elif proto.tensor_content:
        values = unpack(proto.tensor_content, name, count)
    elif name == "DT_HALF":
        values = halves(list(proto.half_val))
    else:
        values = tuple(getattr(proto, NUMERIC_DTYPES[name][1]))
    if len(values) == 1 and count > 1:
        values = values * count
    if len(values) != count:
        raise TensorError(f"{name} tensor holds {len(values)} values for shape {list(shape)}")
    return Tensor(name, shape, values)
