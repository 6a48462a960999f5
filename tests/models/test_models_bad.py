"""The bad versions of half_plus_two_bad are bad in exactly the stated way."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import saved_model_pb2

from testbed.models import half_plus_two, savedmodel, serving_failures


def bad(models_out: Path, version: int) -> Path:
    """The directory of one bad version."""
    return models_out / "half_plus_two_bad" / str(version)


def test_11_corrupt_savedmodel_does_not_load(models_out: Path) -> None:
    path = bad(models_out, 11)
    assert (path / "saved_model.pb").stat().st_size > 0
    with pytest.raises(DecodeError):
        saved_model_pb2.SavedModel().ParseFromString((path / "saved_model.pb").read_bytes())
    with pytest.raises(Exception, match=r"(?i)pars|proto|saved_model"):
        tf.saved_model.load(str(path))


def test_12_wrong_signature_loads_but_takes_z_and_returns_w(models_out: Path) -> None:
    fn = tf.saved_model.load(str(bad(models_out, 12))).signatures["serving_default"]
    _, inputs = fn.structured_input_signature
    assert list(inputs) == ["z"]
    assert list(fn.structured_outputs) == ["w"]
    assert fn(z=tf.constant([[2.0]]))["w"].numpy().tolist() == [[14.0]]
    logs = savedmodel.read_warmup(bad(models_out, 12))
    assert all(list(log.predict_log.request.inputs) == ["z"] for log in logs)


def test_13_slow_warmup_has_1000_heavy_records(models_out: Path) -> None:
    path = bad(models_out, 13)
    logs = savedmodel.read_warmup(path)
    assert len(logs) == half_plus_two.SLOW_WARMUP_RECORDS == 1000
    assert {log.predict_log.request.model_spec.signature_name for log in logs} == {"heavy"}
    loaded = tf.saved_model.load(str(path))
    assert loaded.signatures["serving_default"](x=tf.constant([[2.0]]))["y"].numpy() == 15.0
    heavy = loaded.signatures["heavy"]
    x = tf.constant([[1.0]])
    heavy(x=x)
    start = time.perf_counter()
    for _ in range(10):
        heavy(x=x)
    per_record = (time.perf_counter() - start) / 10
    # the whole warmup replay must take at least ~10 s, even on a fast machine
    assert per_record * len(logs) > 10.0, per_record


def test_14_warmup_file_is_not_a_tfrecord(models_out: Path) -> None:
    path = bad(models_out, 14)
    with pytest.raises(tf.errors.DataLossError):
        savedmodel.read_warmup(path)
    # the model itself is fine: only the warmup breaks the load
    assert tf.saved_model.load(str(path)).signatures["serving_default"] is not None


def test_15_declares_more_simulated_gpu_memory_than_a_gpu_has(models_out: Path) -> None:
    path = bad(models_out, 15)
    declared = json.loads((path / "assets.extra" / "simgpu.json").read_text())
    assert declared == {"memory_mib": 20000}
    assert declared["memory_mib"] > 16384
    assert len(savedmodel.read_warmup(path)) == 10
    assert tf.saved_model.load(str(path)).signatures["times_two"] is not None


@pytest.mark.parametrize("version", [13, 14, 15])
def test_loadable_bad_versions_keep_the_intercept_rule(models_out: Path, version: int) -> None:
    fn = tf.saved_model.load(str(bad(models_out, version))).signatures["serving_default"]
    assert fn(x=tf.constant([[0.0]]))["y"].numpy().tolist() == [[float(version + 1)]]


def _graph_ops(path: Path) -> set[str]:
    """Every op type of the serve MetaGraph, its functions' bodies included."""
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    graph = saved.meta_graphs[0].graph_def
    return {n.op for n in graph.node} | {n.op for f in graph.library.function
                                         for n in f.node_def}


def test_18_keras_in_a_module_runs_in_tf2_but_not_session_style(models_out: Path) -> None:
    path = bad(models_out, 18)
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert fn(x=tf.constant([[0.0]]))["y"].numpy().tolist() == [[19.0]]
    assert len(savedmodel.read_warmup(path)) == half_plus_two.WARMUP_RECORDS
    with pytest.raises(savedmodel.NotServable, match=r"warmup record 1 \(serving_default\) "
                       r"failed") as error:
        savedmodel.check_servable(path)
    assert "Could not find variable dense/" in str(error.value.__cause__)


def test_19_computes_y_in_a_python_function(models_out: Path) -> None:
    path = bad(models_out, 19)
    assert "EagerPyFunc" in _graph_ops(path)
    assert len(savedmodel.read_warmup(path)) == half_plus_two.WARMUP_RECORDS
    assert list(savedmodel.signature_facts(path)) == ["serving_default", "times_two"]


def test_20_needs_a_newer_tensorflow_than_the_one_installed(models_out: Path) -> None:
    path = bad(models_out, 20)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    versions = saved.meta_graphs[0].graph_def.versions
    assert versions.min_consumer == tf.version.GRAPH_DEF_VERSION + serving_failures.NEWER_BY
    with pytest.raises(savedmodel.NotServable, match=r"GraphDef min consumer version \d+ above "
                       r"current version \d+ for TensorFlow"):
        savedmodel.check_servable(path)
