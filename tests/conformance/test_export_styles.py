"""Every way TensorFlow 2.21 users export a SavedModel, served by the ``exports`` container.

The models are written at test time by export_styles.py with the installed TensorFlow and
Keras. What TFServing does with each follows from how it loads and runs a SavedModel:

- Loading is Session-style for TF1 and TF2 exports alike (servables/tensorflow/
  saved_model_bundle_factory.cc InternalCreateSavedModelBundle ->
  session_bundle/oss/session_bundle_util.cc LoadSessionBundleOrSavedModelBundle -> TF
  cc/saved_model/loader.cc LoadSavedModelInternal): the ``serve`` MetaGraphDef's graph goes
  into a new Session (LoadMetaGraphIntoSession), the saver_def's restore op runs with the
  variables path fed (RunRestore), then the init op (GetInitOp: the ``__saved_model_init_op``
  signature, else the ``saved_model_main_op`` collection, else ``legacy_init_op``) with every
  asset's path fed (RunInitOp, AddAssetsTensorsToInputs). No signature runs during the load.
- Warmup runs inside the load, after the bundle is created (servables/tensorflow/
  saved_model_bundle_source_adapter.cc GetServableCreator -> saved_model_warmup.cc
  RunSavedModelWarmup): each record goes through RunPredict/RunClassify/..., and the first
  error ends the warmup (saved_model_warmup_util.cc RunSavedModelWarmupUntracked,
  TF_RETURN_IF_ERROR) and with it the load; with no warmup file it returns OK ("No warmup
  data file found at ...").
- Predict is ``Session::Run`` of the signature's tensor names; its error status is the RPC's
  (servables/tensorflow/predict_util.cc RunPredict, TF_RETURN_IF_ERROR(session->Run(...))).
- GetModelMetadata returns the loaded MetaGraphDef's whole signature_def map
  (servables/tensorflow/get_model_metadata_impl.cc SavedModelGetSignatureDef).
"""

from __future__ import annotations

import pathlib
from typing import Any

import export_styles
import grpc
import numpy as np
import pytest
from conformance_support import RPC_TIMEOUT, SHARED_CONTAINERS, Container, post_json
from google.protobuf import text_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    predict_pb2,
)
from tensorflow_serving.config import model_server_config_pb2

pytestmark = SHARED_CONTAINERS

AVAILABLE, END = 30, 50  # ModelVersionStatus.State
FAILED_PRECONDITION = 9  # error.Code
VERSION = export_styles.VERSION
MISSING_VARIABLE = "Could not find variable dense/"


@pytest.fixture(scope="module")
def exports(servers: dict[str, Container]) -> Container:
    return servers["exports"]


def model_states(container: Container, model: str) -> list[tuple[int, int, int, str]]:
    """GetModelStatus: (version, state, error code, error message) of every version."""
    _predict, models = container.stubs()
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = model
    response = models.GetModelStatus(request, RPC_TIMEOUT)
    return [(s.version, s.state, s.status.error_code, s.status.error_message)
            for s in response.model_version_status]


def predict(container: Container, model: str, inputs: dict[str, np.ndarray],
            signature: str = "serving_default") -> dict[str, np.ndarray]:
    """One gRPC Predict; the outputs as arrays (checks the response's model_spec)."""
    import tensorflow as tf

    stub, _models = container.stubs()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    response = stub.Predict(request, RPC_TIMEOUT)
    assert (response.model_spec.name, response.model_spec.signature_name,
            response.model_spec.version.value) == (model, signature, VERSION)
    return {key: tf.make_ndarray(tensor) for key, tensor in response.outputs.items()}


def predict_error(container: Container, model: str) -> tuple[grpc.StatusCode, str]:
    """A gRPC Predict of export_styles.INPUT that must fail: its code and message."""
    with pytest.raises(grpc.RpcError) as info:
        predict(container, model, {"x": export_styles.INPUT})
    return info.value.code(), info.value.details()


def only_output(outputs: dict[str, np.ndarray]) -> np.ndarray:
    (value,) = outputs.values()
    return value


def served_signatures(container: Container, model: str) -> dict[str, Any]:
    """GetModelMetadata's signature_def map."""
    stub, _models = container.stubs()
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = model
    response = stub.GetModelMetadata(request, RPC_TIMEOUT)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    return dict(signature_map.signature_def)


def assert_loaded_as_exported(container: Container, scratch: pathlib.Path, model: str) -> None:
    """Version 1 AVAILABLE with an OK status; the metadata is the file's signature_def map."""
    assert model_states(container, model) == [(VERSION, AVAILABLE, 0, "")]
    assert served_signatures(container, model) == export_styles.signature_defs(
        scratch / "exports", model)


def rest_predict(container: Container, model: str) -> tuple[int, Any]:
    return post_json(f"{container.rest}/v1/models/{model}:predict",
                     {"instances": export_styles.INPUT.tolist()})


# ------------------------------------------------------------------ styles that serve

def test_keras_model_export(exports: Container, scratch: pathlib.Path) -> None:
    """Keras 3 ``model.export()``: the ExportArchive it builds tracks the model's variables
    (the checkpoint holds them, the saver_def restores every handle its functions read), so
    the Session-style load serves it. Both endpoints it writes, ``serve`` and
    ``serving_default``, answer; the output key is the one Keras wrote (``output_0``)."""
    assert_loaded_as_exported(exports, scratch, "keras_export")
    for signature in ("serving_default", "serve"):
        outputs = predict(exports, "keras_export", {"x": export_styles.INPUT}, signature)
        np.testing.assert_allclose(only_output(outputs), [[export_styles.KERAS_Y]])
    assert rest_predict(exports, "keras_export") == (200, {"predictions": [[6.5]]})


def test_keras_export_archive(exports: Container, scratch: pathlib.Path) -> None:
    """``keras.export.ExportArchive`` with ``track(model)`` and a ``serving_default`` endpoint
    returning a dict: served under the dict's key."""
    assert_loaded_as_exported(exports, scratch, "keras_archive")
    outputs = predict(exports, "keras_archive", {"x": export_styles.INPUT})
    np.testing.assert_allclose(outputs["y"], [[export_styles.KERAS_Y]])
    assert rest_predict(exports, "keras_archive") == (200, {"predictions": [[6.5]]})


def test_tf_module_saved_model_save(exports: Container, scratch: pathlib.Path) -> None:
    """``tf.saved_model.save`` of a ``tf.Module`` whose ``tf.Variable`` attributes its
    ``tf.function`` signature reads: the variables are tracked objects, restored by the
    saver_def and initialized by ``__saved_model_init_op``; served."""
    assert_loaded_as_exported(exports, scratch, "tf_module")
    outputs = predict(exports, "tf_module", {"x": export_styles.INPUT})
    np.testing.assert_allclose(outputs["y"], [[export_styles.MODULE_Y]])


def test_tf1_saved_model_builder(exports: Container, scratch: pathlib.Path) -> None:
    """``tf.compat.v1.saved_model.Builder``: restored by its Saver, then the ``main_op``
    collection's op (loader.cc GetInitOp) fills the table from the vocabulary asset, whose
    path the loader feeds from the export's assets/ (AddAssetsTensorsToInputs): the file the
    graph was built from no longer exists."""
    assert_loaded_as_exported(exports, scratch, "tf1_builder")
    outputs = predict(exports, "tf1_builder", {"x": export_styles.INPUT})
    np.testing.assert_allclose(outputs["y"], [[export_styles.TF1_Y]])
    words = np.array([b"banana", b"durian", b"apple"])
    ids = predict(exports, "tf1_builder", {"words": words}, "lookup")["ids"]
    assert ids.tolist() == [1, -1, 0]


# ------------------------------------------------------------------ Keras 3 inside tf.Module

def test_keras_in_module_available_but_every_predict_fails(exports: Container,
                                                           scratch: pathlib.Path) -> None:
    """A Keras 3 model held by a ``tf.Module`` and saved with ``tf.saved_model.save``: its
    functions read variable handles the saver_def never restores. Nothing runs a signature
    during the load (loader.cc), so with no warmup file the version becomes AVAILABLE and its
    metadata is served; every Predict then fails in the runtime's ReadVariableOp with
    FAILED_PRECONDITION "Could not find variable dense/kernel. ... Resource
    localhost/dense/kernel/N10tensorflow3VarE does not exist." (predict_util.cc RunPredict
    returns Session::Run's status; REST maps FAILED_PRECONDITION to 400, http_server.cc
    ToHTTPStatusCode). Reported against TFServing 2.15 (gRPC status 9:
    https://github.com/tensorflow/serving/issues/2226), behind KServe's TFServing runtime with
    the endpoint ready (https://github.com/kserve/kserve/issues/3801), and as
    https://github.com/tensorflow/tensorflow/issues/72963 and
    https://github.com/keras-team/keras/issues/20095 (saved_model_cli run, the same
    Session-style load)."""
    assert_loaded_as_exported(exports, scratch, "keras_in_module")
    for _attempt in range(2):  # not only the first run: the variables never appear
        code, message = predict_error(exports, "keras_in_module")
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert message.startswith(MISSING_VARIABLE), message
        assert "Resource localhost/dense/" in message and "does not exist." in message
    status, body = rest_predict(exports, "keras_in_module")
    assert status == 400 and body["error"].startswith(MISSING_VARIABLE), body
    assert model_states(exports, "keras_in_module") == [(VERSION, AVAILABLE, 0, "")]


def test_keras_in_module_with_warmup_fails_to_load(exports: Container) -> None:
    """The same export with a Predict warmup record: the record's RunPredict fails as above
    inside the load (saved_model_warmup_util.cc RunSavedModelWarmupUntracked returns it), so
    the load fails (retries are off here) and the version ends in END with that status
    (core/loader_harness.cc, basic_manager.cc publish kEnd with the load's error). Added by
    HandleReloadConfigRequest, the RPC fails UNKNOWN "1 model(s) did not become available:
    {{{name: M version: 1} due to error: FAILED_PRECONDITION: ...}, }" (server_core.cc
    WaitUntilModelsAvailable; model_service_impl.cc returns it as the gRPC status), and a
    Predict finds no servable: NOT_FOUND "Servable not found for request: Latest(M)"
    (basic_manager.cc ServingMap::GetUntypedServableHandle, manager.h DebugString)."""
    model = export_styles.WARMUP_MODEL
    config = text_format.Parse(export_styles.config_text((*export_styles.SERVED, model)),
                               model_server_config_pb2.ModelServerConfig())
    _predict, models = exports.stubs()
    with pytest.raises(grpc.RpcError) as info:
        models.HandleReloadConfigRequest(
            model_management_pb2.ReloadConfigRequest(config=config), timeout=RPC_TIMEOUT * 3)
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert info.value.details().startswith(
        "1 model(s) did not become available: {{{name: " + model + f" version: {VERSION}}} "
        f"due to error: FAILED_PRECONDITION: {MISSING_VARIABLE}"), info.value.details()
    assert info.value.details().endswith("}, }"), info.value.details()
    ((version, state, code, message),) = model_states(exports, model)
    assert (version, state, code) == (VERSION, END, FAILED_PRECONDITION)
    assert message.startswith(MISSING_VARIABLE), message
    assert predict_error(exports, model) == (
        grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({model})")
    outputs = predict(exports, "keras_export", {"x": export_styles.INPUT})  # others unharmed
    np.testing.assert_allclose(only_output(outputs), [[export_styles.KERAS_Y]])
    assert "No warmup data file found at /conf/exports/keras_export/1/" in exports.logs()
