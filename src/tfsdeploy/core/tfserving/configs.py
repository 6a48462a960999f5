"""TFServing's own config messages that no Python package ships.

``tensorflow-serving-api`` carries ``ModelServerConfig`` but not ``BatchingParameters``
(servables/tensorflow/session_bundle_config.proto) nor ``MonitoringConfig``
(config/monitoring_config.proto). They are declared here field for field (names, numbers,
types, wrapper types) from TFServing's .proto files, so that ``text_format`` rejects exactly
what ``TextFormat::ParseFromString`` in the server rejects: unknown fields, JSON, and
``max_batch_size: 8`` where the wrapper form ``max_batch_size { value: 8 }`` is required.

Only protobuf is imported: no TensorFlow on this path.
"""

from __future__ import annotations

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    wrappers_pb2,  # noqa: F401  (registers wrappers.proto in the pool)
)
from google.protobuf.message import Message

_PACKAGE = "tensorflow.serving"
_F = descriptor_pb2.FieldDescriptorProto

# (name, number, type, label, type_name) -- from TFServing @9d981c5
_BATCHING_FIELDS: tuple[tuple[str, int, int, int, str], ...] = (
    ("max_batch_size", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("batch_timeout_micros", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("max_enqueued_batches", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("num_batch_threads", 4, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("thread_pool_name", 5, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.StringValue"),
    ("allowed_batch_sizes", 6, _F.TYPE_INT64, _F.LABEL_REPEATED, ""),
    ("pad_variable_length_inputs", 7, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, ""),
    ("enable_large_batch_splitting", 8, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
     ".google.protobuf.BoolValue"),
    ("max_execution_batch_size", 9, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
     ".google.protobuf.Int64Value"),
)
_PROMETHEUS_FIELDS: tuple[tuple[str, int, int, int, str], ...] = (
    ("enable", 1, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, ""),
    ("path", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
)
_MONITORING_FIELDS: tuple[tuple[str, int, int, int, str], ...] = (
    ("prometheus_config", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
     ".tensorflow.serving.PrometheusConfig"),
)


def _message(name: str, fields: tuple[tuple[str, int, int, int, str], ...]
             ) -> descriptor_pb2.DescriptorProto:
    msg = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, ftype, label, type_name in fields:
        field = msg.field.add(name=field_name, number=number, type=ftype, label=label)
        if type_name:
            field.type_name = type_name
        if label == _F.LABEL_REPEATED and ftype != _F.TYPE_MESSAGE:
            field.options.packed = True
    return msg


def _file(name: str, deps: list[str], *messages: descriptor_pb2.DescriptorProto
          ) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=_PACKAGE, syntax="proto3")
    proto.dependency.extend(deps)
    proto.message_type.extend(messages)
    return proto


def _register(proto: descriptor_pb2.FileDescriptorProto) -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(proto.name)
    except KeyError:
        pool.Add(proto)


_register(_file("tensorflow_serving/servables/tensorflow/session_bundle_config.proto",
                ["google/protobuf/wrappers.proto"],
                _message("BatchingParameters", _BATCHING_FIELDS)))
_register(_file("tensorflow_serving/config/monitoring_config.proto", [],
                _message("PrometheusConfig", _PROMETHEUS_FIELDS),
                _message("MonitoringConfig", _MONITORING_FIELDS)))


def _class(full_name: str) -> type[Message]:
    descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    message_class: type[Message] = message_factory.GetMessageClass(descriptor)
    return message_class


BatchingParameters: type[Message] = _class("tensorflow.serving.BatchingParameters")
PrometheusConfig: type[Message] = _class("tensorflow.serving.PrometheusConfig")
MonitoringConfig: type[Message] = _class("tensorflow.serving.MonitoringConfig")
