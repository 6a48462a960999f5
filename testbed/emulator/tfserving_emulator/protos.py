"""Text-format config files: ModelServerConfig, BatchingParameters, MonitoringConfig.

ModelServerConfig comes from the tensorflow-serving-api wheel. BatchingParameters and
MonitoringConfig are not shipped in any wheel: they are declared in ``protos/*.proto`` (field
for field from TFServing) and turned into descriptors here by a small reader for the plain
proto3 subset those files use, in a private descriptor pool.

Parsing mirrors util/proto_util.h ParseProtoTextFile: the file is read whole and given to the
text-format parser; any parse failure (unknown field, JSON, ``max_batch_size: 8`` where the
wrapper form is required) is INVALID_ARGUMENT ``Invalid protobuf file: '<path>'``.
"""

from __future__ import annotations

import functools
import pathlib
import re
from typing import TypeVar, cast

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    text_format,
    wrappers_pb2,
)
from google.protobuf.message import Message
from tensorflow_serving.config import model_server_config_pb2

from . import log
from .status import Code, ServingError

PROTO_DIR = pathlib.Path(__file__).parent / "protos"

_SCALARS = {
    "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    "float": descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
}
_FIELD_RE = re.compile(r"(repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;")
_MESSAGE_RE = re.compile(r"message\s+(\w+)\s*\{(.*?)\}", re.S)

M = TypeVar("M", bound=Message)


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def _field(label_repeated: bool, type_name: str, name: str, number: int, package: str
           ) -> descriptor_pb2.FieldDescriptorProto:
    fdp = descriptor_pb2.FieldDescriptorProto(name=name, number=number, json_name=name)
    fdp.label = (descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if label_repeated
                 else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    if type_name in _SCALARS:
        fdp.type = _SCALARS[type_name]
    else:
        fdp.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
        full = type_name if "." in type_name else f"{package}.{type_name}"
        fdp.type_name = "." + full
    return fdp


def file_descriptor_from_proto(path: pathlib.Path) -> descriptor_pb2.FileDescriptorProto:
    """Read a plain proto3 file (messages with scalar/message fields) into a descriptor."""
    text = _strip_comments(path.read_text())
    package = re.search(r"package\s+([\w.]+)\s*;", text)
    pkg = package.group(1) if package else ""
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"tfserving_emulator/{path.name}", package=pkg, syntax="proto3")
    fdp.dependency.extend(re.findall(r'import\s+"([^"]+)"\s*;', text))
    for msg_name, body in _MESSAGE_RE.findall(text):
        msg = fdp.message_type.add(name=msg_name)
        for repeated, type_name, name, number in _FIELD_RE.findall(body):
            msg.field.append(_field(bool(repeated), type_name, name, int(number), pkg))
    return fdp


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    for name in ("session_bundle_config.proto", "monitoring_config.proto", "health.proto"):
        pool.Add(file_descriptor_from_proto(PROTO_DIR / name))
    return pool


def message_class(full_name: str) -> type[Message]:
    """The generated class of one of our own messages, e.g. tensorflow.serving.MonitoringConfig."""
    return cast(type[Message],
                message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name)))


def batching_parameters() -> Message:
    """A fresh, empty BatchingParameters message."""
    return message_class("tensorflow.serving.BatchingParameters")()


def monitoring_config() -> Message:
    """A fresh, empty MonitoringConfig message."""
    return message_class("tensorflow.serving.MonitoringConfig")()


def parse_text(text: str, message: M, path: str) -> M:
    """Parse text-format ``text`` into ``message`` or raise the server's INVALID_ARGUMENT."""
    try:
        text_format.Parse(text, message)
    except (text_format.ParseError, UnicodeDecodeError, ValueError) as exc:
        _log_parse_error(message, exc)
        raise ServingError(Code.INVALID_ARGUMENT, f"Invalid protobuf file: '{path}'") from exc
    return message


def _log_parse_error(message: Message, exc: Exception) -> None:
    """What protobuf's text-format parser logs before ParseProtoTextFile fails."""
    where = "external/com_google_protobuf/src/google/protobuf/text_format.cc:337"
    text = str(exc)
    if isinstance(exc, text_format.ParseError) and exc.GetLine() is not None:
        text = f"{exc.GetLine()}:{exc.GetColumn()}: " + text.split(" : ", 1)[-1]
    log.error(where, f"Error parsing text-format {message.DESCRIPTOR.full_name}: {text}")


def parse_text_file(path: str, message: M) -> M:
    """ParseProtoTextFile: read ``path`` and parse it as text format into ``message``."""
    try:
        data = pathlib.Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ServingError(Code.NOT_FOUND, f"{path}; No such file or directory") from exc
    except OSError as exc:
        raise ServingError(Code.FAILED_PRECONDITION, f"{path}; {exc.strerror}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"Invalid protobuf file: '{path}'") from exc
    return parse_text(text, message, path)


def model_server_config() -> model_server_config_pb2.ModelServerConfig:
    """A fresh, empty ModelServerConfig."""
    return model_server_config_pb2.ModelServerConfig()
