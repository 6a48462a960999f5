"""The toolkit's own definitions of TFServing's messages against tensorflow-serving-api 2.21.

tensorflow-serving-api (and the TensorFlow protos it imports) is the oracle, installed where
the tests run: every message and enum the toolkit declares (core/tfserving/definitions.py) is
compared with the official descriptor of the same full name, field by field (name, number,
label, type, type name, oneof, proto3 optional, map entries, enum values, reserved numbers);
then the same config files and the same messages, every field set, are parsed and rendered
both ways and must give the same bytes and the same text. BatchingParameters and
MonitoringConfig are in no wheel: they are compared with the emulator's independent
transcription of TFServing's .proto files (testbed/emulator/tfserving_emulator/protos).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from tests.bounds import within
from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving import configs
from tfsdeploy.core.tfserving.definitions import FILES, TRIMMED
from tfsdeploy.core.tfserving.schema import Enum, File, build_pool
from tfsdeploy.core.tfserving.schema import Message as Declared
from tfsdeploy.core.tfserving.tensors import tensor
from tfsdeploy.loadtest import payloads

REPO = Path(__file__).resolve().parents[2]
NOT_IN_THE_WHEEL = {"tensorflow.serving.BatchingParameters", "tensorflow.serving.PrometheusConfig",
                    "tensorflow.serving.MonitoringConfig"}
_F = descriptor_pb2.FieldDescriptorProto


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def official() -> descriptor_pool.DescriptorPool:
    """protobuf's default pool with tensorflow-serving-api's messages registered."""
    from tensorflow_serving.apis import (  # noqa: F401
        get_model_metadata_pb2,
        get_model_status_pb2,
        predict_pb2,
        prediction_log_pb2,
    )
    from tensorflow_serving.config import (  # noqa: F401
        model_server_config_pb2,
        platform_config_pb2,
    )

    return descriptor_pool.Default()


@pytest.fixture(scope="module")
def emulator() -> descriptor_pool.DescriptorPool:
    """The emulator's pool of the config messages no wheel ships."""
    sys.path.insert(0, str(REPO / "testbed" / "emulator"))
    from tfserving_emulator import protos

    return protos._pool()


# -- comparing descriptors -------------------------------------------------------------------


def _proto(item: Descriptor | EnumDescriptor) -> Any:
    proto: Any = (descriptor_pb2.DescriptorProto() if isinstance(item, Descriptor)
                  else descriptor_pb2.EnumDescriptorProto())
    item.CopyToProto(proto)
    return proto


def _field_facts(field: Any, message: Any) -> dict[str, Any]:
    """What decides a field's wire and text format (not json_name, comments or options that
    change neither, such as deprecated)."""
    return {"number": field.number, "label": _F.Label.Name(field.label),
            "type": _F.Type.Name(field.type), "type_name": field.type_name,
            "oneof": (message.oneof_decl[field.oneof_index].name
                      if field.HasField("oneof_index") else ""),
            "proto3_optional": field.proto3_optional,
            "packed": field.options.packed if field.options.HasField("packed") else None}


def _enum_differences(name: str, ours: Any, theirs: Any) -> list[str]:
    mine = [(v.name, v.number) for v in ours.value]
    upstream = [(v.name, v.number) for v in theirs.value]
    problems = [f"{name}: value {n} = {k} here, not in tensorflow-serving-api"
                for n, k in sorted(set(mine) - set(upstream))]
    problems += [f"{name}: value {n} = {k} in tensorflow-serving-api, not here"
                 for n, k in sorted(set(upstream) - set(mine))]
    if ours.options.allow_alias != theirs.options.allow_alias:
        problems.append(f"{name}: allow_alias differs")
    return problems


def message_differences(name: str, ours: Any, theirs: Any,
                        trimmed: frozenset[str] = frozenset()) -> list[str]:
    """Every way the message ``ours`` (a DescriptorProto) differs from ``theirs``, its nested
    messages and enums included; fields named in ``trimmed`` are left out on purpose."""
    mine = {f.name: _field_facts(f, ours) for f in ours.field}
    upstream = {f.name: _field_facts(f, theirs) for f in theirs.field if f.name not in trimmed}
    problems = []
    for field in sorted(mine.keys() | upstream.keys()):
        if field not in upstream:
            problems.append(f"{name}.{field}: not in tensorflow-serving-api")
        elif field not in mine:
            problems.append(f"{name}.{field}: missing here")
        elif mine[field] != upstream[field]:
            changed = {k: (mine[field][k], upstream[field][k]) for k in mine[field]
                       if mine[field][k] != upstream[field][k]}
            problems.append(f"{name}.{field}: " + ", ".join(
                f"{k} {a!r} here, {b!r} in tensorflow-serving-api"
                for k, (a, b) in changed.items()))
    if ours.options.map_entry != theirs.options.map_entry:
        problems.append(f"{name}: map_entry differs")
    if ([(r.start, r.end) for r in ours.reserved_range]
            != [(r.start, r.end) for r in theirs.reserved_range]
            or list(ours.reserved_name) != list(theirs.reserved_name)):
        problems.append(f"{name}: reserved numbers or names differ")
    for kind, mine_items, their_items, compare in (
            ("message", ours.nested_type, theirs.nested_type, message_differences),
            ("enum", ours.enum_type, theirs.enum_type, _enum_differences)):
        by_name = {i.name: i for i in their_items}
        for item in mine_items:
            if item.name not in by_name:
                problems.append(f"{name}.{item.name}: {kind} not in tensorflow-serving-api")
            else:
                problems += compare(f"{name}.{item.name}", item, by_name.pop(item.name))
        problems += [f"{name}.{left}: {kind} missing here" for left in sorted(by_name)]
    return problems


def _top_level(files: tuple[File, ...]) -> Iterator[tuple[str, str, bool]]:
    """(full name, file name, is an enum) of every top-level message and enum declared."""
    for file in files:
        for message in file.messages:
            yield f"{file.package}.{message.name}", file.name, False
        for item in file.enums:
            yield f"{file.package}.{item.name}", file.name, True


def differences(files: tuple[File, ...], upstream: descriptor_pool.DescriptorPool,
                *, skip: set[str] = NOT_IN_THE_WHEEL) -> list[str]:
    """Every difference between the declared ``files`` and ``upstream``'s descriptors."""
    pool = build_pool(files)
    problems = []
    for full, file_name, is_enum in _top_level(files):
        if full in skip:
            continue
        find = upstream.FindEnumTypeByName if is_enum else upstream.FindMessageTypeByName
        mine = (pool.FindEnumTypeByName if is_enum else pool.FindMessageTypeByName)(full)
        try:
            theirs = find(full)
        except KeyError:
            problems.append(f"{full}: not in tensorflow-serving-api")
            continue
        if theirs.file.name != file_name:
            problems.append(f"{full}: declared in {file_name}, upstream in {theirs.file.name}")
        if is_enum:
            problems += _enum_differences(full, _proto(mine), _proto(theirs))
        else:
            problems += message_differences(full, _proto(mine), _proto(theirs),
                                            TRIMMED.get(full, frozenset()))
    return problems


def test_every_declared_message_is_tensorflow_serving_api_s(
        official: descriptor_pool.DescriptorPool) -> None:
    assert differences(FILES, official) == []
    declared = {full for full, _, _ in _top_level(FILES)}
    missing = {full for full in declared if not _found(official, full)}
    assert missing == NOT_IN_THE_WHEEL  # the only ones the oracle cannot judge


def _found(pool: descriptor_pool.DescriptorPool, full: str) -> bool:
    for find in (pool.FindMessageTypeByName, pool.FindEnumTypeByName):
        try:
            find(full)
            return True
        except KeyError:
            pass
    return False


def test_the_config_messages_no_wheel_ships_are_the_emulator_s(
        emulator: descriptor_pool.DescriptorPool) -> None:
    files = tuple(file for file in FILES if any(f"{file.package}.{m.name}" in NOT_IN_THE_WHEEL
                                                  for m in file.messages))
    problems = []
    pool = build_pool(FILES)
    for full in sorted(NOT_IN_THE_WHEEL):
        problems += message_differences(full, _proto(pool.FindMessageTypeByName(full)),
                                        _proto(emulator.FindMessageTypeByName(full)))
    assert files and problems == []


def test_the_trimmed_fields_are_upstream_and_nothing_else_is_left_out(
        official: descriptor_pool.DescriptorPool) -> None:
    for full, fields in TRIMMED.items():
        upstream = {f.name for f in official.FindMessageTypeByName(full).fields}
        ours = {f.name for f in tfsapi.POOL.FindMessageTypeByName(full).fields}
        assert fields <= upstream and not fields & ours
        assert ours | fields == upstream


# -- a definition changed here must fail the comparison --------------------------------------


def _changed(files: tuple[File, ...], message: str, change: Any) -> tuple[File, ...]:
    """``files`` with ``change`` applied to the message named ``message`` (a path of names
    from a file's top level)."""
    def visit(item: Declared, path: list[str]) -> Declared:
        if item.name != path[0]:
            return item
        if len(path) == 1:
            return change(item)  # type: ignore[no-any-return]
        return dataclasses.replace(item, nested=tuple(visit(n, path[1:]) for n in item.nested))

    path = message.split(".")
    return tuple(dataclasses.replace(file, messages=tuple(visit(m, path)
                                                           for m in file.messages))
                 for file in files)


def _field_change(field: str, **what: Any) -> Any:
    def change(message: Declared) -> Declared:
        assert any(f.name == field for f in message.fields), field
        return dataclasses.replace(message, fields=tuple(
            dataclasses.replace(f, **what) if f.name == field else f for f in message.fields))
    return change


def _enum_change(enum_name: str, value: str, number: int) -> Any:
    def change(message: Declared) -> Declared:
        def renumbered(item: Enum) -> Enum:
            if item.name != enum_name:
                return item
            return dataclasses.replace(item, values=tuple(
                (n, number if n == value else k) for n, k in item.values))
        return dataclasses.replace(message, enums=tuple(renumbered(e) for e in message.enums))
    return change


@pytest.mark.parametrize("message, change, reported", [
    ("PredictRequest", _field_change("inputs", name="input"),
     ["tensorflow.serving.PredictRequest.input: not in tensorflow-serving-api",
      "tensorflow.serving.PredictRequest.inputs: missing here",
      "tensorflow.serving.PredictRequest.InputEntry: message not in tensorflow-serving-api",
      "tensorflow.serving.PredictRequest.InputsEntry: message missing here"]),
    ("ModelSpec", _field_change("signature_name", number=5),
     ["tensorflow.serving.ModelSpec.signature_name: number 5 here, 3 in "
      "tensorflow-serving-api"]),
    ("ModelConfig", _field_change("base_path", number=10),
     ["tensorflow.serving.ModelConfig.base_path: number 10 here, 2 in tensorflow-serving-api"]),
    ("TensorShapeProto.Dim", _field_change("size", type="int32"),
     ["tensorflow.TensorShapeProto.Dim.size: type 'TYPE_INT32' here, 'TYPE_INT64' in "
      "tensorflow-serving-api"]),
    ("TensorProto", _field_change("float_val", repeated=False),
     ["tensorflow.TensorProto.float_val: label 'LABEL_OPTIONAL' here, 'LABEL_REPEATED' in "
      "tensorflow-serving-api"]),
    ("PredictRequest", _field_change("client_id", presence=False),
     ["tensorflow.serving.PredictRequest.client_id: oneof '' here, '_client_id' in "
      "tensorflow-serving-api, proto3_optional False here, True in tensorflow-serving-api"]),
    ("ModelVersionStatus", _enum_change("State", "AVAILABLE", 31),
     ["tensorflow.serving.ModelVersionStatus.State: value AVAILABLE = 31 here, not in "
      "tensorflow-serving-api",
      "tensorflow.serving.ModelVersionStatus.State: value AVAILABLE = 30 in "
      "tensorflow-serving-api, not here"]),
])
def test_a_renamed_renumbered_or_retyped_definition_fails(
        official: descriptor_pool.DescriptorPool, message: str, change: Any,
        reported: list[str]) -> None:
    changed = _changed(FILES, message, change)
    assert changed != FILES
    assert differences(changed, official) == reported


def test_a_field_dropped_here_fails(official: descriptor_pool.DescriptorPool) -> None:
    def drop(message: Declared) -> Declared:
        return dataclasses.replace(message, fields=tuple(
            f for f in message.fields if f.name != "version_labels"))
    assert differences(_changed(FILES, "ModelConfig", drop), official) == [
        "tensorflow.serving.ModelConfig.version_labels: missing here",
        "tensorflow.serving.ModelConfig.VersionLabelsEntry: message missing here"]


# -- the same files and messages, both ways --------------------------------------------------

RICH_MODEL_CONFIG = """\
model_config_list {
  config {
    name: "resnet50"
    base_path: "/models/resnet50"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
    logging_config {
      log_collector_config { type: "" filename_prefix: "/logs/r" }
      sampling_config { sampling_rate: 0.01 attributes: 1 }
    }
  }
  config {
    name: "ranker"
    base_path: "s3://bucket/ranker"
    model_type: TENSORFLOW
    model_version_policy { latest { num_versions: 2 } }
  }
  config { name: "all" base_path: "/m/all" model_version_policy { all {} } }
}
"""


def _config_files() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted((REPO / "tests" / "golden").rglob("*.config"))]


def _both_ways(text: str, ours: type[Message], theirs: type[Message]) -> None:
    mine, upstream = ours(), theirs()
    text_format.Parse(text, mine)
    text_format.Parse(text, upstream)
    wire = upstream.SerializeToString(deterministic=True)
    assert mine.SerializeToString(deterministic=True) == wire
    assert text_format.MessageToString(mine) == text_format.MessageToString(upstream)
    assert ours.FromString(wire).SerializeToString(deterministic=True) == wire
    assert theirs.FromString(mine.SerializeToString(deterministic=True)) == upstream


def test_config_files_parse_and_render_the_same_both_ways(
        official: descriptor_pool.DescriptorPool,
        emulator: descriptor_pool.DescriptorPool) -> None:
    from google.protobuf import message_factory

    def upstream(pool: descriptor_pool.DescriptorPool, full: str) -> type[Message]:
        cls: type[Message] = message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
        return cls

    roots = {"models.config": (configs.ModelServerConfig,
                               upstream(official, "tensorflow.serving.ModelServerConfig")),
             "batching.config": (configs.BatchingParameters,
                                 upstream(emulator, "tensorflow.serving.BatchingParameters")),
             "monitoring.config": (configs.MonitoringConfig,
                                   upstream(emulator, "tensorflow.serving.MonitoringConfig"))}
    files = _config_files()
    assert len(files) >= 20
    for path, text in files:
        _both_ways(text, *roots[path.name])
    _both_ways(RICH_MODEL_CONFIG, *roots["models.config"])
    _both_ways('platform_configs { key: "tensorflow" value { source_adapter_config { '
               'type_url: "type.googleapis.com/x" value: "\\001" } } }',
               configs.PlatformConfigMap,
               upstream(official, "tensorflow.serving.PlatformConfigMap"))


def _fill(message: Message, variant: int, depth: int = 0) -> None:
    """Set every field of ``message`` (a oneof: its ``variant``-th member), to depth 4."""
    descriptor = message.DESCRIPTOR
    trimmed = TRIMMED.get(descriptor.full_name, frozenset())
    chosen = {o.name: [f for f in o.fields if f.name not in trimmed]
              for o in descriptor.oneofs if not o.name.startswith("_")}
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if field.name in trimmed:
            continue
        if oneof is not None and oneof.name in chosen:
            members = chosen[oneof.name]
            if field is not members[variant % len(members)]:
                continue
        _fill_field(message, field, variant, depth)


def _scalar(field: FieldDescriptor, variant: int, index: int = 0) -> Any:
    t = field.type
    if t == FieldDescriptor.TYPE_ENUM:
        values = field.enum_type.values
        return values[(variant + index + 1) % len(values)].number
    if t in (FieldDescriptor.TYPE_STRING,):
        return f"s{field.number}-{variant}-{index}"
    if t == FieldDescriptor.TYPE_BYTES:
        return bytes([0, 255, field.number % 256, index])
    if t == FieldDescriptor.TYPE_BOOL:
        return True
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return 1.5 + field.number + index
    unsigned = t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64,
                     FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64)
    value = 300 + field.number * 7 + variant + index  # two varint bytes at least
    return value if unsigned else -value  # negative: sign extension, zigzag


def _repeated(field: FieldDescriptor) -> bool:
    """protobuf 7 has ``is_repeated`` and no ``label``; older releases only ``label``."""
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _fill_field(message: Any, field: FieldDescriptor, variant: int, depth: int) -> None:
    value = getattr(message, field.name)
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    if _repeated(field):
        entry = field.message_type if is_message else None
        if entry is not None and entry.GetOptions().map_entry:
            key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
            for index in range(2):
                key = _scalar(key_field, variant, index)
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    if depth < 4:
                        _fill(value[key], variant, depth + 1)
                else:
                    value[key] = _scalar(value_field, variant, index)
            return
        for index in range(2):
            if is_message:
                if depth < 4:
                    _fill(value.add(), variant + index, depth + 1)
            else:
                value.append(_scalar(field, variant, index))
        return
    if is_message:
        if depth < 4:
            _fill(value, variant, depth + 1)
            value.SetInParent()
        return
    setattr(message, field.name, _scalar(field, variant))


ROOTS = ("tensorflow.serving.PredictRequest", "tensorflow.serving.PredictResponse",
         "tensorflow.serving.GetModelStatusRequest", "tensorflow.serving.GetModelStatusResponse",
         "tensorflow.serving.GetModelMetadataRequest",
         "tensorflow.serving.GetModelMetadataResponse", "tensorflow.serving.SignatureDefMap",
         "tensorflow.serving.PredictionLog", "tensorflow.serving.ModelServerConfig",
         "tensorflow.serving.PlatformConfigMap", "tensorflow.StructuredValue")


@pytest.mark.parametrize("root", ROOTS)
def test_every_field_set_gives_the_same_bytes_and_text_both_ways(
        official: descriptor_pool.DescriptorPool, root: str) -> None:
    from google.protobuf import message_factory

    theirs: type[Message] = message_factory.GetMessageClass(official.FindMessageTypeByName(root))
    ours = tfsapi.message_class(root)
    for variant in range(16):  # every member of every oneof (StructuredValue's kind has 16)
        upstream = theirs()
        _fill(upstream, variant)
        wire = upstream.SerializeToString(deterministic=True)
        mine = ours.FromString(wire)
        assert mine.SerializeToString(deterministic=True) == wire
        text = text_format.MessageToString(upstream)
        assert text_format.MessageToString(mine) == text  # a field unknown here would not show
        parsed = ours()
        text_format.Parse(text, parsed)
        assert parsed.SerializeToString(deterministic=True) == wire
        assert theirs.FromString(mine.SerializeToString(deterministic=True)) == upstream


def test_a_trimmed_log_kind_is_kept_as_unknown_bytes(
        official: descriptor_pool.DescriptorPool) -> None:
    from tensorflow_serving.apis import prediction_log_pb2

    log = prediction_log_pb2.PredictionLog()
    log.classify_log.request.model_spec.name = "m"
    log.log_metadata.model_spec.name = "m"
    wire = log.SerializeToString(deterministic=True)
    mine: Any = tfsapi.message_class(tfsapi.PREDICTION_LOG).FromString(wire)
    assert not mine.HasField("predict_log") and mine.log_metadata.model_spec.name == "m"
    assert mine.SerializeToString(deterministic=True) == wire


def test_signature_metadata_unpacks_the_same(official: descriptor_pool.DescriptorPool) -> None:
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    signature.inputs["x"].name = "x:0"
    signature.inputs["x"].dtype = 1
    signature.inputs["x"].tensor_shape.dim.add(size=-1)
    signature.outputs["y"].name = "y:0"
    defs = get_model_metadata_pb2.SignatureDefMap()
    defs.signature_def["serving_default"].CopyFrom(signature)
    reply = get_model_metadata_pb2.GetModelMetadataResponse()
    reply.model_spec.name = "m"
    reply.metadata["signature_def"].Pack(defs)
    mine: Any = tfsapi.message_class(tfsapi.METADATA_RESPONSE).FromString(
        reply.SerializeToString())
    assert mine.metadata["signature_def"].type_url == \
        "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    unpacked: Any = tfsapi.new_message(tfsapi.SIGNATURE_DEF_MAP)
    unpacked.ParseFromString(mine.metadata["signature_def"].value)
    assert unpacked.SerializeToString(deterministic=True) == \
        defs.SerializeToString(deterministic=True)
    assert tfsapi.dtype_name(unpacked.signature_def["serving_default"].inputs["x"].dtype) == \
        "DT_FLOAT"


# -- requests as the toolkit makes them ------------------------------------------------------


def test_cli_start_does_not_import_tensorflow() -> None:
    line = _python("""
        import sys, time
        t = time.process_time()  # CPU time: a stall of a busy machine does not count
        from tfsdeploy.loadtest import cli, payloads
        r = payloads.request_from_json({"inputs": {"x": [[1.0]]}}, {})
        payloads.build_payloads([r], payloads.RequestSpec(model="m"), rest=True)
        cli.build_parser()
        print("x", "tensorflow" in sys.modules,
              any(m.startswith("tensorflow.") for m in sys.modules), time.process_time() - t)
    """)
    _, loaded, loaded_sub, seconds = line.split()
    assert (loaded, loaded_sub) == ("False", "False")
    # CPU time, not wall: importing TensorFlow alone takes several CPU-seconds, the CLI's
    # own modules a tenth of one (0.16 s in a full run of the suite, beside the fleet tests)
    within("CPU time to import and build the load generator's CLI, s", float(seconds),
           below=1.0)


def test_bytes_identical_to_official_predict_request() -> None:
    request: Any = payloads.request_from_json(
        {"signature_name": "serving_default", "inputs": {"x": [[1.0], [2.5]]}}, {})
    payloads.apply_spec(request, payloads.RequestSpec(model="half_plus_two", version=3))
    official = _python("""
        from tensorflow_serving.apis import predict_pb2
        from tensorflow.core.framework import types_pb2
        import numpy as np
        r = predict_pb2.PredictRequest()
        r.model_spec.name = "half_plus_two"
        r.model_spec.signature_name = "serving_default"
        r.model_spec.version.value = 3
        t = r.inputs["x"]
        t.dtype = types_pb2.DT_FLOAT
        t.tensor_shape.dim.add(size=2)
        t.tensor_shape.dim.add(size=1)
        t.tensor_content = np.array([[1.0], [2.5]], dtype="<f4").tobytes()
        print(r.SerializeToString(deterministic=True).hex())
    """)
    assert request.SerializeToString(deterministic=True).hex() == official


@pytest.mark.parametrize("dtype, numpy_type", [
    ("DT_FLOAT", "<f4"), ("DT_DOUBLE", "<f8"), ("DT_HALF", "<f2"), ("DT_INT8", "i1"),
    ("DT_UINT8", "u1"), ("DT_INT16", "<i2"), ("DT_UINT16", "<u2"), ("DT_INT32", "<i4"),
    ("DT_INT64", "<i8"), ("DT_UINT32", "<u4"), ("DT_UINT64", "<u8"), ("DT_BOOL", "?")])
def test_tensor_content_is_numpy_s_little_endian_bytes(dtype: str, numpy_type: str) -> None:
    import numpy as np

    values = [[0, 1, 2], [3, 4, 5]] if dtype != "DT_BOOL" else [[True, False, True]]
    proto: Any = tfsapi.tensor_proto(tensor(values, dtype))
    expected = np.array(values, dtype=numpy_type)
    assert proto.tensor_content == expected.tobytes()
    assert tfsapi.tensor_from_proto(proto).tolist() == expected.tolist()


def test_dtype_names_round_trip() -> None:
    assert tfsapi.dtype_value("DT_FLOAT") == 1
    assert tfsapi.dtype_name(tfsapi.dtype_value("DT_STRING")) == "DT_STRING"


def test_prediction_logs_of_the_official_classes_are_read() -> None:
    blob_hex = _python("""
        from tensorflow_serving.apis import prediction_log_pb2, predict_pb2
        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.model_spec.name = "m"
        log.predict_log.request.inputs["x"].float_val.append(4.0)
        log.predict_log.response.outputs["y"].float_val.append(4.0)
        print(log.SerializeToString().hex())
    """)
    log: Any = tfsapi.message_class(tfsapi.PREDICTION_LOG).FromString(bytes.fromhex(blob_hex))
    assert log.predict_log.request.model_spec.name == "m"
    assert list(log.predict_log.request.inputs["x"].float_val) == [4.0]
