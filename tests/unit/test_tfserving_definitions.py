"""The toolkit's own definitions of TFServing's messages, without TensorFlow: loaded with
neither tensorflow nor tensorflow_serving importable, encoded as the wire format says, parsed
as strictly as the server parses its files; the builder refuses what protoc refuses; tensors
and golden outputs as plain Python values. (tests/loadtest/test_protos.py compares the same
definitions with tensorflow-serving-api's.)"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from google.protobuf import text_format

from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving import configs
from tfsdeploy.core.tfserving.definitions import FILES
from tfsdeploy.core.tfserving.golden import GoldenExample, mismatch, tensor_from_spec
from tfsdeploy.core.tfserving.schema import (
    SchemaError,
    build_pool,
    f,
    mapf,
    msg,
    oneof,
    opt,
    proto_file,
    reserved,
)
from tfsdeploy.core.tfserving.tensors import Tensor, TensorError, tensor


def test_loads_and_works_with_tensorflow_unimportable() -> None:
    code = textwrap.dedent("""
        import sys
        for name in ("tensorflow", "tensorflow_serving", "numpy"):
            sys.modules[name] = None  # any import of them raises ImportError
        from google.protobuf import text_format
        from tfsdeploy.core.tfserving import api, configs
        from tfsdeploy.core.render import validate
        from tfsdeploy.hosts import probes
        from tfsdeploy.loadtest import payloads
        config = configs.ModelServerConfig()
        text_format.Parse('model_config_list { config { name: "m" base_path: "/m" } }', config)
        request = payloads.request_from_json({"inputs": {"x": [[1.0]]}}, {})
        print("ok", config.model_config_list.config[0].name, len(request.SerializeToString()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "m", "25"]


# -- the wire format, byte by byte (tag = field number << 3 | wire type) ---------------------


def test_model_spec_and_predict_request_bytes() -> None:
    request: Any = tfsapi.new_message(tfsapi.PREDICT_REQUEST)
    request.model_spec.name = "m"
    request.model_spec.version.value = 3
    request.inputs["x"].dtype = tfsapi.dtype_value("DT_FLOAT")
    request.inputs["x"].float_val.append(1.0)
    assert request.SerializeToString(deterministic=True) == bytes([
        0x0A, 7,  # 1 model_spec, length 7
        0x0A, 1, ord("m"),  # ModelSpec 1 name
        0x12, 2, 0x08, 3,  # ModelSpec 2 version (Int64Value 1 value: 3)
        0x12, 13,  # 2 inputs: one map entry, length 13
        0x0A, 1, ord("x"),  # entry 1 key
        0x12, 8,  # entry 2 value: TensorProto, length 8
        0x08, 1,  # TensorProto 1 dtype: DT_FLOAT = 1
        0x2A, 4, 0x00, 0x00, 0x80, 0x3F])  # 5 float_val, packed: 1.0f little-endian


def test_status_response_bytes() -> None:
    reply: Any = tfsapi.new_message(tfsapi.STATUS_RESPONSE)
    status = reply.model_version_status.add(version=2)
    status.state = 30  # AVAILABLE
    status.status.error_code = 5  # NOT_FOUND
    status.status.error_message = "e"
    assert reply.SerializeToString() == bytes([
        0x0A, 11, 0x08, 2, 0x10, 30, 0x1A, 5, 0x08, 5, 0x12, 1, ord("e")])
    assert tfsapi.POOL.FindEnumTypeByName(
        "tensorflow.serving.ModelVersionStatus.State").values_by_number[30].name == "AVAILABLE"


def test_config_text_as_the_server_parses_it() -> None:
    config: Any = configs.ModelServerConfig()
    text_format.Parse("""
        model_config_list { config {
          name: "m" base_path: "/m" model_platform: "tensorflow"
          model_version_policy { specific { versions: 1 versions: 2 } }
          version_labels { key: "stable" value: 1 }
          logging_config { sampling_config { sampling_rate: 0.5 } } } }""", config)
    entry = config.model_config_list.config[0]
    assert list(entry.model_version_policy.specific.versions) == [1, 2]
    assert dict(entry.version_labels) == {"stable": 1}
    batching: Any = configs.BatchingParameters()
    text_format.Parse("max_batch_size { value: 8 } allowed_batch_sizes: 4 "
                      "allowed_batch_sizes: 8", batching)
    assert batching.max_batch_size.value == 8
    for text, message in (("max_batch_size: 8", configs.BatchingParameters()),
                          ('{"max_batch_size": {"value": 8}}', configs.BatchingParameters()),
                          ("prometheus_config { enable: true path: 1 2 }",
                           configs.MonitoringConfig()),
                          ('model_config_list { config { nme: "m" } }',
                           configs.ModelServerConfig())):
        with pytest.raises(text_format.ParseError):
            text_format.Parse(text, message)


def test_every_declared_type_loads_and_has_a_class() -> None:
    pool = build_pool(FILES)
    for file in FILES:
        for message in file.messages:
            full = f"{file.package}.{message.name}"
            assert pool.FindMessageTypeByName(full).full_name == full
            assert tfsapi.message_class(full)().DESCRIPTOR.full_name == full


# -- the builder -------------------------------------------------------------------------------


def test_maps_and_proto3_optional_are_built_as_protoc_builds_them() -> None:
    pool = build_pool((proto_file(
        "t/a.proto", "t",
        msg("A", opt("late", 4, "int32"), oneof("kind", f("one", 1, "string"),
                                                f("two", 2, "bytes")),
            mapf("version_labels", 3, "string", "int64"))),))
    a = pool.FindMessageTypeByName("t.A")
    assert [o.name for o in a.oneofs] == ["kind", "_late"]  # real oneofs first
    entry = a.fields_by_name["version_labels"].message_type
    assert entry.full_name == "t.A.VersionLabelsEntry" and entry.GetOptions().map_entry
    assert [(x.name, x.number) for x in entry.fields] == [("key", 1), ("value", 2)]


@pytest.mark.parametrize("message, words", [
    (msg("A", f("x", 1, "Nowhere")), "unknown type 'Nowhere'"),
    (msg("A", f("x", 1, "int32"), f("y", 1, "int32")), "repeats a name or number"),
    (msg("A", f("x", 1, "int32"), f("x", 2, "int32")), "repeats a name or number"),
    (msg("A", f("x", 5, "int32"), reserved((5, 6))), "number 5 is reserved"),
])
def test_definitions_protoc_would_refuse_are_refused(message: Any, words: str) -> None:
    with pytest.raises(SchemaError, match=words):
        build_pool((proto_file("t/a.proto", "t", message),))


def test_files_that_import_each_other_are_refused() -> None:
    with pytest.raises(SchemaError, match="import each other"):
        build_pool((proto_file("t/a.proto", "t", msg("A", f("b", 1, "B"))),
                    proto_file("t/b.proto", "t", msg("B", f("a", 1, "A")))))


# -- tensors -----------------------------------------------------------------------------------


def test_tensors_hold_what_the_dtype_holds() -> None:
    assert tensor([[0.1], [2]], "DT_FLOAT") == Tensor("DT_FLOAT", (2, 1),
                                                     (0.10000000149011612, 2.0))
    assert tensor([1.9, -1.9], "DT_INT32").values == (1, -1)  # truncated toward zero
    assert tensor(7, "DT_INT64").shape == () and tensor(7, "DT_INT64").tolist() == 7
    assert tensor(["a", b"b"], "DT_STRING").values == (b"a", b"b")
    assert tensor(list(range(6)), "DT_UINT8", (2, 3)).tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(TensorError, match="rectangular"):
        tensor([[1.0], [2.0, 3.0]], "DT_FLOAT")
    with pytest.raises(TensorError, match="do not fit DT_UINT8"):
        tensor([256], "DT_UINT8")
    with pytest.raises(TensorError, match="do not fill shape"):
        tensor([1, 2, 3], "DT_INT32", (2, 2))
    with pytest.raises(TensorError, match="unsupported dtype DT_COMPLEX64"):
        tensor([1], "DT_COMPLEX64")


@pytest.mark.parametrize("dtype", ["DT_FLOAT", "DT_DOUBLE", "DT_HALF", "DT_INT8", "DT_UINT8",
                                   "DT_INT16", "DT_UINT16", "DT_INT32", "DT_INT64",
                                   "DT_UINT32", "DT_UINT64", "DT_BOOL", "DT_STRING"])
def test_tensor_protos_round_trip(dtype: str) -> None:
    values = {"DT_BOOL": [[True, False]], "DT_STRING": [[b"a", b"\xff"]]}.get(
        dtype, [[1, 2]])
    item = tensor(values, dtype)
    assert tfsapi.tensor_from_proto(tfsapi.tensor_proto(item)) == item


def test_typed_value_lists_half_floats_and_one_value_for_all() -> None:
    proto: Any = tfsapi.new_message(tfsapi.TENSOR_PROTO)
    proto.dtype = tfsapi.dtype_value("DT_HALF")
    proto.tensor_shape.dim.add(size=3)
    proto.half_val.append(0x3C00)  # 1.0 in float16: repeated to fill the shape
    assert tfsapi.tensor_from_proto(proto).values == (1.0, 1.0, 1.0)
    proto.dtype = tfsapi.dtype_value("DT_RESOURCE")
    with pytest.raises(KeyError):
        tfsapi.tensor_from_proto(proto)


def test_golden_outputs() -> None:
    example = GoldenExample("serving_default", {"x": tensor_from_spec(
        {"dtype": "DT_FLOAT", "shape": [2, 2], "fill": {"kind": "ramp", "modulus": 3,
                                                       "scale": 0.5}})},
        {"y": {"values": [[1.0], [2.0]]},
         "p": {"top_k": {"indices": [[2], [0]], "values": [[0.5], [0.25]]}}}, 1e-6, 1e-6)
    assert example.inputs["x"].tolist() == [[0.0, 0.5], [1.0, 0.0]]
    right = {"y": tensor([[1.0], [2.0]], "DT_FLOAT"),
             "p": tensor([[0.1, 0.2, 0.5], [0.25, 0.7, 0.05]], "DT_FLOAT")}
    assert mismatch(example, right) is None
    assert "got 2.5, expected 2" in (mismatch(example, {**right, "y": tensor(
        [[1.0], [2.5]], "DT_FLOAT")}) or "")
    assert "differs: got nan" in (mismatch(example, {**right, "y": tensor(
        [[1.0], [math.nan]], "DT_FLOAT")}) or "")
    assert "has shape (2,), expected (2, 1)" in (mismatch(example, {**right, "y": tensor(
        [1.0, 2.0], "DT_FLOAT")}) or "")
    assert "'p' differs: got 0.2" in (mismatch(example, {**right, "p": tensor(
        [[0.1, 0.5, 0.2], [0.25, 0.7, 0.05]], "DT_FLOAT")}) or "")
    assert mismatch(example, {"y": right["y"]}) == "output 'p' missing (got ['y'])"
