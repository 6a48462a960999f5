"""TFServing request messages without importing the ``tensorflow`` package.

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
from functools import cache
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

PREDICT_REQUEST = "tensorflow.serving.PredictRequest"
PREDICTION_LOG = "tensorflow.serving.PredictionLog"
TENSOR_PROTO = "tensorflow.TensorProto"
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"

_ROOT_FILES = ("tensorflow_serving/apis/predict.proto",)
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


def _serialized_from_source(proto_name: str) -> bytes:
    """The serialized descriptor embedded in the ``_pb2.py`` generated for ``proto_name``."""
    top, _, rest = proto_name.partition("/")
    path = _package_dir(top) / (rest.removesuffix(".proto") + "_pb2.py")
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


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    """The private pool: PredictRequest, its dependencies and the cut-down PredictionLog."""
    pool = descriptor_pool.DescriptorPool()
    done: set[str] = set()
    for name in _ROOT_FILES:
        _add_with_deps(pool, name, done)
    pool.Add(_lite_log_file())
    return pool


def message_class(full_name: str) -> type[Message]:
    """The generated class for a message of the private pool, e.g. ``PREDICT_REQUEST``."""
    descriptor = _pool().FindMessageTypeByName(full_name)
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
