"""The good small models: layout, signatures, outputs per version, warmup records, TF1 format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from testbed.models import savedmodel

# The contract documented in docs/models.md, written out by hand on purpose.
HALF_PLUS_TWO_SIGNATURES = {
    "serving_default": ({"x": (tf.float32, [None, 1])}, {"y": (tf.float32, [None, 1])}),
    "times_two": ({"x": (tf.float32, [None, 1])}, {"y": (tf.float32, [None, 1])}),
}


def signature_shapes(fn: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Inputs and outputs of a loaded signature as ``{name: (dtype, shape list)}``."""
    _, kwargs = fn.structured_input_signature
    inputs = {k: (v.dtype, v.shape.as_list()) for k, v in kwargs.items()}
    outputs = {k: (v.dtype, v.shape.as_list()) for k, v in fn.structured_outputs.items()}
    return inputs, outputs


def run(path: Path, x: list[list[float]], signature: str = "serving_default") -> np.ndarray:
    """Run ``signature`` of the SavedModel at ``path`` on ``x`` and return output ``y``."""
    fn = tf.saved_model.load(str(path)).signatures[signature]
    y: np.ndarray = fn(x=tf.constant(x, tf.float32))["y"].numpy()
    return y


def test_model_base_paths_hold_only_numeric_version_dirs(models_out: Path) -> None:
    for base in (models_out / m for m in ("half_plus_two", "half_plus_two_bad")):
        dirs = [p.name for p in base.iterdir() if p.is_dir()]
        files = [p.name for p in base.iterdir() if p.is_file()]
        assert dirs and all(name.isdigit() for name in dirs), dirs
        assert files == ["catalog.json"]
    assert sorted(p.name for p in (models_out / "half_plus_two").iterdir() if p.is_dir()) == [
        "1",
        "2",
        "3",
    ]


@pytest.mark.parametrize("model", ["half_plus_two", "half_plus_two_tf1"])
def test_signatures_are_as_documented(models_out: Path, model: str) -> None:
    for version in sorted((models_out / model).glob("[0-9]*")):
        loaded = tf.saved_model.load(str(version))
        assert set(loaded.signatures) == set(HALF_PLUS_TWO_SIGNATURES)
        for name, expected in HALF_PLUS_TWO_SIGNATURES.items():
            assert signature_shapes(loaded.signatures[name]) == expected, (version, name)


def test_outputs_tell_the_versions_apart(models_out: Path) -> None:
    outputs = [run(models_out / "half_plus_two" / str(v), [[2.0], [4.0]]) for v in (1, 2, 3)]
    assert [o.ravel().tolist() for o in outputs] == [[3.0, 4.0], [4.0, 5.0], [5.0, 6.0]]


def test_times_two_signature(models_out: Path) -> None:
    got = run(models_out / "half_plus_two" / "2", [[1.5], [-3.0]], "times_two")
    assert got.ravel().tolist() == [3.0, -6.0]


@pytest.mark.parametrize("model", ["half_plus_two", "half_plus_two_tf1"])
def test_warmup_is_a_tfrecord_of_ten_predict_logs(models_out: Path, model: str) -> None:
    for version in sorted((models_out / model).glob("[0-9]*")):
        logs = savedmodel.read_warmup(version)
        assert len(logs) == 10
        for i, log in enumerate(logs):
            request = log.predict_log.request
            assert log.WhichOneof("log_type") == "predict_log"
            assert request.model_spec.name == model
            assert request.model_spec.signature_name == "serving_default"
            assert tf.make_ndarray(request.inputs["x"]).tolist() == [[float(i)]]


def test_tf1_model_is_a_legacy_builder_savedmodel(models_out: Path) -> None:
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((models_out / "half_plus_two_tf1" / "1" / "saved_model.pb").read_bytes())
    tf2 = saved_model_pb2.SavedModel()
    tf2.ParseFromString((models_out / "half_plus_two" / "1" / "saved_model.pb").read_bytes())
    # TF2 tf.saved_model.save writes an object graph; the TF1 builder does not
    assert not saved.meta_graphs[0].HasField("object_graph_def")
    assert tf2.meta_graphs[0].HasField("object_graph_def")
    assert run(models_out / "half_plus_two_tf1" / "1", [[4.0]]).tolist() == [[4.0]]
