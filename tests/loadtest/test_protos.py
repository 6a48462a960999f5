"""Request messages built without the tensorflow package, wire-identical to the official ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.loadtest import payloads


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_cli_start_does_not_import_tensorflow() -> None:
    line = _python("""
        import sys, time
        t = time.perf_counter()
        from tfsdeploy.loadtest import cli, payloads
        r = payloads.request_from_json({"inputs": {"x": [[1.0]]}}, {})
        payloads.build_payloads([r], payloads.RequestSpec(model="m"), rest=True)
        cli.build_parser()
        print("x", "tensorflow" in sys.modules,
              any(m.startswith("tensorflow.") for m in sys.modules), time.perf_counter() - t)
    """)
    _, loaded, loaded_sub, seconds = line.split()
    assert (loaded, loaded_sub) == ("False", "False")
    assert float(seconds) < 1.0


def test_bytes_identical_to_official_predict_request() -> None:
    request: Any = payloads.request_from_json(
        {"signature_name": "serving_default", "inputs": {"x": [[1.0], [2.5]]}}, {})
    payloads.apply_spec(request, payloads.RequestSpec(model="half_plus_two", version=3))
    ours = request.SerializeToString()
    official = _python("""
        import json
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
    assert ours  # non-empty


def test_dtype_names_round_trip() -> None:
    assert tfsapi.dtype_value("DT_FLOAT") == 1
    assert tfsapi.dtype_name(tfsapi.dtype_value("DT_STRING")) == "DT_STRING"


def test_lite_prediction_log_reads_official_predict_logs() -> None:
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
