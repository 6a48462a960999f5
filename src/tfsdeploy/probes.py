"""gRPC probes of one TFServing slot: version status, signature, predict (effects).

The TFServing API modules import TensorFlow's protos; they are imported on first use, never on
the `fab --list` / `fab render` path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

STATE_NAMES = {0: "UNKNOWN", 10: "START", 20: "LOADING", 30: "AVAILABLE", 40: "UNLOADING",
               50: "END"}


def _apis() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    return {"status": get_model_status_pb2, "metadata": get_model_metadata_pb2,
            "predict": predict_pb2, "model_service": model_service_pb2_grpc,
            "prediction_service": prediction_service_pb2_grpc}


@dataclass(frozen=True)
class VersionStatus:
    """One version as GetModelStatus reports it."""

    version: int
    state: str
    error_code: int
    error_message: str


DTYPE_TO_NUMPY = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16,
                  6: np.int8, 9: np.int64, 10: np.bool_, 19: np.float16}
NUMPY_TO_DTYPE = {np.dtype(v): k for k, v in DTYPE_TO_NUMPY.items()}
DTYPE_NAMES = {1: "DT_FLOAT", 2: "DT_DOUBLE", 3: "DT_INT32", 4: "DT_UINT8", 5: "DT_INT16",
               6: "DT_INT8", 7: "DT_STRING", 9: "DT_INT64", 10: "DT_BOOL", 19: "DT_HALF",
               14: "DT_BFLOAT16"}


def to_tensor_proto(array: np.ndarray, proto: Any) -> None:
    """Fill a TensorProto from a numpy array (tensor_content, little-endian)."""
    array = np.ascontiguousarray(array)
    proto.dtype = NUMPY_TO_DTYPE[array.dtype]
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    proto.tensor_content = array.astype(array.dtype.newbyteorder("<")).tobytes()


def from_tensor_proto(proto: Any) -> np.ndarray:
    """A numpy array from a TensorProto (tensor_content or the typed value lists)."""
    dtype = np.dtype(DTYPE_TO_NUMPY[proto.dtype])
    shape = [d.size for d in proto.tensor_shape.dim]
    if proto.tensor_content:
        return np.frombuffer(proto.tensor_content, dtype=dtype.newbyteorder("<")).reshape(shape)
    for field in ("float_val", "double_val", "int_val", "int64_val", "bool_val", "half_val"):
        values = getattr(proto, field)
        if len(values):
            flat = np.asarray(values, dtype=dtype)
            count = int(np.prod(shape)) if shape else 1
            return (np.full(count, flat[0], dtype=dtype) if len(flat) == 1 and count > 1
                    else flat).reshape(shape)
    return np.zeros(shape, dtype=dtype)


class SlotClient:
    """One gRPC channel to one slot of one host."""

    def __init__(self, address: str, port: int, model: str) -> None:
        import grpc

        self.target = f"{address}:{port}"
        self.model = model
        self._grpc = grpc
        self._channel = grpc.insecure_channel(
            self.target, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        api = _apis()
        self._api = api
        self._models = api["model_service"].ModelServiceStub(self._channel)
        self._predict = api["prediction_service"].PredictionServiceStub(self._channel)

    def status(self, *, timeout: float = 5.0) -> list[VersionStatus]:
        """All versions the server knows for the model (NOT_FOUND -> empty list)."""
        request = self._api["status"].GetModelStatusRequest()
        request.model_spec.name = self.model
        try:
            reply = self._models.GetModelStatus(request, timeout=timeout)
        except self._grpc.RpcError as exc:
            if exc.code() == self._grpc.StatusCode.NOT_FOUND:
                return []
            raise
        return [VersionStatus(int(v.version), STATE_NAMES.get(v.state, str(v.state)),
                              int(v.status.error_code), v.status.error_message)
                for v in reply.model_version_status]

    def signature(self, version: int, name: str, *, timeout: float = 10.0
                  ) -> dict[str, dict[str, tuple[str, tuple[int, ...]]]]:
        """{"inputs"|"outputs": {tensor: (dtype name, shape)}} of one signature."""
        metadata = self._api["metadata"]
        request = metadata.GetModelMetadataRequest()
        request.model_spec.name = self.model
        request.model_spec.version.value = version
        request.metadata_field.append("signature_def")
        reply = self._predict.GetModelMetadata(request, timeout=timeout)
        from tensorflow_serving.apis import get_model_metadata_pb2

        defs = get_model_metadata_pb2.SignatureDefMap()
        reply.metadata["signature_def"].Unpack(defs)
        if name not in defs.signature_def:
            return {}
        sig = defs.signature_def[name]
        return {kind: {key: (DTYPE_NAMES.get(info.dtype, str(info.dtype)),
                             tuple(-1 if info.tensor_shape.unknown_rank else d.size
                                   for d in info.tensor_shape.dim))
                       for key, info in getattr(sig, kind).items()}
                for kind in ("inputs", "outputs")}

    def predict(self, inputs: Mapping[str, np.ndarray], *, version: int | None = None,
                signature: str = "serving_default", timeout: float = 30.0
                ) -> tuple[dict[str, np.ndarray], float]:
        """Outputs of one Predict call and its latency in seconds."""
        request = self._api["predict"].PredictRequest()
        request.model_spec.name = self.model
        request.model_spec.signature_name = signature
        if version is not None:
            request.model_spec.version.value = version
        for name, array in inputs.items():
            to_tensor_proto(array, request.inputs[name])
        start = time.perf_counter()
        reply = self._predict.Predict(request, timeout=timeout)
        elapsed = time.perf_counter() - start
        return {k: from_tensor_proto(v) for k, v in reply.outputs.items()}, elapsed

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()
