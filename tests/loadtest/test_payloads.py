"""Request data: ghz JSON, REST JSON, warmup records, REST bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving.tfrecord import frame_record
from tfsdeploy.core.tfserving.warmup_records import (
    WARMUP_RELATIVE,
    WarmupError,
    requests_from_warmup,
)
from tfsdeploy.loadtest import payloads


def _request(obj: dict[str, Any], **dtypes: str) -> Any:
    return payloads.request_from_json(obj, dtypes)


def test_rest_columnar_numbers_become_float_tensor() -> None:
    request = _request({"inputs": {"x": [[1.0], [2.0]]}})
    tensor = request.inputs["x"]
    assert tfsapi.dtype_name(tensor.dtype) == "DT_FLOAT"
    assert [d.size for d in tensor.tensor_shape.dim] == [2, 1]
    assert payloads.tensor_to_json(tensor) == [[1.0], [2.0]]


def test_instances_rows_with_names_become_columns() -> None:
    request = _request({"instances": [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]}, a="DT_INT64")
    assert payloads.tensor_to_json(request.inputs["a"]) == [1, 2]
    assert payloads.tensor_to_json(request.inputs["b"]) == ["x", "y"]


def test_ghz_protobuf_json_is_parsed_as_is() -> None:
    request = _request({"model_spec": {"name": "m", "signature_name": "s"},
                        "inputs": {"x": {"dtype": "DT_INT32", "tensor_shape": {"dim": [
                            {"size": 3}]}, "int_val": [1, 2, 3]}}})
    assert request.model_spec.name == "m"
    assert payloads.tensor_to_json(request.inputs["x"]) == [1, 2, 3]


def test_ragged_input_is_rejected() -> None:
    with pytest.raises(payloads.PayloadError, match=r"ragged|rectangular"):
        _request({"inputs": {"x": [[1.0], [2.0, 3.0]]}})


def test_model_name_is_required() -> None:
    request = _request({"inputs": {"x": [1.0]}})
    with pytest.raises(payloads.PayloadError, match="--model"):
        payloads.build_payloads([request], payloads.RequestSpec(), rest=False)


def test_overrides_and_rest_body() -> None:
    request = _request({"signature_name": "serving_default", "inputs": {"x": [[1.5]]}})
    built = payloads.build_payloads(
        [request], payloads.RequestSpec(model="half_plus_two", version=2), rest=True)
    path, body = built.rest[0]
    assert path == "/v1/models/half_plus_two/versions/2:predict"
    assert json.loads(body) == {"inputs": {"x": [[1.5]]}, "signature_name": "serving_default"}
    parsed: Any = tfsapi.message_class(tfsapi.PREDICT_REQUEST).FromString(built.grpc[0])
    assert parsed.model_spec.version.value == 2


def test_warmup_records_keep_predict_requests_only(tmp_path: Path) -> None:
    log_class = tfsapi.message_class(tfsapi.PREDICTION_LOG)
    good: Any = log_class()
    good.predict_log.request.model_spec.name = "m"
    good.predict_log.request.inputs["x"].CopyFrom(
        payloads.tensor_from_json("x", [[1.0]], {}))
    other = b"\x12\x00"  # field 2 (classify_log), empty: not a Predict request
    warmup = tmp_path / "1" / WARMUP_RELATIVE
    warmup.parent.mkdir(parents=True)
    warmup.write_bytes(frame_record(good.SerializeToString()) + frame_record(other))
    requests: list[Any] = requests_from_warmup(tmp_path / "1")
    assert len(requests) == 1
    assert requests[0].model_spec.name == "m"


def test_missing_warmup_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(WarmupError, match="no warmup records"):
        requests_from_warmup(tmp_path)
