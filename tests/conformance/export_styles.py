"""SavedModels written at test time in each way TensorFlow 2.21 users export one for serving.

Every model is tiny (a 3 -> 1 dense layer, or the TF1 equivalent) and deterministic, so the
conformance tier stays fast and the expected outputs are known:

- ``keras_export``: a Keras 3 functional model, ``model.export(path)`` (Keras's own
  ``tf_saved_model`` format, built by ``keras.export.ExportArchive``);
- ``keras_archive``: the same model through ``keras.export.ExportArchive`` directly, with a
  ``serving_default`` endpoint returning ``{"y": ...}``;
- ``tf_module``: a ``tf.Module`` subclass with ``tf.Variable`` attributes and a ``tf.function``
  signature, ``tf.saved_model.save(module, path, signatures=...)``;
- ``keras_in_module``: the Keras 3 model held as an attribute of a ``tf.Module`` and saved with
  ``tf.saved_model.save`` (``keras_in_module_warmup``: the same with a warmup record);
- ``tf1_builder``: a TF1 graph (placeholder, variable, a vocabulary table read from an asset by
  the ``main_op``) written by ``tf.compat.v1.saved_model.Builder``.

Each is version ``1`` under ``<root>/<name>/``; ``<root>`` is mounted at ``/conf/exports``.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from typing import Any

import numpy as np

VERSION = 1
MOUNT = "/conf/exports"
INPUT = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
# expected outputs for INPUT
KERAS_Y = 6.5  # kernel of ones, bias 0.5: 1 + 2 + 3 + 0.5
MODULE_Y = 14.5  # w = [1, 2, 3], b = 0.5: 1 + 4 + 9 + 0.5
TF1_Y = 12.0  # (1 + 2 + 3) * 2
VOCABULARY = ("apple", "banana", "cherry")
SERVED = ("keras_export", "keras_archive", "tf_module", "keras_in_module", "tf1_builder")
WARMUP_MODEL = "keras_in_module_warmup"


def x_spec() -> list[Any]:
    """The input signature of every TF2 export here: ``x`` float32 [-1, 3]."""
    import tensorflow as tf

    return [tf.TensorSpec([None, 3], tf.float32, name="x")]


def keras_dense() -> Any:
    """A Keras 3 functional model: input ``x`` float32 [-1, 3], Dense(1), known weights."""
    import keras

    inputs = keras.Input(shape=(3,), name="x")
    outputs = keras.layers.Dense(1, name="dense", kernel_initializer="ones",
                                 bias_initializer=keras.initializers.Constant(0.5))(inputs)
    return keras.Model(inputs, outputs, name="dense_model")


def save_keras_export(path: pathlib.Path) -> None:
    """``model.export(path)``: Keras's documented way to write a SavedModel for serving."""
    keras_dense().export(str(path), verbose=False)


def save_keras_archive(path: pathlib.Path) -> None:
    """``keras.export.ExportArchive`` with the model tracked and one named endpoint."""
    import keras

    model = keras_dense()
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=lambda x: {"y": model(x, training=False)},
                         input_signature=x_spec())
    archive.write_out(str(path), verbose=False)


def save_tf_module(path: pathlib.Path) -> None:
    """A ``tf.Module`` with variables and a ``tf.function`` signature, saved by TF2."""
    import tensorflow as tf

    class Linear(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable([[1.0], [2.0], [3.0]])
            self.b = tf.Variable(0.5)

        @tf.function(input_signature=x_spec())  # type: ignore[untyped-decorator]
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": tf.matmul(x, self.w) + self.b}

    module = Linear()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def save_keras_in_module(path: pathlib.Path) -> None:
    """The Keras 3 model as an attribute of a ``tf.Module``, saved by ``tf.saved_model.save``.

    TF2's object loader (``tf.saved_model.load``) runs it; the Session-style loader
    TFServing uses cannot: the graph holds two handles per variable, the saver_def's restore
    op assigns one pair (``Variable``, ``Variable_1``) and ``serving_default`` reads the other
    (``dense/kernel``, ``dense/bias``), which nothing ever creates."""
    import tensorflow as tf

    class Wrapper(tf.Module):  # type: ignore[misc]
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        @tf.function(input_signature=x_spec())  # type: ignore[untyped-decorator]
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": self.model(x, training=False)}

    wrapper = Wrapper(keras_dense())
    tf.saved_model.save(wrapper, str(path), signatures={"serving_default": wrapper.serve})


def write_predict_warmup(path: pathlib.Path, model: str) -> None:
    """``assets.extra/tf_serving_warmup_requests``: one serving_default Predict of INPUT."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(INPUT))
    record = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request))
    extra = path / "assets.extra"
    extra.mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(extra / "tf_serving_warmup_requests")) as writer:
        writer.write(record.SerializeToString())


def save_tf1_builder(path: pathlib.Path) -> None:
    """A TF1 graph written by ``tf.compat.v1.saved_model.Builder``: ``serving_default``
    (x [-1, 3] -> y = sum(x) * 2 through a variable) and ``lookup`` (words -> ids, a table
    that the ``main_op`` fills from a vocabulary asset). The vocabulary is written to a
    directory deleted after the export, so only the asset copy the loader feeds exists."""
    import tensorflow as tf

    v1 = tf.compat.v1
    staging = pathlib.Path(tempfile.mkdtemp(prefix="tfsconf-vocab-"))
    try:
        vocabulary = staging / "vocabulary.txt"
        vocabulary.write_text("".join(f"{word}\n" for word in VOCABULARY))
        with tf.Graph().as_default() as graph, v1.Session(graph=graph) as session:
            x = v1.placeholder(tf.float32, [None, 3], name="x")
            weights = v1.get_variable("w", initializer=tf.ones([3, 1]))
            y = tf.multiply(tf.matmul(x, weights), 2.0, name="y")
            words = v1.placeholder(tf.string, [None], name="words")
            table = v1.lookup.StaticHashTable(v1.lookup.TextFileInitializer(
                str(vocabulary), tf.string, v1.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, v1.lookup.TextFileIndex.LINE_NUMBER), default_value=-1)
            ids = tf.identity(table.lookup(words), name="ids")
            session.run(v1.global_variables_initializer())
            signatures = v1.saved_model.signature_def_utils
            builder = v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(
                session, ["serve"],
                signature_def_map={
                    "serving_default": signatures.predict_signature_def({"x": x}, {"y": y}),
                    "lookup": signatures.predict_signature_def({"words": words}, {"ids": ids}),
                },
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=v1.tables_initializer())
            builder.save()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_all(root: pathlib.Path) -> None:
    """Write every model under ``root/<name>/1``."""
    builders = {"keras_export": save_keras_export, "keras_archive": save_keras_archive,
                "tf_module": save_tf_module, "keras_in_module": save_keras_in_module,
                WARMUP_MODEL: save_keras_in_module, "tf1_builder": save_tf1_builder}
    for name, build in builders.items():
        build(root / name / str(VERSION))
    write_predict_warmup(root / WARMUP_MODEL / str(VERSION), WARMUP_MODEL)


def config_text(names: tuple[str, ...]) -> str:
    """A model config serving ``names`` from the mount."""
    entries = "".join(f'config {{ name: "{name}" base_path: "{MOUNT}/{name}" '
                      'model_platform: "tensorflow" } ' for name in names)
    return f"model_config_list {{ {entries}}}\n"


def signature_defs(root: pathlib.Path, name: str) -> dict[str, Any]:
    """The SignatureDef map of the export's ``serve`` MetaGraphDef, read from its file."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((root / name / str(VERSION) / "saved_model.pb").read_bytes())
    (meta_graph,) = [m for m in saved_model.meta_graphs if list(m.meta_info_def.tags) == ["serve"]]
    return dict(meta_graph.signature_def)
