"""Helpers around SavedModels: warmup records, signature facts and golden outputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

WARMUP_RELPATH = Path("assets.extra") / "tf_serving_warmup_requests"
SIMGPU_RELPATH = Path("assets.extra") / "simgpu.json"
PREDICT_METHOD = "tensorflow/serving/predict"

# numpy dtype name <-> TensorFlow DataType enum name (what TFServing metadata reports)
_TF_DTYPE = {
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
}
_NP_DTYPE = {v: k for k, v in _TF_DTYPE.items()}


def tf_dtype_name(np_dtype: Any) -> str:
    """Return the TensorFlow enum name (``DT_FLOAT``) of a numpy dtype."""
    return _TF_DTYPE[np.dtype(np_dtype).name]


def np_dtype(tf_name: str) -> np.dtype[Any]:
    """Return the numpy dtype of a TensorFlow enum name (``DT_FLOAT`` -> float32)."""
    return np.dtype(_NP_DTYPE[tf_name])


def predict_log(model: str, signature: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """Serialize one ``PredictionLog`` whose ``predict_log.request`` asks ``signature``."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    log = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)
    )
    data: bytes = log.SerializeToString()
    return data


def write_warmup(version_dir: Path, records: Sequence[bytes]) -> None:
    """Write ``assets.extra/tf_serving_warmup_requests`` as a TFRecord file of ``records``."""
    import tensorflow as tf

    path = version_dir / WARMUP_RELPATH
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def read_warmup(version_dir: Path) -> list[Any]:
    """Parse the warmup file of ``version_dir`` into ``PredictionLog`` messages (raises if bad)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    logs = []
    for raw in tf.data.TFRecordDataset(str(version_dir / WARMUP_RELPATH)):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(raw.numpy())
        logs.append(log)
    return logs


def _tensor_info_facts(info: Any) -> dict[str, Any]:
    """Describe one ``TensorInfo``: dtype enum name and shape (-1 for unknown dims)."""
    from tensorflow.core.framework import types_pb2

    shape = None if info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim]
    return {"dtype": types_pb2.DataType.Name(info.dtype), "shape": shape}


def signature_facts(version_dir: Path) -> dict[str, Any]:
    """Read the ``serve`` MetaGraph's SignatureDefs from ``saved_model.pb``.

    Returns ``{name: {"method_name", "inputs": {key: {dtype, shape}}, "outputs": {...}}}``,
    the same facts TFServing's GetModelMetadata reports (internal signatures such as
    ``__saved_model_init_op`` are left out).
    """
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((version_dir / "saved_model.pb").read_bytes())
    meta = next(m for m in saved.meta_graphs if "serve" in m.meta_info_def.tags)
    facts: dict[str, Any] = {}
    for name in sorted(meta.signature_def):
        if name.startswith("__"):
            continue
        sig = meta.signature_def[name]
        facts[name] = {
            "method_name": sig.method_name,
            "inputs": {k: _tensor_info_facts(v) for k, v in sorted(sig.inputs.items())},
            "outputs": {k: _tensor_info_facts(v) for k, v in sorted(sig.outputs.items())},
        }
    return facts


def encode_array(value: np.ndarray) -> dict[str, Any]:
    """Encode an array for catalog.json: dtype enum name, shape and nested values."""
    return {
        "dtype": tf_dtype_name(value.dtype),
        "shape": list(value.shape),
        "values": value.tolist(),
    }


def decode_array(spec: Mapping[str, Any]) -> np.ndarray:
    """Build the array a catalog tensor entry describes (inline ``values`` or a ``ramp`` fill).

    A ramp is ``(arange(prod(shape)) % modulus) * scale`` reshaped: easy to rebuild anywhere.
    """
    dtype = np_dtype(spec["dtype"])
    shape = tuple(spec["shape"])
    if "values" in spec:
        return np.asarray(spec["values"], dtype=dtype).reshape(shape)
    fill = spec["fill"]
    if fill.get("kind") != "ramp":
        raise ValueError(f"unknown fill kind: {fill!r}")
    flat = (np.arange(int(np.prod(shape))) % int(fill["modulus"])) * float(fill["scale"])
    return flat.astype(dtype).reshape(shape)


def ramp_spec(shape: Sequence[int], modulus: int = 251, scale: float = 1.0 / 250) -> dict[str, Any]:
    """Describe a deterministic ramp-filled float32 input (see ``decode_array``)."""
    return {
        "dtype": "DT_FLOAT",
        "shape": list(shape),
        "fill": {"kind": "ramp", "modulus": modulus, "scale": scale},
    }


class SessionBundle:
    """A SavedModel loaded the way TensorFlow Serving loads it, not through TF2's object API.

    TFServing's SavedModelBundle path (tensorflow/cc/saved_model/loader.cc LoadSavedModel)
    imports the ``serve`` MetaGraphDef into a fresh Session, runs the saver's restore op and
    the init op, then answers every request with ``Session::Run`` on the signature's tensor
    names. ``tf.compat.v1.saved_model.loader.load`` is that path in Python. A SavedModel can
    load under TF2's ``tf.saved_model.load`` and still fail here: a Keras 3 model held inside
    a ``tf.Module`` and saved with ``tf.saved_model.save`` restores no variables this way
    ("Could not find variable ...": tensorflow/tensorflow#72963, kserve/kserve#3801 against
    the real server), so the generator checks every version with this class.
    """

    def __init__(self, version_dir: Path) -> None:
        import tensorflow as tf

        self._graph = tf.Graph()
        self._session = tf.compat.v1.Session(graph=self._graph)
        with self._graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(
                self._session, ["serve"], str(version_dir)
            )
        self.signatures = dict(meta.signature_def)

    def run(self, signature: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``Session::Run`` of one signature: feed its inputs, fetch all of its outputs."""
        sig = self.signatures[signature]
        feeds = {sig.inputs[name].name: value for name, value in inputs.items()}
        names = sorted(sig.outputs)
        fetched = self._session.run([sig.outputs[n].name for n in names], feed_dict=feeds)
        return {name: np.asarray(value) for name, value in zip(names, fetched, strict=True)}

    def close(self) -> None:
        """Release the session."""
        self._session.close()


class NotServable(Exception):
    """A built version that TensorFlow Serving's loader could not restore or run."""


def check_servable(version_dir: Path, max_records: int | None = None) -> int:
    """Load ``version_dir`` as TFServing does and run its warmup records; return how many ran.

    Raises ``NotServable`` naming the failing step and TensorFlow's message. ``max_records``
    bounds a deliberately slow warmup (every record then runs the same graph).
    """
    import tensorflow as tf

    try:
        bundle = SessionBundle(version_dir)
    except Exception as exc:
        raise NotServable(f"Session-style load failed: {_first_line(exc)}") from exc
    try:
        logs = read_warmup(version_dir) if (version_dir / WARMUP_RELPATH).is_file() else []
        for count, log in enumerate(logs[:max_records], start=1):
            request = log.predict_log.request
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            signature = request.model_spec.signature_name or "serving_default"
            try:
                bundle.run(signature, inputs)
            except Exception as exc:
                raise NotServable(
                    f"warmup record {count} ({signature}) failed: {_first_line(exc)}"
                ) from exc
        return min(len(logs), max_records if max_records is not None else len(logs))
    finally:
        bundle.close()


def _first_line(exc: BaseException) -> str:
    """The line of an exception's message that says what failed: TensorFlow's run errors
    open with "Graph execution error:" and node traces before the status message."""
    noise = ("Graph execution error", "Detected at node", "[[", "File ", "0 successful",
             "0 derived errors")
    lines = [line.strip() for line in (str(exc).strip() or type(exc).__name__).splitlines()]
    telling = [line for line in lines if line and not line.startswith(noise)]
    return f"{type(exc).__name__}: {(telling or lines)[0]}"
