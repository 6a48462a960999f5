"""TFServing API messages without importing the ``tensorflow`` package.

``tensorflow_serving.apis.predict_pb2`` imports ``tensorflow.core.framework.tensor_pb2``, and
importing any ``tensorflow.*`` module runs ``tensorflow/__init__.py`` first: about 3 s of
start-up and a few hundred MB, for a load generator that only needs two message types.

So the serialized ``FileDescriptorProto`` that each generated ``*_pb2.py`` file embeds (its
``AddSerializedFile(b'...')`` argument) is read from the installed files as text, and loaded
into a private ``DescriptorPool``. The message classes built from that pool are wire-identical
to the official ones, and the private pool cannot clash with the default pool if some other
code in the process later imports TensorFlow for real.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

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

_ROOT_FILES = ("tensorflow_serving/apis/predict.proto",
               "tensorflow_serving/apis/get_model_status.proto",
               "tensorflow_serving/apis/get_model_metadata.proto")
_LOG_FILE = "tensorflow_serving/apis/prediction_log.proto"
_LITE_FILE = "tfsdeploy/loadtest/prediction_log_lite.proto"
_SERIALIZED = re.compile(r"AddSerializedFile\((b'(?:[^'\\]|\\.)*')\)", re.DOTALL)


class ProtoLoadError(RuntimeError):
    """The installed TFServing API files could not be read."""


def _package_dir(top: str) -> Path:
    """Directory of a top-level package, found without executing its ``__init__``."""
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ProtoLoadError(f"package {top!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


# TensorFlow's wheel vendors XLA's and TSL's protos under tensorflow/compiler/xla/, while
# their .proto names start at xla/ and tsl/.
_VENDORED = {"xla": "tensorflow/compiler/xla", "tsl": "tensorflow/compiler/xla/tsl"}


def _generated_file(proto_name: str) -> Path:
    """The ``_pb2.py`` file generated for ``proto_name`` in the installed packages."""
    top, _, rest = proto_name.partition("/")
    if top in _VENDORED and importlib.util.find_spec(top) is None:
        vendored_top, _, inner = _VENDORED[top].partition("/")
        return _package_dir(vendored_top) / inner / (rest.removesuffix(".proto") + "_pb2.py")
    return _package_dir(top) / (rest.removesuffix(".proto") + "_pb2.py")


def _serialized_from_source(proto_name: str) -> bytes:
    """The serialized descriptor embedded in the ``_pb2.py`` generated for ``proto_name``."""
    path = _generated_file(proto_name)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ProtoLoadError(f"cannot read {path}: {err}") from err
    match = _SERIALIZED.search(text)
    if match is None:
        raise ProtoLoadError(f"no serialized descriptor in {path}")
    value = ast.literal_eval(match.group(1))
    if not isinstance(value, bytes):
        raise ProtoLoadError(f"unexpected descriptor literal in {path}")
    return value


def _serialized(proto_name: str) -> bytes:
    """Serialized descriptor of one .proto file: protobuf's own or from a generated file."""
    if proto_name.startswith("google/protobuf/"):
        module = "google.protobuf." + proto_name.rsplit("/", 1)[1].removesuffix(".proto") + "_pb2"
        return bytes(importlib.import_module(module).DESCRIPTOR.serialized_pb)
    return _serialized_from_source(proto_name)


def _add_with_deps(pool: descriptor_pool.DescriptorPool, name: str, done: set[str]) -> None:
    """Add ``name`` and, first, everything it imports (depth first, each once)."""
    if name in done:
        return
    proto = descriptor_pb2.FileDescriptorProto.FromString(_serialized(name))
    for dep in proto.dependency:
        _add_with_deps(pool, dep, done)
    pool.Add(proto)
    done.add(name)


def _field_number(proto: descriptor_pb2.FileDescriptorProto, message: str, field: str) -> int:
    """Number of ``message.field`` as declared in ``proto``."""
    for msg in proto.message_type:
        if msg.name == message:
            for item in msg.field:
                if item.name == field:
                    return int(item.number)
    raise ProtoLoadError(f"{proto.name}: no field {message}.{field}")


def _lite_log_file() -> descriptor_pb2.FileDescriptorProto:
    """A cut-down PredictionLog that keeps only the Predict request.

    The real ``prediction_log.proto`` imports the session, classification and config protos
    (and through them XLA's), none of which a warmup reader needs; unknown fields of the other
    log kinds are skipped by the parser. Field numbers come from the installed real file.
    """
    real = descriptor_pb2.FileDescriptorProto.FromString(_serialized(_LOG_FILE))
    kind = _field_number(real, "PredictionLog", "predict_log")
    request = _field_number(real, "PredictLog", "request")
    lite = descriptor_pb2.FileDescriptorProto(
        name=_LITE_FILE, package="tensorflow.serving", syntax="proto3",
        dependency=["tensorflow_serving/apis/predict.proto"])
    field = descriptor_pb2.FieldDescriptorProto
    log = lite.message_type.add(name="PredictionLog")
    log.field.add(name="predict_log", number=kind, type=field.TYPE_MESSAGE,
                  label=field.LABEL_OPTIONAL, type_name=".tensorflow.serving.PredictLog")
    predict_log = lite.message_type.add(name="PredictLog")
    predict_log.field.add(name="request", number=request, type=field.TYPE_MESSAGE,
                          label=field.LABEL_OPTIONAL,
                          type_name=".tensorflow.serving.PredictRequest")
    return lite


# One pool and one class per message for the whole process, whichever thread asks first (a
# run's hosts gate in parallel): a message built from another pool's classes is refused
# ("Parameter to CopyFrom() must be instance of same class"). functools.cache would let two
# first callers each build a pool.
_BUILDING = threading.Lock()
_POOLS: list[descriptor_pool.DescriptorPool] = []


def _pool() -> descriptor_pool.DescriptorPool:
    """The private pool: PredictRequest, its dependencies and the cut-down PredictionLog."""
    with _BUILDING:
        if not _POOLS:
            pool = descriptor_pool.DescriptorPool()
            done: set[str] = set()
            for name in _ROOT_FILES:
                _add_with_deps(pool, name, done)
            pool.Add(_lite_log_file())
            _POOLS.append(pool)
        return _POOLS[0]


def message_class(full_name: str) -> type[Message]:
    """The generated class for a message of the private pool, e.g. ``PREDICT_REQUEST``."""
    descriptor = _pool().FindMessageTypeByName(full_name)
    with _BUILDING:  # the class is made once, on first use, for every thread
        cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


def new_message(full_name: str, **fields: Any) -> Message:
    """A new message of type ``full_name``."""
    return message_class(full_name)(**fields)


def dtype_value(name: str) -> int:
    """Numeric value of a ``tensorflow.DataType`` name such as ``DT_FLOAT``."""
    enum = _pool().FindEnumTypeByName("tensorflow.DataType")
    value = enum.values_by_name.get(name)
    if value is None:
        raise KeyError(f"unknown tensorflow dtype {name!r}")
    return int(value.number)


def dtype_name(number: int) -> str:
    """Name of a ``tensorflow.DataType`` value."""
    enum = _pool().FindEnumTypeByName("tensorflow.DataType")
    value = enum.values_by_number.get(number)
    return value.name if value is not None else f"DT_{number}"


# dtype name -> (numpy dtype, TensorProto repeated field used for small values)
NUMERIC_DTYPES: dict[str, tuple[str, str]] = {
    "DT_FLOAT": ("<f4", "float_val"),
    "DT_DOUBLE": ("<f8", "double_val"),
    "DT_HALF": ("<f2", "half_val"),
    "DT_INT8": ("i1", "int_val"),
    "DT_UINT8": ("u1", "int_val"),
    "DT_INT16": ("<i2", "int_val"),
    "DT_UINT16": ("<u2", "int_val"),
    "DT_INT32": ("<i4", "int_val"),
    "DT_INT64": ("<i8", "int64_val"),
    "DT_UINT32": ("<u4", "uint32_val"),
    "DT_UINT64": ("<u8", "uint64_val"),
    "DT_BOOL": ("?", "bool_val"),
}


def tensor_from_array(array: Any, dtype: str) -> Message:
    """A TensorProto of a numeric dtype holding ``array`` as little-endian tensor_content."""
    tensor = new_message(TENSOR_PROTO)
    tensor.dtype = dtype_value(dtype)
    for size in np.shape(array):
        tensor.tensor_shape.dim.add(size=int(size))
    tensor.tensor_content = np.asarray(array).astype(NUMERIC_DTYPES[dtype][0]).tobytes()
    return tensor


def array_from_tensor(tensor: Any) -> Any:
    """A numpy array from a numeric TensorProto (tensor_content or the typed value lists;
    one value is broadcast to the shape, as TFServing allows)."""
    shape = [int(d.size) for d in tensor.tensor_shape.dim]
    np_dtype, field_name = NUMERIC_DTYPES[dtype_name(int(tensor.dtype))]
    if tensor.tensor_content:
        array = np.frombuffer(tensor.tensor_content, dtype=np_dtype)
    elif np_dtype == "<f2":
        array = np.array(list(tensor.half_val), dtype="<u2").view("<f2")
    else:
        array = np.array(list(getattr(tensor, field_name)), dtype=np_dtype)
    count = int(np.prod(shape)) if shape else 1
    if array.size == 1 and count > 1:
        array = np.full(count, array[0], dtype=np_dtype)
    return array.reshape(shape)
