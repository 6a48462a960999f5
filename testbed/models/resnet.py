"""``resnet50``: Keras ResNet50 with random weights (no downloads), versions 1 and 2.

Each version is built with a different random seed and exported through Keras's own export
path (``keras.export.ExportArchive``, what ``model.export()`` uses), whose ``serving_default``
takes ``inputs`` float32 [-1, 224, 224, 3] and returns ``predictions`` float32 [-1, 1000]
(softmax); ~100 MB each. The archive tracks every variable of the model, so TensorFlow
Serving's Session-style loader restores them all. Holding the Keras 3 model inside a
``tf.Module`` and calling ``tf.saved_model.save`` instead writes a SavedModel that TF2's
``tf.saved_model.load`` runs but TFServing cannot ("Could not find variable
conv1_conv/kernel": tensorflow/tensorflow#72963, kserve/kserve#3801, keras-team/keras#20095).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from testbed.models import savedmodel
from testbed.models.spec import VersionSpec

MODEL = "resnet50"
INPUT = "inputs"
OUTPUT = "predictions"
SHAPE = (224, 224, 3)
CLASSES = 1000
WARMUP_RECORDS = 5
TOP_K = 5

_SOURCES = (Path(__file__), Path(savedmodel.__file__), Path(__file__).with_name("spec.py"))


def seed(version: int) -> int:
    """Return the Keras random seed of a version (the version number itself)."""
    return version


def save_resnet(path: Path, random_seed: int) -> None:
    """Build ResNet50(weights=None) under ``random_seed`` and export it for serving."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(random_seed)
    net = keras.applications.ResNet50(weights=None, input_shape=SHAPE, classes=CLASSES)

    def predict(inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return {OUTPUT: net(inputs, training=False)}

    archive = keras.export.ExportArchive()
    archive.track(net)
    archive.add_endpoint(
        name="serving_default",
        fn=predict,
        input_signature=[tf.TensorSpec([None, *SHAPE], tf.float32, name=INPUT)],
    )
    archive.write_out(str(path), verbose=False)


def warmup_records(version: int) -> list[bytes]:
    """Five batch-1 predict requests with seeded uniform [0, 1) images."""
    rng = np.random.default_rng(1000 + version)
    return [
        savedmodel.predict_log(
            MODEL, "serving_default", {INPUT: rng.random((1, *SHAPE), dtype=np.float32)}
        )
        for _ in range(WARMUP_RECORDS)
    ]


def _examples() -> tuple[dict[str, Any], ...]:
    """One golden request: a ramp image, checked on its top-5 class probabilities."""
    return (
        {
            "signature": "serving_default",
            "inputs": {INPUT: savedmodel.ramp_spec([1, *SHAPE])},
            "top_k": TOP_K,
            "rtol": 1e-3,
            "atol": 1e-6,
        },
    )


def _spec(version: int) -> VersionSpec:
    """The spec of one resnet50 version."""

    def build(path: Path) -> dict[str, Any]:
        save_resnet(path, seed(version))
        savedmodel.write_warmup(path, warmup_records(version))
        return {"warmup_records": WARMUP_RECORDS, "seed": seed(version)}

    return VersionSpec(
        model=MODEL,
        version=version,
        summary=f"Keras ResNet50, random weights (seed {seed(version)}), softmax over 1000",
        recipe={"kind": "resnet50", "seed": seed(version), "warmup": WARMUP_RECORDS,
                "export": "keras.export.ExportArchive"},
        build=build,
        source_files=_SOURCES,
        examples=_examples(),
    )


def specs() -> list[VersionSpec]:
    """The resnet50 versions the generator makes."""
    return [_spec(1), _spec(2)]
