"""One loaded SavedModel version: its MetaGraphDef and a TensorFlow Session over its graph.

Loading and running follow TFServing's SavedModelBundle path, not TF2's object API:
- session_bundle/oss/session_bundle_util.cc LoadSessionBundleOrSavedModelBundle: a directory
  with ``export.meta`` is a removed SessionBundle (UNIMPLEMENTED); one without
  ``saved_model.pb``/``.pbtxt`` is NOT_FOUND; otherwise LoadSavedModel imports the MetaGraphDef
  whose tag set equals the requested tags into a fresh Session, restores the variables and runs
  the init op (TF1 ``main_op``/``legacy_init_op``, TF2 ``__saved_model_init_op``);
- servables/tensorflow/predict_util.cc, classifier.cc, regressor.cc: every API resolves a
  SignatureDef to graph tensor names and calls ``Session::Run(run_options, feeds, fetches)``.
  Nothing checks the fed tensors against the signature's static shape or dtype: the graph and
  its kernels decide, so ``[2.0, 3.0]`` fed to a ``[-1, 1]`` placeholder of half_plus_two runs.

Here the bundle is loaded as tensorflow/cc/saved_model/loader.cc does, over TensorFlow's C API
(``tfruntime.load_bundle``), and run through ``TF_SessionRun_wrapper``, the C++
``Session::Run`` (RunOptions included, e.g. ``timeout_in_ms``), without the Python client's
feed-shape checks.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, saved_model_pb2

from . import cpp_runtime, tfruntime
from .inference import SignatureIndex
from .status import Code, ServingError, from_tf_exception

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def variables_size(export_dir: str) -> int:
    """Bytes under <export_dir>/variables (0 if absent)."""
    total = 0
    for root, _dirs, files in os.walk(os.path.join(export_dir, "variables")):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def check_bundle_dir(export_dir: str) -> None:
    """LoadSessionBundleOrSavedModelBundle's checks before any TensorFlow call."""
    if pathlib.Path(export_dir, "export.meta").exists():
        raise ServingError(Code.UNIMPLEMENTED, "Session Bundle is deprecated and removed.")
    if not any(pathlib.Path(export_dir, name).exists() for name in SAVED_MODEL_FILES):
        raise ServingError(
            Code.NOT_FOUND,
            "Specified file path does not appear to contain a SavedModel bundle (should have a "
            f"file called `saved_model.pb`)\nSpecified file path: {export_dir}")


def read_meta_graph(export_dir: str, tags: Sequence[str]) -> meta_graph_pb2.MetaGraphDef:
    """Read saved_model.pb and return the MetaGraphDef whose tag set equals ``tags``."""
    pb = pathlib.Path(export_dir, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    try:
        if pb.exists():
            saved_model.ParseFromString(pb.read_bytes())
        else:
            from google.protobuf import text_format

            text_format.Parse(pathlib.Path(export_dir, "saved_model.pbtxt").read_text(),
                              saved_model)
    except Exception as exc:  # DecodeError and friends
        raise ServingError(Code.DATA_LOSS, f"Can't parse {pb} as binary proto") from exc
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == set(tags):
            return meta_graph
    raise ServingError(
        Code.NOT_FOUND,
        "Could not find meta graph def matching supplied tags: { " + " ".join(sorted(tags))
        + " }. To inspect available tag-sets in the SavedModel, please use the SavedModel CLI: "
        "`saved_model_cli`")


class RunOptionsCache:
    """Serialized RunOptions buffers for the C API, one per timeout value (few distinct)."""

    def __init__(self) -> None:
        self._buffers: dict[int, Any] = {}
        self._lock = threading.Lock()

    def get(self, timeout_ms: int) -> Any:
        """A TF_Buffer holding RunOptions(timeout_in_ms) (None for no timeout)."""
        if timeout_ms <= 0:
            return None
        with self._lock:
            buffer = self._buffers.get(timeout_ms)
            if buffer is None:
                from tensorflow.python.client import pywrap_tf_session as tf_session

                data = config_pb2.RunOptions(timeout_in_ms=timeout_ms).SerializeToString()
                buffer = tf_session.TF_NewBufferFromString(data)
                if len(self._buffers) < 64:  # gRPC deadlines vary: keep only a few
                    self._buffers[timeout_ms] = buffer
            return buffer


_RUN_OPTIONS = RunOptionsCache()


class LoadedModel:
    """A SavedModel imported into its own Session; ``run`` is ``Session::Run``."""

    def __init__(self, export_dir: str, tags: Sequence[str],
                 session_config: config_pb2.ConfigProto | None = None) -> None:
        self.export_dir = export_dir
        check_bundle_dir(export_dir)
        self.meta_graph = read_meta_graph(export_dir, tags)
        cpp_runtime.check_graph_versions(self.meta_graph)  # what the C++ server refuses
        self._refused = cpp_runtime.unrunnable_fetches(self.meta_graph)
        self.signature_defs = dict(self.meta_graph.signature_def)
        self.indexes = {key: SignatureIndex.of(s) for key, s in self.signature_defs.items()}
        config = config_pb2.ConfigProto()
        if session_config is not None:
            config.CopyFrom(session_config)
        config.device_count["GPU"] = 0  # TensorFlow runs on CPU; the GPU is simulated
        config.allow_soft_placement = True
        names = sorted({t.name for s in self.signature_defs.values()
                        for t in (*s.inputs.values(), *s.outputs.values())})
        try:
            self._bundle = tfruntime.load_bundle(export_dir, self.meta_graph, config, names)
        except Exception as exc:
            raise from_tf_exception(exc) from exc

    def _output(self, name: str) -> Any:
        """The C API TF_Output of graph tensor ``name``."""
        output = self._bundle.outputs.get(name)
        if output is None:
            raise ServingError(
                Code.NOT_FOUND,
                f"Tensor {name}, specified in either feed_devices or fetch_devices was not "
                "found in the Graph")
        return output

    def run(self, feeds: Sequence[tuple[str, np.ndarray]], fetches: Sequence[str],
            timeout_ms: int = 0) -> list[np.ndarray]:
        """``Session::Run(RunOptions{timeout_in_ms}, feeds, fetches)``: numpy in, numpy out."""
        from tensorflow.python.client import pywrap_tf_session as tf_session

        if self._refused:  # a Python-only kernel the C++ server lacks (cpp_runtime)
            refused = next((self._refused[f] for f in fetches if f in self._refused), None)
            if refused is not None:
                raise ServingError(refused.code, refused.message)
        feed_dict = {self._output(name): value for name, value in feeds}
        fetch_list = [self._output(name) for name in fetches]
        try:
            results = tf_session.TF_SessionRun_wrapper(
                self._bundle.session, _RUN_OPTIONS.get(timeout_ms), feed_dict, fetch_list,
                [], None)
        except Exception as exc:
            raise from_tf_exception(exc) from exc
        return [np.asarray(value) for value in results]

    def close(self) -> None:
        """Release the session (on unload)."""
        with contextlib.suppress(Exception):
            self._bundle.close()
