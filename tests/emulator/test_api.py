"""gRPC and REST APIs, labels, reload, batching limits and metrics on one shared server."""

from __future__ import annotations

import json
import pathlib
import re
import socket
import time
from typing import Any

import grpc
import modelgen
import numpy as np
import pytest
from emulator_support import Emulator, free_port, http, predict_request, status_of, stubs, write
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import get_model_metadata_pb2, model_management_pb2

from tests.bounds import within

CONFIG = """model_config_list {{
  config {{ name: "hpt" base_path: "{hpt}" model_platform: "tensorflow"
           model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}
           version_labels {{ key: "stable" value: 1 }}
           version_labels {{ key: "canary" value: 2 }} }}
  config {{ name: "tf1" base_path: "{tf1}" model_platform: "tensorflow" }}
}}
"""
BATCHING = """max_batch_size { value: 4 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 1 }
num_batch_threads { value: 1 }
allowed_batch_sizes: 2
allowed_batch_sizes: 4
"""


class Api:
    """Handles to the shared server."""

    def __init__(self, server: Emulator, grpc_port: int, rest_port: int,
                 root: pathlib.Path) -> None:
        self.server = server
        self.grpc_port = grpc_port
        self.rest = f"http://127.0.0.1:{rest_port}"
        self.predict, self.models, self.channel = stubs(grpc_port)
        self.root = root

    def config(self, extra: str = "", hpt_labels: str = "") -> Any:
        """A ModelServerConfig for reload requests."""
        from google.protobuf import text_format
        from tensorflow_serving.config import model_server_config_pb2

        text = CONFIG.format(hpt=self.root / "hpt", tf1=self.root / "tf1")
        if hpt_labels:
            text = re.sub(r"version_labels \{ key: \"canary\" value: 2 \}", hpt_labels, text)
        text = text.rstrip().rstrip("}") + extra + "}\n"
        return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())

    def metrics(self) -> str:
        status, body = http("GET", self.rest + "/monitoring/prometheus/metrics")
        assert status == 200
        return body


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, pathlib.Path]) -> Any:
    root = tmp_path_factory.mktemp("api")
    for version in (1, 2, 3):
        modelgen.copy_version(sources[f"hpt{version}"], root / "hpt", version)
    modelgen.copy_version(sources["tf1"], root / "tf1", 1)
    config = write(root / "models.config", CONFIG.format(hpt=root / "hpt", tf1=root / "tf1"))
    batching = write(root / "batching.config", BATCHING)
    monitoring = write(root / "monitoring.config", "prometheus_config { enable: true }\n")
    grpc_port, rest_port = free_port(), free_port()
    server = Emulator([
        f"--port={grpc_port}", "--port", "9000", "--rest_api_port=1",
        f"--rest_api_port={rest_port}", f"--model_config_file={config}",
        "--allow_version_labels_for_unavailable_models", "--enable_batching",
        f"--batching_parameters_file={batching}", f"--monitoring_config_file={monitoring}",
        "--file_system_poll_wait_seconds=1", "--bogus_flag=1",
        "--enable_grpc_healthcheck_service",
        # the toolkit's rendered value: the default (4 x the CPUs: 7 RPCs at once on 2 cores)
        # is a second limit that 32 callers reach on a busy machine, answered RESOURCE_EXHAUSTED
        # "Server Threadpool Exhausted" (grpc_service.ThreadQuota), which is not what
        # test_full_batch_queue_is_unavailable is about
        "--grpc_max_threads=256"], root / "server.log")
    try:
        server.wait_port(rest_port)
        yield Api(server, grpc_port, rest_port, root)
    finally:
        server.stop()


def outputs(response: Any, name: str) -> np.ndarray:
    import tensorflow as tf

    return tf.make_ndarray(response.outputs[name])


# ------------------------------------------------------------------ flags seen by the server

def test_unknown_flags_are_printed_and_ignored(api: Api) -> None:
    # server.cc starts the HTTP server, then logs this line (the real server's log shows
    # evhttp's "Entering the event loop" before it): the REST port the fixture waited for can
    # answer before the line is written
    out = api.server.wait_output("Exporting HTTP/REST API at:localhost:")
    assert "unknown argument: --port\n" in out  # `--port 9000` is not `--port=9000`
    assert f"Running gRPC ModelServer at 0.0.0.0:{api.grpc_port} ..." in out
    assert "Exporting HTTP/REST API at:localhost:" in out


# ------------------------------------------------------------------ gRPC Predict

def test_grpc_predict_latest_specific_and_label(api: Api) -> None:
    response = api.predict.Predict(predict_request("hpt", [[1.0], [2.0]]), timeout=10)
    assert outputs(response, "y").tolist() == [[2.5], [3.0]]
    assert response.model_spec.version.value == 2
    assert response.model_spec.signature_name == "serving_default"
    for kwargs, version in (({"version": 1}, 1), ({"label": "stable"}, 1),
                            ({"label": "canary"}, 2), ({}, 2)):
        request = predict_request("hpt", [[0.0]], signature="version_of", **kwargs)
        assert outputs(api.predict.Predict(request, timeout=10), "version").tolist() == [version]


def test_grpc_predict_errors(api: Api) -> None:
    cases = [
        (predict_request("hpt", [[1.0]], label="nope"), grpc.StatusCode.INVALID_ARGUMENT,
         "Unrecognized servable version label: nope"),
        (predict_request("nope", [[1.0]]), grpc.StatusCode.NOT_FOUND,
         "Servable not found for request: Latest(nope)"),
        (predict_request("hpt", [[1.0]], version=3), grpc.StatusCode.NOT_FOUND,
         "Servable not found for request: Specific(hpt, 3)"),
        (predict_request("hpt", [[1.0]], signature="zzz"), grpc.StatusCode.FAILED_PRECONDITION,
         'Serving signature key "zzz" not found.'),
        (predict_request("hpt", [[1.0]] * 5), grpc.StatusCode.INVALID_ARGUMENT,
         "Task size 5 is larger than maximum input batch size 4"),
        (predict_request("hpt", [[1.0]], input_name="q"), grpc.StatusCode.INVALID_ARGUMENT,
         "Signature input alias: x(feed name: serving_default_x:0) not found in request and no "
         "default value provided. Inputs expected to be in the request {q}, or default input "
         "alias set: "),
    ]
    for request, code, message in cases:
        with pytest.raises(grpc.RpcError) as info:
            api.predict.Predict(request, timeout=10)
        assert info.value.code() == code
        assert message in info.value.details()


def test_grpc_predict_two_inputs_and_output_filter(api: Api) -> None:
    request = predict_request("hpt", [[1.0]], signature="two_inputs")
    request.inputs["z"].CopyFrom(predict_request("hpt", [[2.0]]).inputs["x"])
    response = api.predict.Predict(request, timeout=10)
    assert set(response.outputs) == {"y", "w"}
    assert outputs(response, "w").tolist() == [[6.0]]
    request.output_filter.append("w")
    assert set(api.predict.Predict(request, timeout=10).outputs) == {"w"}


def test_grpc_predict_tf1_builder_model(api: Api) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tf1"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 3.0], np.float32)))
    assert outputs(api.predict.Predict(request, timeout=10), "y").tolist() == [3.5, 4.5]
    request.model_spec.signature_name = "double"
    assert outputs(api.predict.Predict(request, timeout=10), "doubled").tolist() == [2.0, 6.0]


# ------------------------------------------------------------------ metadata and status

def test_grpc_metadata_lists_every_signature(api: Api) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "hpt"
    response = api.predict.GetModelMetadata(request, timeout=10)
    assert response.model_spec.version.value == 2
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    assert {"serving_default", "two_inputs", "version_of"} <= set(signatures.signature_def)
    x = signatures.signature_def["serving_default"].inputs["x"]
    assert x.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in x.tensor_shape.dim] == [-1, 1]
    assert signatures.signature_def["serving_default"].method_name == \
        "tensorflow/serving/predict"


def test_rest_metadata(api: Api) -> None:
    status, body = http("GET", api.rest + "/v1/models/tf1/versions/1/metadata")
    assert status == 200, body
    document = json.loads(body)
    assert document["model_spec"] == {"name": "tf1", "signature_name": "", "version": "1"}
    signature = document["metadata"]["signature_def"]["signature_def"]["double"]
    assert signature["inputs"]["x"]["dtype"] == "DT_FLOAT"
    assert signature["outputs"]["doubled"]["name"] == "doubled:0"


def test_status_grpc_and_rest(api: Api) -> None:
    assert status_of(api.models, "hpt") == {2: (30, 0), 1: (30, 0)}
    assert status_of(api.models, "hpt", 1) == {1: (30, 0)}
    with pytest.raises(grpc.RpcError) as info:
        status_of(api.models, "hpt", 3)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Could not find version 3 of model hpt"
    status, body = http("GET", api.rest + "/v1/models/hpt")
    assert status == 200
    assert json.loads(body) == {"model_version_status": [
        {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK",
                                                          "error_message": ""}},
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK",
                                                          "error_message": ""}}]}
    status, body = http("GET", api.rest + "/v1/models/hpt/versions/1")
    assert [v["version"] for v in json.loads(body)["model_version_status"]] == ["1"]
    status, body = http("GET", api.rest + "/v1/models/hpt/labels/stable")
    assert len(json.loads(body)["model_version_status"]) == 2  # label ignored, as in TFServing
    assert http("GET", api.rest + "/v1/models") == (
        400, json.dumps({"error": "Missing model name in request."}, indent=4))
    status, body = http("GET", api.rest + "/v1/models/nope")
    assert status == 404
    assert json.loads(body) == {"error": "Could not find any versions of model nope"}


def test_rest_reply_leaves_in_one_write_on_a_kept_alive_connection(api: Api) -> None:
    """Status line, headers and body in one write, as TFServing's libevent server sends them
    (rest.py _Handler): each reply on a kept-alive connection arrives whole in one read. Sent
    as two writes, the body of every reply after the first waited 40 ms for the client's
    delayed ACK."""
    port = int(api.rest.rsplit(":", 1)[1])
    request = b"GET /v1/models/hpt HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        for _ in range(5):
            conn.sendall(request)
            first = conn.recv(1 << 16)
            head, _, body = first.partition(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
            assert head.startswith(b"HTTP/1.1 200"), first
            assert len(body) == length, f"the first read held {len(body)} of {length} bytes"
            assert json.loads(body)["model_version_status"][0]["state"] == "AVAILABLE"


# ------------------------------------------------------------------ REST predict

def post(api: Api, path: str, document: Any) -> tuple[int, Any]:
    status, body = http("POST", api.rest + path, json.dumps(document).encode())
    return status, json.loads(body) if body else None


def test_rest_predict_row_and_columnar(api: Api) -> None:
    assert post(api, "/v1/models/hpt:predict", {"instances": [[1.0], [2.0]]}) == \
        (200, {"predictions": [[2.5], [3.0]]})
    assert post(api, "/v1/models/hpt:predict", {"inputs": [[1.0], [2.0]]}) == \
        (200, {"outputs": [[2.5], [3.0]]})
    assert post(api, "/v1/models/hpt:predict", {
        "signature_name": "two_inputs", "instances": [{"x": [1.0], "z": [1.0]}]}) == \
        (200, {"predictions": [{"y": [2.5], "w": [3.0]}]})
    assert post(api, "/v1/models/hpt:predict", {
        "signature_name": "two_inputs", "inputs": {"x": [[1.0]], "z": [[2.0]]}}) == \
        (200, {"outputs": {"y": [[2.5]], "w": [[6.0]]}})
    assert post(api, "/v1/models/tf1:predict", {"instances": [1.0, 3.0]}) == \
        (200, {"predictions": [3.5, 4.5]})


def test_rest_predict_versions_labels_and_case(api: Api) -> None:
    body = {"signature_name": "version_of", "instances": [[0.0]]}
    assert post(api, "/v1/models/hpt/versions/1:predict", body) == (200, {"predictions": [1]})
    assert post(api, "/v1/models/hpt/labels/canary:predict", body) == \
        (200, {"predictions": [2]})
    assert post(api, "/V1/MODELS/hpt/LABELS/stable:predict", body) == \
        (200, {"predictions": [1]})
    # the path's regular expression ignores case, the verb comparison after it does not
    assert post(api, "/v1/models/hpt:PREDICT", body) == \
        (400, {"error": "Malformed request: POST /v1/models/hpt:PREDICT"})


def test_rest_errors_and_http_status(api: Api) -> None:
    assert post(api, "/v1/models/nope:predict", {"instances": [[1.0]]}) == \
        (404, {"error": "Servable not found for request: Latest(nope)"})
    assert post(api, "/v1/models/hpt/labels/nope:predict", {"instances": [[1.0]]}) == \
        (400, {"error": "Unrecognized servable version label: nope"})
    status, document = post(api, "/v1/models/hpt:predict", {"instancez": [[1.0]]})
    assert (status, document) == (400, {"error": "Missing 'inputs' or 'instances' key"})
    status, body = http("POST", api.rest + "/v1/models/hpt:predict", b"{not json")
    assert status == 400 and json.loads(body)["error"].startswith("JSON Parse error:")
    status, document = post(api, "/v1/models/hpt:predict",
                            {"signature_name": "zzz", "instances": [[1.0]]})
    assert status == 400
    assert document == {"error": 'Serving signature name: "zzz" not found in signature def'}
    assert http("GET", api.rest + "/v2/nothing")[0] == 404


# ------------------------------------------------------------------ batching

def test_batching_pads_to_allowed_sizes(api: Api) -> None:
    def sums() -> tuple[float, float]:
        page = api.metrics()
        def value(name: str) -> float:
            match = re.search(rf"^:tensorflow:serving:batching_session:{name}_sum\{{\}} (\S+)$",
                              page, re.M)
            return float(match.group(1)) if match else 0.0
        return value("input_batch_size"), value("processed_batch_size")

    before = sums()
    api.predict.Predict(predict_request("hpt", [[1.0]] * 3), timeout=10)
    after = sums()
    assert after[0] - before[0] == 3  # input batch of 3 ...
    assert after[1] - before[1] == 4  # ... padded to the allowed size 4


def test_full_batch_queue_is_unavailable(api: Api) -> None:
    # one batch thread, one enqueued batch, tasks of 3 that never share a batch of 4; all
    # 200 calls started at once from this thread (gRPC futures), not one per client thread:
    # on a starved machine, 32 client threads each waiting for its answer sent them one at
    # a time, and the queue never filled
    request = predict_request("hpt", [[1.0]] * 3)
    calls = [api.predict.Predict.future(request, timeout=30) for _ in range(200)]

    def outcome(call: Any) -> Any:
        try:
            call.result()
            return "OK"
        except grpc.RpcError as exc:
            return exc.code(), exc.details()

    results = [outcome(call) for call in calls]
    rejected = [r for r in results if r != "OK"]
    assert "OK" in results
    assert rejected, "expected some requests to find the queue full"
    assert set(rejected) == {(grpc.StatusCode.UNAVAILABLE,
                              "The batch scheduling queue to which this task was submitted "
                              "is full; currently 1 batches enqueued and max_enqueued_batches "
                              "is 1")}
    assert 'status="UNAVAILABLE"' in api.metrics()


# ------------------------------------------------------------------ labels and reload

def reload(api: Api, config: Any) -> Any:
    request = model_management_pb2.ReloadConfigRequest(config=config)
    return api.models.HandleReloadConfigRequest(request, timeout=60)


def test_reload_rejects_invalid_lists_without_changes(api: Api) -> None:
    duplicate = api.config(extra=f'config {{ name: "tf1" base_path: "{api.root}/tf1" '
                                  'model_platform: "tensorflow" }')
    relative = api.config(extra='config { name: "rel" base_path: "rel/path" '
                                'model_platform: "tensorflow" }')
    for config, message in ((duplicate, "Illegal to list model tf1 multiple times in config "
                                        "list"),
                            (relative, "Expected model rel to have an absolute path or URI; "
                                       "got base_path()=rel/path")):
        with pytest.raises(grpc.RpcError) as info:
            reload(api, config)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == message
    assert status_of(api.models, "tf1") == {1: (30, 0)}


def test_labels_allow_flag_covers_new_labels_only(api: Api) -> None:
    # moving the existing label "canary" to unavailable version 3 fails even with the flag
    moved = api.config(hpt_labels='version_labels { key: "canary" value: 3 }')
    with pytest.raises(grpc.RpcError) as info:
        reload(api, moved)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == ("Request to assign label to version 3 of model hpt, which "
                                    "is not currently available for inference")
    # a new label may point at an unavailable version
    fresh = api.config(hpt_labels='version_labels { key: "canary" value: 2 } '
                                  'version_labels { key: "beta" value: 3 }')
    assert reload(api, fresh).status.error_code == 0
    request = predict_request("hpt", [[0.0]], signature="version_of", label="canary")
    assert outputs(api.predict.Predict(request, timeout=10), "version").tolist() == [2]
    # moving a label to another AVAILABLE version is fine (the label-flip rollout)
    flipped = api.config(hpt_labels='version_labels { key: "canary" value: 2 }')
    flipped.model_config_list.config[0].version_labels["stable"] = 2
    assert reload(api, flipped).status.error_code == 0
    request = predict_request("hpt", [[0.0]], signature="version_of", label="stable")
    assert outputs(api.predict.Predict(request, timeout=10), "version").tolist() == [2]
    assert reload(api, api.config()).status.error_code == 0  # back to stable=1, canary=2


def test_reload_adds_and_removes_models(api: Api) -> None:
    added = api.config(extra=f'config {{ name: "extra" base_path: "{api.root}/tf1" '
                             'model_platform: "tensorflow" }')
    started = time.monotonic()
    response = reload(api, added)
    assert response.status.error_code == 0
    assert status_of(api.models, "extra") == {1: (30, 0)}  # the RPC waited for it
    # one small model's load; 30 s: the reload did not hang on it
    # measured: see the timing-bounds table of scripts/test
    within("reload adding a model, s", time.monotonic() - started, below=30)
    assert post(api, "/v1/models/extra:predict", {"instances": [1.0]}) == \
        (200, {"predictions": [3.5]})
    assert reload(api, api.config()).status.error_code == 0
    deadline = time.monotonic() + 30
    while status_of(api.models, "extra") != {1: (50, 0)}:
        assert time.monotonic() < deadline, status_of(api.models, "extra")
        time.sleep(0.2)
    assert post(api, "/v1/models/extra:predict", {"instances": [1.0]})[0] == 404


# ------------------------------------------------------------------ metrics and health

def test_metrics_use_tfserving_names(api: Api) -> None:
    page = api.metrics()
    assert "# HELP" not in page
    for line in (
            "# TYPE :tensorflow:serving:request_count counter",
            ':tensorflow:serving:request_count{model_name="hpt",status="OK"}',
            ':tensorflow:serving:request_count{model_name="nope",status="NOT_FOUND"}',
            "# TYPE :tensorflow:serving:request_latency histogram",
            ':tensorflow:serving:request_latency_bucket{model_name="hpt",API="Predict",'
            'entrypoint="GRPC",le="10"}',
            ':tensorflow:serving:request_latency_count{model_name="hpt",API="predict",'
            'entrypoint="REST"}',
            "# TYPE :tensorflow:cc:saved_model:load_latency counter",
            f':tensorflow:cc:saved_model:load_attempt_count{{model_path="{api.root}/hpt/1",'
            'status="success"}',
            "# TYPE :tensorflow:serving:batching_session:queuing_latency histogram",
            # the model server wraps sessions for batching with an empty thread pool name
            ':tensorflow:serving:batching_session:queuing_latency_count{thread_pool_name=""}',
            "# TYPE :tensorflow:serving:batching_session:input_batch_size histogram",
            "# TYPE :tensorflow:serving:batching_session:processed_batch_size histogram"):
        assert line in page, line
    assert re.search(r'le="\+Inf"\} \d+$', page, re.M)


def test_grpc_health_service(api: Api) -> None:
    check = api.channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
    # HealthCheckRequest{service: "ModelService"} -> HealthCheckResponse{status: SERVING}
    assert check(b"\n\x0cModelService", timeout=10) == b"\x08\x01"
    assert check(b"", timeout=10) == b"\x08\x01"
    with pytest.raises(grpc.RpcError) as info:
        check(b"\n\x04nope", timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
