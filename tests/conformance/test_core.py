"""gRPC cases of get_model_status_impl_test.cc, predict_impl_test.cc and server_core_test.cc
(model_servers/ and servables/tensorflow/), and server.cc's start-up order.

The C++ tests call the implementations directly; here the same requests go through the
server's gRPC API, so an implementation error arrives as the gRPC status with that code.
ServerCore sequences use HandleReloadConfigRequest on the ``core`` container.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from conformance_support import (
    RPC_TIMEOUT,
    SHARED_CONTAINERS,
    Container,
    main_config,
    port_open,
    wait_until,
)
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_management_pb2,
    predict_pb2,
)
from tensorflow_serving.config import model_server_config_pb2

pytestmark = SHARED_CONTAINERS

TWO_VERSIONS = "/testdata/saved_model_half_plus_two_2_versions"


@pytest.fixture(scope="module")
def main(servers: dict[str, Container]) -> tuple[Any, Any]:
    return servers["main"].stubs()


def code_of(call: Any, request: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(request, RPC_TIMEOUT)
    return info.value.code()


def status_request(name: str = "", version: int | None = None
                   ) -> get_model_status_pb2.GetModelStatusRequest:
    request = get_model_status_pb2.GetModelStatusRequest()
    if name:
        request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    return request


def scalar(value: float | bytes, dtype: int = types_pb2.DT_FLOAT) -> tensor_pb2.TensorProto:
    """A TensorProto with one value and no shape (a scalar), as the C++ tests build them."""
    tensor = tensor_pb2.TensorProto(dtype=dtype)
    if dtype == types_pb2.DT_STRING:
        tensor.string_val.append(value)  # type: ignore[arg-type]
        tensor.tensor_shape.dim.add().size = 1
    else:
        tensor.float_val.append(value)  # type: ignore[arg-type]
    return tensor


def predict_request(name: str = "default", version: int | None = 123, signature: str = ""
                    ) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    request.model_spec.signature_name = signature
    return request


# ------------------------------------------------------------------ get_model_status_impl_test

def test_missing_or_empty_model_spec(main: tuple[Any, Any]) -> None:
    """MissingOrEmptyModelSpecFailure."""
    _predict, models = main
    assert code_of(models.GetModelStatus, status_request()) == grpc.StatusCode.INVALID_ARGUMENT


def test_invalid_model_name_and_version(main: tuple[Any, Any]) -> None:
    """InvalidModelNameFailure, InvalidModelVersionFailure: NOT_FOUND."""
    _predict, models = main
    assert code_of(models.GetModelStatus, status_request("nonexistent_model")) == \
        grpc.StatusCode.NOT_FOUND
    assert code_of(models.GetModelStatus, status_request("two_versions_both", 125)) == \
        grpc.StatusCode.NOT_FOUND


def test_all_versions_and_single_version(main: tuple[Any, Any]) -> None:
    """AllVersionsSuccess, SingleVersionSuccess."""
    _predict, models = main
    result = models.GetModelStatus(status_request("two_versions_both"), RPC_TIMEOUT)
    assert {s.version for s in result.model_version_status} == {123, 124}
    assert all(s.status.error_code == 0 and s.status.error_message == ""
               for s in result.model_version_status)
    result = models.GetModelStatus(status_request("two_versions_both", 123), RPC_TIMEOUT)
    assert [(s.version, s.status.error_code) for s in result.model_version_status] == [(123, 0)]


# ------------------------------------------------------------------ predict_impl_test

def test_predict_missing_or_empty_model_spec(main: tuple[Any, Any]) -> None:
    """MissingOrEmptyModelSpec: no spec and an empty name are INVALID_ARGUMENT, an unknown
    name NOT_FOUND."""
    predict, _models = main
    assert code_of(predict.Predict, predict_pb2.PredictRequest()) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(predict.Predict, predict_request("", None)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(predict.Predict, predict_request("test", None)) == grpc.StatusCode.NOT_FOUND


def test_empty_input_list_and_wrong_inputs(main: tuple[Any, Any]) -> None:
    """EmptyInputList, InputTensorsDontMatchModelSpecInputs, InputTensorsHaveWrongType."""
    predict, _models = main
    assert code_of(predict.Predict, predict_request()) == grpc.StatusCode.INVALID_ARGUMENT
    request = predict_request()
    request.inputs["key"].CopyFrom(scalar(b"any_key", types_pb2.DT_STRING))
    assert code_of(predict.Predict, request) == grpc.StatusCode.INVALID_ARGUMENT
    request = predict_request()
    request.inputs["x"].CopyFrom(scalar(b"any_key", types_pb2.DT_STRING))
    request.output_filter.append("y")
    assert code_of(predict.Predict, request) == grpc.StatusCode.INVALID_ARGUMENT


def test_output_filters(main: tuple[Any, Any]) -> None:
    """OutputFiltersDontMatchModelSpecOutputs: unknown and duplicate aliases are refused."""
    predict, _models = main
    request = predict_request()
    request.inputs["x"].CopyFrom(scalar(2.0))
    request.output_filter.append("output_filter")
    assert code_of(predict.Predict, request) == grpc.StatusCode.INVALID_ARGUMENT
    del request.output_filter[:]
    request.output_filter.append("y")
    predict.Predict(request, RPC_TIMEOUT)
    request.output_filter.append("y")
    assert code_of(predict.Predict, request) == grpc.StatusCode.INVALID_ARGUMENT


def expected_response(name: str, signature: str, alias: str, value: float
                      ) -> predict_pb2.PredictResponse:
    expected = predict_pb2.PredictResponse()
    expected.model_spec.name = name
    expected.model_spec.version.value = 123
    expected.model_spec.signature_name = signature
    output = expected.outputs[alias]
    output.dtype = types_pb2.DT_FLOAT
    output.tensor_shape.SetInParent()
    output.float_val.append(value)
    return expected


def test_prediction_success(main: tuple[Any, Any]) -> None:
    """PredictionSuccess: a scalar x = 2 gives the scalar y = 3, the whole response equal."""
    predict, _models = main
    request = predict_request()
    request.inputs["x"].CopyFrom(scalar(2.0))
    assert predict.Predict(request, RPC_TIMEOUT) == \
        expected_response("default", "serving_default", "y", 3.0)


def test_prediction_with_named_regression_signature(main: tuple[Any, Any]) -> None:
    """PredictionWithNamedRegressionSignature: regress_x2_to_y3 through Predict."""
    predict, _models = main
    request = predict_request(signature="regress_x2_to_y3")
    request.inputs["inputs"].CopyFrom(scalar(2.0))
    assert predict.Predict(request, RPC_TIMEOUT) == \
        expected_response("default", "regress_x2_to_y3", "outputs", 4.0)


def test_prediction_with_named_classification_signature(main: tuple[Any, Any]) -> None:
    """PredictionWithNamedClassificationSignature: classify_x2_to_y3 through Predict (the TF2
    export has this signature; the TF1 one of the shared data does not)."""
    predict, _models = main
    request = predict_request("tf2", signature="classify_x2_to_y3")
    request.inputs["inputs"].CopyFrom(scalar(2.0))
    assert predict.Predict(request, RPC_TIMEOUT) == \
        expected_response("tf2", "classify_x2_to_y3", "scores", 4.0)


def test_prediction_with_customized_signatures(main: tuple[Any, Any]) -> None:
    """PredictionWithCustomizedSignatures: the stateful counter, in this order."""
    predict, _models = main
    request = predict_request("counter")

    def call(signature: str, expected: float) -> None:
        request.model_spec.signature_name = signature
        response = predict.Predict(request, RPC_TIMEOUT)
        assert response == expected_response("counter", signature, "output", expected)

    call("get_counter", 0.0)
    call("incr_counter", 1.0)
    call("reset_counter", 0.0)
    request.output_filter.append("output")
    call("incr_counter", 1.0)
    del request.output_filter[:]
    request.inputs["delta"].CopyFrom(scalar(3.0))
    call("incr_counter_by", 4.0)


# ------------------------------------------------------------------ server_core_test

def config_of(text: str) -> model_server_config_pb2.ModelServerConfig:
    return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())


# the core container's own model stays in every list (test_model_server.py uses it)
KEEP = ('config { name: "half_plus_two" base_path: "/testdata/saved_model_half_plus_two_cpu" '
        'model_platform: "tensorflow" }')


def two_versions(labels: str = "") -> model_server_config_pb2.ModelServerConfig:
    return config_of(f'model_config_list {{ {KEEP} config {{ name: "two" '
                     f'base_path: "{TWO_VERSIONS}" model_platform: "tensorflow" '
                     'model_version_policy { specific { versions: 123 versions: 124 } } '
                     f'{labels} }} }}')


def reload(models: Any, config: model_server_config_pb2.ModelServerConfig) -> Any:
    return models.HandleReloadConfigRequest(
        model_management_pb2.ReloadConfigRequest(config=config), timeout=RPC_TIMEOUT * 3)


def reload_error(models: Any, config: model_server_config_pb2.ModelServerConfig
                 ) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        reload(models, config)
    return info.value.code(), info.value.details()


def states(models: Any, name: str) -> dict[int, int]:
    result = models.GetModelStatus(status_request(name), RPC_TIMEOUT)
    return {s.version: s.state for s in result.model_version_status}


def version_served(predict: Any, spec: dict[str, Any]) -> int:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "two"
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            request.model_spec.version_label = value
    request.inputs["x"].CopyFrom(scalar(2.0))
    return int(predict.Predict(request, RPC_TIMEOUT).model_spec.version.value)


def test_server_core_reload_sequences(servers: dict[str, Container]) -> None:
    """ReloadConfigWaitsTillModelsAvailable, ModelSpecMultipleVersionsAvailable,
    AssignLabelToUnavailableVersionAllowed, AssignExistingLabelToUnavailableVersionDisallowed,
    ReloadConfigUnloadsModels, ReloadConfigHandlesLoadingAPreviouslyUnloadedModel,
    DuplicateModelNameInConfig, RelativePathFails, UnknownModelPlatform,
    IllegalConfigModelTypeAndPlatformSet, DeprecatedModelTypeConfig. The ``core`` container
    allows labels for unavailable versions."""
    predict, models = servers["core"].stubs()
    # the reload returns once the new model's latest version is available; the test then
    # waits for both versions (test_util::WaitUntilVersionsAvailable)
    assert reload(models, two_versions()).status.error_code == 0
    assert states(models, "two")[124] == 30
    wait_until(lambda: states(models, "two") == {124: 30, 123: 30}, what="both AVAILABLE")
    assert version_served(predict, {}) == 124
    assert version_served(predict, {"version": 123}) == 123
    labelled = 'version_labels { key: "A" value: 123 } version_labels { key: "B" value: 124 }'
    assert reload(models, two_versions(labelled)).status.error_code == 0
    assert version_served(predict, {"label": "A"}) == 123
    assert version_served(predict, {"label": "B"}) == 124
    with pytest.raises(grpc.RpcError) as info:
        version_served(predict, {"label": "nonexistent label"})
    assert "Unrecognized servable version label" in info.value.details()
    # a new label may name an unavailable version (allowed by the flag) ...
    assert reload(models, two_versions(labelled + ' version_labels { key: "nice try" '
                                       "value: 777 }")).status.error_code == 0
    # ... an existing one may not move to it
    code, message = reload_error(models, two_versions(
        'version_labels { key: "A" value: 777 } version_labels { key: "B" value: 124 }'))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "not currently available for inference" in message
    # a list without the model unloads it, the same list as before loads it again
    assert reload(models, config_of(f"model_config_list {{ {KEEP} }}")).status.error_code == 0
    wait_until(lambda: states(models, "two") == {124: 50, 123: 50}, what="both versions END")
    assert reload(models, two_versions()).status.error_code == 0
    assert states(models, "two")[124] == 30
    wait_until(lambda: states(models, "two") == {124: 30, 123: 30}, what="both AVAILABLE")
    # configurations the core refuses
    duplicate = two_versions()
    duplicate.model_config_list.config.add().CopyFrom(duplicate.model_config_list.config[1])
    relative = two_versions()
    relative.model_config_list.config[1].base_path = "relative/path"
    unknown = two_versions()
    unknown.model_config_list.config[1].model_platform = "not_a_known_platform"
    both = two_versions()
    both.model_config_list.config[1].model_type = model_server_config_pb2.TENSORFLOW
    for config, text in ((duplicate, "multiple times"), (relative, "absolute path"),
                         (unknown, "not_a_known_platform"), (both, "Illegal setting both")):
        code, message = reload_error(models, config)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and text in message
    deprecated = two_versions()
    deprecated.model_config_list.config[1].model_platform = ""
    deprecated.model_config_list.config[1].model_type = model_server_config_pb2.TENSORFLOW
    assert reload(models, deprecated).status.error_code == 0
    assert states(models, "two")[124] == 30


def test_label_to_unavailable_version_needs_the_flag(main: tuple[Any, Any],
                                                     servers: dict[str, Container]) -> None:
    """AssignLabelToUnavailableVersion (the ``main`` container has no allow flag): the reload
    fails before any model changes."""
    _predict, models = main
    config = config_of(main_config(label=True))
    for entry in config.model_config_list.config:
        if entry.name == "two_versions_both":
            entry.version_labels["nice try"] = 777
    code, message = reload_error(models, config)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "not currently available for inference" in message
    assert states(models, "two_versions_both") == {124: 30, 123: 30}


# ------------------------------------------------------------------ server.cc start-up order

def test_failure_after_grpc_start_leaves_grpc_serving(servers: dict[str, Container]) -> None:
    """server.cc BuildAndStart reads the monitoring config after the gRPC server started; the
    error ends BuildAndStart, main returns, and ~Server waits on the gRPC server: gRPC serves,
    REST and metrics never open."""
    container = servers["core"]
    logs = container.logs()
    assert ("Failed to start server. Error: INVALID_ARGUMENT: Invalid protobuf file: "
            "'/conf/bad_monitoring.config'") in logs
    assert "Running gRPC ModelServer at 0.0.0.0:9744" in logs
    time.sleep(0.5)
    assert port_open(9744) and not port_open(9745)
