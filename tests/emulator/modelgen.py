"""Small SavedModels for the emulator tests, written with TensorFlow into a tmp dir."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any


def half_plus_two(path: pathlib.Path, version: int = 1) -> pathlib.Path:
    """TF2 model: serving_default y = 0.5x + 2; two_inputs (y, w); version_of (version)."""
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = tf.Variable(0.5)
            self.b = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": self.a * x + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x"),
                                      tf.TensorSpec([None, 1], tf.float32, name="z")])
        def two_inputs(self, x: tf.Tensor, z: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": self.a * x + self.b, "w": z * 3.0}

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def version_of(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"version": tf.zeros_like(x[:, 0], dtype=tf.int64) + version}

    module = HalfPlusTwo()
    tf.saved_model.save(module, str(path), signatures={
        "serving_default": module.serve, "two_inputs": module.two_inputs,
        "version_of": module.version_of})
    return path


def tf1_builder(path: pathlib.Path) -> pathlib.Path:
    """TF1 SavedModelBuilder model: serving_default y = 0.5x + 3 over a [None] input."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None], name="x")
        a = v1.Variable(0.5, name="a")
        y = tf.add(a * x, 3.0, name="y")
        doubled = tf.multiply(x, 2.0, name="doubled")
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(path))
            predict = v1.saved_model.signature_def_utils.predict_signature_def(
                inputs={"x": x}, outputs={"y": y})
            double = v1.saved_model.signature_def_utils.predict_signature_def(
                inputs={"x": x}, outputs={"doubled": doubled})
            builder.add_meta_graph_and_variables(
                session, ["serve"],
                signature_def_map={"serving_default": predict, "double": double})
            builder.save()
    return path


def tf1_examples(path: pathlib.Path) -> pathlib.Path:
    """TF1 model over serialized tf.Examples (feature x): classify (scores) and regress
    (outputs) signatures, y = 0.5x + 2, plus serving_default over x itself."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        serialized = v1.placeholder(tf.string, [None], name="tf_example")
        features = v1.io.parse_example(serialized, {"x": v1.io.FixedLenFeature([1], tf.float32)})
        y = tf.add(0.5 * features["x"], 2.0, name="y")
        x = v1.placeholder(tf.float32, [None, 1], name="x")
        direct = tf.add(0.5 * x, 2.0, name="direct")
        with v1.Session(graph=graph) as session:
            utils = v1.saved_model.signature_def_utils
            builder = v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "classify_x_to_y": utils.classification_signature_def(serialized, None, y),
                "regress_x_to_y": utils.regression_signature_def(serialized, y),
                "serving_default": utils.predict_signature_def({"x": x}, {"y": direct})})
            builder.save()
    return path


def blocking(path: pathlib.Path) -> pathlib.Path:
    """TF1 model whose output waits on a queue nothing ever fills: every run times out."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None], name="x")
        queue = tf.queue.FIFOQueue(1, tf.float32, shapes=[[]], name="never_filled")
        y = tf.add(x, queue.dequeue(), name="y")
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": v1.saved_model.signature_def_utils.predict_signature_def(
                    {"x": x}, {"y": y})})
            builder.save()
    return path


def example_warmup(path: pathlib.Path, model: str) -> None:
    """One classify, one regress and one multi_inference warmup record (x = 2)."""
    import tensorflow as tf
    from tensorflow_serving.apis import (
        classification_pb2,
        inference_pb2,
        prediction_log_pb2,
        regression_pb2,
    )

    def example_input(target: Any) -> None:
        target.example_list.examples.add().features.feature["x"].float_list.value.append(2.0)

    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name, classify.model_spec.signature_name = model, "classify_x_to_y"
    example_input(classify.input)
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = model, "regress_x_to_y"
    example_input(regress.input)
    multi = inference_pb2.MultiInferenceRequest()
    task = multi.tasks.add(method_name="tensorflow/serving/regress")
    task.model_spec.name, task.model_spec.signature_name = model, "regress_x_to_y"
    example_input(multi.input)
    records = [
        prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog(request=classify)),
        prediction_log_pb2.PredictionLog(
            regress_log=prediction_log_pb2.RegressLog(request=regress)),
        prediction_log_pb2.PredictionLog(
            multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=multi))]
    extra = path / "assets.extra"
    extra.mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(extra / "tf_serving_warmup_requests")) as writer:
        for record in records:
            writer.write(record.SerializeToString())


def corrupt(path: pathlib.Path) -> pathlib.Path:
    """A version dir whose saved_model.pb is garbage."""
    path.mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(b"\x08\x01this is not a SavedModel\xff\xff")
    return path


def warmup_records(path: pathlib.Path, count: int, values: float = 1.0) -> None:
    """Write ``count`` PredictionLog records for serving_default into assets.extra."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    extra = path / "assets.extra"
    extra.mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(extra / "tf_serving_warmup_requests")) as writer:
        for _ in range(count):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "warm"
            request.inputs["x"].CopyFrom(tf.make_tensor_proto([[values]], tf.float32))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def bad_warmup(path: pathlib.Path) -> None:
    """A warmup file that is not TFRecord."""
    extra = path / "assets.extra"
    extra.mkdir(exist_ok=True)
    (extra / "tf_serving_warmup_requests").write_text('{"not": "a tfrecord file at all"}\n')


def simgpu_footprint(path: pathlib.Path, memory_mib: int) -> None:
    """Declare the version's simulated GPU footprint."""
    extra = path / "assets.extra"
    extra.mkdir(exist_ok=True)
    (extra / "simgpu.json").write_text(json.dumps({"memory_mib": memory_mib}))


def copy_version(source: pathlib.Path, base: pathlib.Path, version: int | str) -> pathlib.Path:
    """Publish ``source`` as ``base/<version>`` atomically (temp dir + rename)."""
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".tmp-{version}"
    shutil.copytree(source, tmp)
    target = base / str(version)
    os.rename(tmp, target)
    return target
