"""resnet50 versions 1 and 2 (from the model cache, see the ``resnet_out`` fixture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from testbed.models import golden, savedmodel

pytestmark = pytest.mark.resnet


def details(out: Path) -> dict[str, Any]:
    """The version details of resnet50's catalog.json."""
    data: dict[str, Any] = json.loads((out / "resnet50" / "catalog.json").read_text())
    assert data["versions"] == [1, 2]
    return dict(data["version_details"])


@pytest.fixture(scope="module")
def predictions(resnet_out: Path) -> dict[str, Any]:
    """Each version's serving_default output on the catalog's golden input."""
    example = details(resnet_out)["1"]["golden"][0]
    inputs = golden.example_inputs(example)
    outputs = {}
    for version in ("1", "2"):
        fn = tf.saved_model.load(str(resnet_out / "resnet50" / version)).signatures[
            "serving_default"
        ]
        outputs[version] = {k: v.numpy() for k, v in fn(**inputs).items()}
    return outputs


def test_signature(resnet_out: Path) -> None:
    for version in ("1", "2"):
        sigs = savedmodel.signature_facts(resnet_out / "resnet50" / version)
        assert sigs == {
            "serving_default": {
                "method_name": "tensorflow/serving/predict",
                "inputs": {"inputs": {"dtype": "DT_FLOAT", "shape": [-1, 224, 224, 3]}},
                "outputs": {"predictions": {"dtype": "DT_FLOAT", "shape": [-1, 1000]}},
            }
        }


def test_warmup_has_five_batch_one_images(resnet_out: Path) -> None:
    logs = savedmodel.read_warmup(resnet_out / "resnet50" / "1")
    assert len(logs) == 5
    for log in logs:
        request = log.predict_log.request
        assert request.model_spec.signature_name == "serving_default"
        image = tf.make_ndarray(request.inputs["inputs"])
        assert image.shape == (1, 224, 224, 3) and image.dtype == np.float32


def test_golden_outputs_match_and_tell_versions_apart(
    resnet_out: Path, predictions: dict[str, Any]
) -> None:
    info = details(resnet_out)
    for version in ("1", "2"):
        example = info[version]["golden"][0]
        assert golden.mismatches(example, predictions[version]) == []
        other = predictions["2" if version == "1" else "1"]
        assert golden.mismatches(example, other)
    assert predictions["1"]["predictions"].sum() == pytest.approx(1.0, abs=1e-4)


def test_each_version_restores_and_warms_up_as_tfserving_loads_it(resnet_out: Path) -> None:
    """Session-style, as TFServing's SavedModelBundle loader does: every variable restored,
    every warmup record run (a Keras 3 model held in a tf.Module fails exactly here)."""
    for version in ("1", "2"):
        ran = savedmodel.check_servable(resnet_out / "resnet50" / version)
        assert ran == 5, version
