"""``half_plus_two_bad`` versions 18, 19 and 20: exports a real TFServing refuses at load.

Each is a valid SavedModel with half_plus_two's contract (``serving_default`` and
``times_two``, x -> y) and the numbering rule (y = 0.5 x + version + 1 where it runs at all),
written the way real exports go wrong:

- 18: a Keras 3 model held in a ``tf.Module`` and saved with ``tf.saved_model.save``, with 10
  warmup records. TF2's ``tf.saved_model.load`` runs it; TFServing's Session-style loader
  restores none of its variables, so the first warmup record fails with "Could not find
  variable dense/kernel" (tensorflow/tensorflow#72963);
- 19: ``serving_default`` computes y in ``tf.py_function``: the graph holds an ``EagerPyFunc``
  node, whose kernel exists only in TensorFlow's Python extension
  (tensorflow/python/lib/core/py_func.cc); the C++ server's placer finds no kernel for it at
  the first warmup record;
- 20: a good model whose GraphDef says it needs a newer TensorFlow (``versions.min_consumer``
  and ``producer`` 1000 above the writing TensorFlow's GRAPH_DEF_VERSION), as an export of a
  future TensorFlow would: the graph import refuses it (tensorflow/core/framework/versions.cc).

They are not meant to serve: their ``expect`` is END, so the build-time servability check
(``VersionSpec.must_serve``) skips them, and they have no golden requests (TFServing never
answers one). Kept apart from half_plus_two.py so that adding them remade no other version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from testbed.models import half_plus_two, savedmodel
from testbed.models.half_plus_two import BAD, WARMUP_RECORDS, intercept
from testbed.models.spec import VersionSpec

NEWER_BY = 1000  # version 20's GraphDef needs this much newer a TensorFlow than the writer's

_SOURCES = (Path(__file__), Path(half_plus_two.__file__), Path(savedmodel.__file__),
            Path(__file__).with_name("spec.py"))


def _signatures(serve: Any) -> dict[str, Any]:
    """``serving_default`` (``serve``) and ``times_two`` on x: float32 [-1, 1]."""
    import tensorflow as tf

    spec = [tf.TensorSpec([None, 1], tf.float32, name="x")]

    def times_two(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": 2.0 * x}

    return {"serving_default": tf.function(serve, input_signature=spec),
            "times_two": tf.function(times_two, input_signature=spec)}


def save_keras_in_module(path: Path, b: float) -> None:
    """A one-unit Keras 3 Dense model (y = 0.5 x + b) held in a ``tf.Module``, saved with
    ``tf.saved_model.save``."""
    import keras
    import tensorflow as tf

    inputs = keras.Input((1,), name="x")
    dense = keras.layers.Dense(1, name="dense",
                               kernel_initializer=keras.initializers.Constant(0.5),
                               bias_initializer=keras.initializers.Constant(b))
    module = tf.Module()
    module.model = keras.Model(inputs, dense(inputs))

    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": module.model(x)}

    tf.saved_model.save(module, str(path), signatures=_signatures(serve))


def save_py_function(path: Path, b: float) -> None:
    """``serving_default`` computing y = 0.5 x + b in Python, through ``tf.py_function``."""
    import tensorflow as tf

    def half_plus_b(t: tf.Tensor) -> tf.Tensor:
        return 0.5 * t + b

    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        y = tf.py_function(half_plus_b, [x], tf.float32)
        y.set_shape([None, 1])
        return {"y": y}

    tf.saved_model.save(tf.Module(), str(path), signatures=_signatures(serve))


def require_newer_tensorflow(path: Path, by: int = NEWER_BY) -> int:
    """Rewrite the SavedModel's GraphDef versions to need a TensorFlow ``by`` GraphDef
    versions newer than the installed one; return the min_consumer written."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    pb = path / "saved_model.pb"
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString(pb.read_bytes())
    needed = int(tf.version.GRAPH_DEF_VERSION) + by
    for meta_graph in saved.meta_graphs:
        meta_graph.graph_def.versions.producer = needed
        meta_graph.graph_def.versions.min_consumer = needed
    pb.write_bytes(saved.SerializeToString())
    return needed


def _warmup(path: Path) -> None:
    savedmodel.write_warmup(path, [
        savedmodel.predict_log(BAD, "serving_default", {"x": np.array([[float(i)]], np.float32)})
        for i in range(WARMUP_RECORDS)])


def _keras_in_module(version: int) -> VersionSpec:
    def build(path: Path) -> dict[str, Any]:
        save_keras_in_module(path, intercept(version))
        _warmup(path)
        return {"warmup_records": WARMUP_RECORDS}

    return VersionSpec(
        model=BAD, version=version,
        summary="Keras 3 model inside a tf.Module, saved with tf.saved_model.save (+ warmup)",
        recipe={"kind": "keras_in_module", "b": intercept(version), "warmup": WARMUP_RECORDS},
        build=build, source_files=_SOURCES,
        expect={"state": "END", "error_code": "FAILED_PRECONDITION",
                "why": "warmup: Could not find variable dense/... (the Session-style load "
                       "restores no variable of a Keras 3 model saved inside a tf.Module)"})


def _py_function(version: int) -> VersionSpec:
    def build(path: Path) -> dict[str, Any]:
        save_py_function(path, intercept(version))
        _warmup(path)
        return {"warmup_records": WARMUP_RECORDS, "python_ops": ["EagerPyFunc"]}

    return VersionSpec(
        model=BAD, version=version,
        summary="serving_default computes y in tf.py_function (an EagerPyFunc op) (+ warmup)",
        recipe={"kind": "py_function", "b": intercept(version), "warmup": WARMUP_RECORDS},
        build=build, source_files=_SOURCES,
        expect={"state": "END", "error_code": "INVALID_ARGUMENT",
                "why": "warmup: No OpKernel was registered to support Op 'EagerPyFunc' (the "
                       "C++ server has no kernel for Python functions)"})


def _newer_tensorflow(version: int) -> VersionSpec:
    def build(path: Path) -> dict[str, Any]:
        half_plus_two.save_tf2(path, intercept(version))
        _warmup(path)
        return {"warmup_records": WARMUP_RECORDS, "min_consumer": require_newer_tensorflow(path)}

    return VersionSpec(
        model=BAD, version=version,
        summary=f"GraphDef needs a TensorFlow {NEWER_BY} GraphDef versions newer than the writer",
        recipe={"kind": "newer_tensorflow", "b": intercept(version), "newer_by": NEWER_BY,
                "warmup": WARMUP_RECORDS},
        build=build, source_files=_SOURCES,
        expect={"state": "END", "error_code": "INVALID_ARGUMENT",
                "why": "GraphDef min consumer version above the server's TensorFlow"})


def specs() -> list[VersionSpec]:
    """Versions 18, 19 and 20 of half_plus_two_bad."""
    return [_keras_in_module(18), _py_function(19), _newer_tensorflow(20)]
