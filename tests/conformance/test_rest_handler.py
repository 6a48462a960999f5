"""REST cases of tensorflow_serving/model_servers/http_rest_api_handler_test.cc (against
saved_model_half_plus_two_2_versions, version 123 only, labelled Version_Label after start) and
of tensorflow_serving/util/json_tensor_test.cc that a server with a float input ``x`` can show.

The handler test checks status codes and message substrings; so do these.
"""

from __future__ import annotations

import json
import math

import pytest
from conformance_support import SHARED_CONTAINERS, TESTDATA, Container, http, post_json

pytestmark = SHARED_CONTAINERS

MODEL = "saved_model_half_plus_two_2_versions"
LABEL = "Version_Label"
STATUS_123 = {"model_version_status": [{
    "version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}


@pytest.fixture(scope="module")
def rest(servers: dict[str, Container]) -> str:
    return servers["main"].rest


def request(rest: str, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str]]:
    status, text, _headers = http(method, rest + path, body if method == "POST" else None)
    return status, (json.loads(text) if text else {})


# ------------------------------------------------------------------ http_rest_api_handler_test

@pytest.mark.parametrize(("method", "path", "message"), [
    ("GET", "/v1/foo", "Malformed request"),
    ("POST", "/v1/foo", "Malformed request"),
    ("GET", "/v1/models", "Missing model name"),
    ("GET", "/v1/models/debug/model_name", "Malformed request"),
    ("POST", "/v1/models", "Malformed request"),
    ("GET", "/v1/models/foo:predict", "Malformed request"),
    ("GET", "/v1/models/foo/version/50:predict", "Malformed request"),
    ("POST", "/v1/models/foo/version/50:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/HELLO:regress", "Malformed request"),
    ("POST", f"/v1/models/foo/versions/{2**64 - 1}:regress", "Failed to convert version"),
    ("POST", "/v1/models/foo/metadata", "Malformed request"),
    ("POST", "/v1/models/foo/label/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/50/labels/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/some_label:regress", "Malformed request"),
])
def test_unsupported_api_calls(rest: str, method: str, path: str, message: str) -> None:
    """UnsupportedApiCalls: INVALID_ARGUMENT (HTTP 400) naming the problem."""
    status, document = request(rest, method, path)
    assert status == 400
    assert message in document["error"]


@pytest.mark.parametrize("path", ["/v1/models/foo:predict", "/v1/models/foo/versions/50:predict",
                                  f"/v1/models/{MODEL}99:predict"])
def test_predict_model_name_version_errors(rest: str, path: str) -> None:
    """PredictModelNameVersionErrors: NOT_FOUND (HTTP 404)."""
    assert request(rest, "POST", path, b'{ "instances": [1] }')[0] == 404


@pytest.mark.parametrize(("path", "body", "message"), [
    (f"/v1/models/{MODEL}:predict", b"", "JSON Parse error: The document is empty"),
    (f"/v1/models/{MODEL}:predict", b"instances = [1, 2]", "JSON Parse error: Invalid value"),
    (f"/v1/models/{MODEL}:predict", b'{ "instances": ["x", "y"] }',
     "not of expected type: float"),
    (f"/v1/models/{MODEL}/labels/Version_Nonexistent:predict", b'{ "instances": ["x", "y"] }',
     "Unrecognized servable version label"),
    (f"/v1/models/{MODEL}:predict", b'{ "signature_name": 100 }',
     "'signature_name' key must be a string value."),
])
def test_predict_request_errors(rest: str, path: str, body: bytes, message: str) -> None:
    """PredictRequestErrors: INVALID_ARGUMENT (HTTP 400) naming the problem."""
    status, document = request(rest, "POST", path, body)
    assert status == 400
    assert message in document["error"]


@pytest.mark.parametrize(("path", "body", "expected"), [
    (f"/v1/models/{MODEL}:predict", {"instances": [[1.0, 2.0], [3.0, 4.0]]},
     {"predictions": [[2.5, 3.0], [3.5, 4.0]]}),
    (f"/v1/models/{MODEL}/versions/123:predict", {"instances": [1.0, 2.0]},
     {"predictions": [2.5, 3.0]}),
    (f"/v1/models/{MODEL}/labels/{LABEL}:predict", {"instances": [1.0, 2.0]},
     {"predictions": [2.5, 3.0]}),
    (f"/v1/models/{MODEL}/versions/123:predict",
     {"signature_name": "serving_default", "instances": [3.0, 4.0]}, {"predictions": [3.5, 4.0]}),
    (f"/v1/models/{MODEL}/versions/123:predict",
     {"signature_name": "serving_default", "inputs": [3.0, 4.0]}, {"outputs": [3.5, 4.0]}),
])
def test_predict(rest: str, path: str, body: object, expected: object) -> None:
    """Predict: latest, a version, a label, an explicit signature, columnar inputs; JSON."""
    status, text, headers = http("POST", rest + path, json.dumps(body).encode())
    assert (status, json.loads(text)) == (200, expected)
    assert headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("path", [f"/v1/models/{MODEL}:regress",
                                  f"/v1/models/{MODEL}/versions/123:regress",
                                  f"/v1/models/{MODEL}/labels/{LABEL}:regress"])
def test_regress(rest: str, path: str) -> None:
    """Regress: x = 80 gives 42."""
    assert post_json(rest + path, {"signature_name": "regress_x_to_y",
                                   "examples": [{"x": 80.0}]}) == (200, {"results": [42.0]})


@pytest.mark.parametrize(("path", "x", "expected"), [
    (f"/v1/models/{MODEL}:classify", 20.0, 12.0),
    (f"/v1/models/{MODEL}/labels/{LABEL}:classify", 10.0, 7.0),
])
def test_classify(rest: str, path: str, x: float, expected: float) -> None:
    """Classify: [label, score] pairs with an empty label."""
    assert post_json(rest + path, {"signature_name": "classify_x_to_y",
                                   "examples": [{"x": x}]}) == \
        (200, {"results": [[["", expected]]]})


@pytest.mark.parametrize("path", [f"/v1/models/{MODEL}", f"/v1/models/{MODEL}/versions/123",
                                  f"/v1/models/{MODEL}/labels/{LABEL}"])
def test_get_status(rest: str, path: str) -> None:
    """GetStatus: the same one-version answer for the model, a version, a label."""
    status, text, headers = http("GET", rest + path)
    assert (status, json.loads(text)) == (200, STATUS_123)
    assert headers["Content-Type"] == "application/json"


def test_get_model_metadata(rest: str) -> None:
    """GetModelMetadata: equal to testdata/saved_model_half_plus_two_2_versions_metadata.json
    (the handler test compares the parsed documents)."""
    status, text, _headers = http("GET", f"{rest}/v1/models/{MODEL}/metadata")
    assert status == 200
    expected = json.loads((TESTDATA / f"{MODEL}_metadata.json").read_text())
    assert json.loads(text) == expected


# ------------------------------------------------------------------ json_tensor_test

@pytest.mark.parametrize(("body", "message"), [
    (b"", "document is empty"),
    (b'{"signature_name": 5, "instances": [[1,2],[3,4],[5,6,7]]}', "must be a string value"),
    (b'{"instances": [[1,2],[3,4],[5,6,7]], "inputs": [[1,2],[3,4],[5,6,7]]}',
     "Not formatted correctly"),
    (b'{"instances": [[1,2],[3,4],[5,6,7]]}', "Expecting tensor size"),
    (b'{"instances": [[1,2],[3,4],[[5,6]]]}', "Expecting shape"),
    (b'{"instances": [1, [1]]}', "Expecting shape"),
    (b'{"instances": [[1,2],["a", "b"]]}', "not of expected type"),
])
def test_single_unnamed_tensor_errors(rest: str, body: bytes, message: str) -> None:
    """SingleUnnamedTensorErrors."""
    status, document = request(rest, "POST", "/v1/models/default:predict", body)
    assert status == 400
    assert message in document["error"]


def test_mixed_input_for_float_tensor(rest: str) -> None:
    """MixedInputForFloatTensor: integers and decimals both fill a float tensor."""
    values = [1, 2.0, 3, 4, 5.003, 0.007, 0.0]
    status, document = post_json(f"{rest}/v1/models/default:predict", {"instances": values})
    assert status == 200
    assert document["predictions"] == pytest.approx([0.5 * v + 2 for v in values], rel=1e-6)


def test_float_tensor_with_precision_loss(rest: str) -> None:
    """FloatTensorWithPrecisionLoss: 1435774380 and 1435774380.0 are both accepted."""
    for body in (b'{"instances": [1435774380]}', b'{"instances": [1435774380.0]}'):
        status, document = request(rest, "POST", "/v1/models/default:predict", body)
        assert status == 200
        assert document["predictions"] == [pytest.approx(0.5 * 1435774380 + 2, rel=1e-6)]


def test_non_finite_floats(rest: str) -> None:
    """FloatTensorThatExceedsMaxReturnsInf and FromJsonSingleFloatTensorNonFinite: a double
    beyond float's range becomes inf, NaN and infinities travel as NaN/Infinity tokens."""
    status, text, _headers = http("POST", f"{rest}/v1/models/default:predict",
                                  b'{"instances": [1.7976931348623157e308, NaN, -Infinity]}')
    assert status == 200
    assert "Infinity" in text and "NaN" in text
    predictions = json.loads(text)["predictions"]
    assert predictions[0] == math.inf and math.isnan(predictions[1])
    assert predictions[2] == -math.inf


@pytest.mark.parametrize(("body", "message"), [
    ({"signature_name": ["hello"], "examples": [{"names": ["foo", "bar"]}]},
     "'signature_name' key must be a string"),
    ({"context": [{"names": ["foo", "bar"]}]}, "Example must be JSON object"),
    ({"examples": {"names": ["foo", "bar"]}}, "list/array"),
    ({"examples": [[{"names": ["foo", "bar"]}]]}, "Example must be JSON object"),
    ({"examples": [{"names": [10, None]}]}, "names has element with unexpected JSON type: Null"),
    ({"examples": [{"names": [10, 10.0]}]}, "feature: names expecting type: int64"),
    ({"examples": [{"names": [10, {"test": 10}]}]},
     "names has element with unexpected JSON type: Object"),
    ({"examples": [{"names": [[10], 20]}]}, "names has element with unexpected JSON type: Array"),
    ({"examples": [{"names": [20, 18446744073709551603]}]}, "Only int64_t is supported"),
])
def test_classify_regress_json_errors(rest: str, body: object, message: str) -> None:
    """ClassifyRegressRequestTest.JsonErrors, for regress and classify alike."""
    for verb in ("regress", "classify"):
        status, document = post_json(f"{rest}/v1/models/default:{verb}", body)
        assert status == 400
        assert message in document["error"]
