"""TensorFlow's C++ runtime, reached through the few Python modules the server needs.

The real server is C++: it links TensorFlow's runtime (graph import, sessions, kernels,
TFRecord reading) and nothing of TensorFlow's Python API. The emulator loads and runs graphs
through the same runtime, via its Python bindings. ``import tensorflow`` builds the whole
Python API on top (tf.data, distribute, the legacy Keras layers, about 2,300 modules): that
costs a server start more CPU than loading a model, and nothing of it is used here.

``lean()``, called first by the server's entry point, registers the ``tensorflow`` package
without running its ``__init__`` (a namespace-style package object with the package's real
path), so that ``tensorflow.core.*`` protos and the ``tensorflow.python`` modules below import
only themselves and their own dependencies. The kernels and op registrations live in the
runtime's shared libraries, loaded by ``pywrap_tensorflow`` either way, so a graph imports,
runs and fails exactly as after a full import. In a process that has imported TensorFlow
already (the tests), ``lean()`` changes nothing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any


def lean() -> None:
    """Register the ``tensorflow`` package without its Python API (idempotent)."""
    if "tensorflow" in sys.modules:
        return
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return  # no TensorFlow here: the first use raises the usual ImportError
    package = types.ModuleType("tensorflow")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules["tensorflow"] = package


# tensorflow/cc/saved_model/constants.h and loader.cc: where the variables and assets live, and
# where the init op is named (a TF2 signature first, else a TF1 collection)
VARIABLES_DIR, VARIABLES_FILE, ASSETS_DIR = "variables", "variables", "assets"
INIT_OP_SIGNATURE_KEY = "__saved_model_init_op"
MAIN_OP_KEY, LEGACY_INIT_OP_KEY, ASSETS_KEY = "saved_model_main_op", "legacy_init_op", \
    "saved_model_assets"


class Bundle:
    """A SavedModel's graph in a Session of TensorFlow's C API: ``outputs`` maps each tensor
    name the caller asked for (and the graph has) to its ``TF_Output``."""

    def __init__(self, graph: Any, session: Any, outputs: dict[str, Any]) -> None:
        self.graph = graph  # the session runs on it: kept alive as long as the session
        self.session = session
        self.outputs = outputs

    def close(self) -> None:
        """TF_CloseSession and TF_DeleteSession (tf.compat.v1.Session.close and __del__),
        once: a second call does nothing."""
        from tensorflow.python.client import pywrap_tf_session as c_api

        session, self.session = self.session, None
        if session is not None:
            c_api.TF_CloseSession(session)
            c_api.TF_DeleteSession(session)


def load_bundle(export_dir: str, meta_graph: Any, config: Any,
                tensor_names: list[str]) -> Bundle:
    """tensorflow/cc/saved_model/loader.cc LoadSavedModelInternal over TensorFlow's C API,
    for the MetaGraphDef ``meta_graph`` already read from ``export_dir``: a new Session on its
    graph_def (LoadMetaGraphIntoSession), the variables restored when variables.index exists
    (RunRestore: the saver's restore op with the variables' path fed to its filename tensor,
    and each asset's path fed), then the init op (GetInitOp, RunInitOp: the assets fed again).
    The graph is imported as ``import_graph_def`` does (TF_GraphImportGraphDefWithResults);
    none of TensorFlow's Python graph API is loaded, as none of it is in the C++ server.
    Failures raise TensorFlow's own status exceptions (tf.errors)."""
    from tensorflow.python.client import pywrap_tf_session as c_api
    from tensorflow.python.framework import errors_impl

    assets = _asset_feeds(export_dir, meta_graph)
    init_op = _init_op_name(meta_graph, export_dir)
    saver = meta_graph.saver_def
    variables_index = os.path.join(export_dir, VARIABLES_DIR, f"{VARIABLES_FILE}.index")
    restore = os.path.exists(variables_index)
    nodes = {node.name for node in meta_graph.graph_def.node}
    wanted = [*tensor_names, *assets]
    if restore:
        wanted.append(saver.filename_tensor_name)
    targets = [init_op] + ([saver.restore_op_name] if restore else [])
    missing = [name for name in targets if name and name not in nodes]
    if missing:  # the runtime's words (core/graph/subgraph.cc PruneForTargets)
        raise errors_impl.NotFoundError(
            None, None, f"PruneForTargets: Some target nodes not found: {' '.join(missing)} ")
    op_names = sorted(({_op_name(name) for name in wanted} | set(targets)) & nodes)
    graph = c_api.PyGraph()
    options = c_api.TF_NewImportGraphDefOptions()
    try:
        for name in op_names:
            c_api.TF_ImportGraphDefOptionsAddReturnOperation(options, name)
        buffer = c_api.TF_NewBufferFromString(meta_graph.graph_def.SerializeToString())
        try:
            results = c_api.TF_GraphImportGraphDefWithResults(graph, buffer, options)
        finally:
            c_api.TF_DeleteBuffer(buffer)
        returned = c_api.TF_ImportGraphDefResultsReturnOperations(results)
        c_api.TF_DeleteImportGraphDefResults(results)
    finally:
        c_api.TF_DeleteImportGraphDefOptions(options)
    operations = dict(zip(op_names, returned, strict=True))
    outputs = {name: out for name in wanted
               if (out := _output(c_api, operations, name)) is not None}
    session_options = c_api.TF_NewSessionOptions(config=config)
    try:
        session = c_api.TF_NewSessionRef(graph, session_options)
    finally:
        c_api.TF_DeleteSessionOptions(session_options)
    bundle = Bundle(graph, session, outputs)
    try:
        feeds = {outputs[name]: path for name, path in assets.items() if name in outputs}
        if restore:
            path = os.path.join(export_dir, VARIABLES_DIR, VARIABLES_FILE)
            filename = outputs.get(saver.filename_tensor_name)
            if filename is None:  # the runtime's words (core/graph/subgraph.cc FeedInputs)
                raise errors_impl.NotFoundError(
                    None, None,
                    f"FeedInputs: unable to find feed output {saver.filename_tensor_name}")
            _run_targets(c_api, session, {filename: _string(path), **feeds},
                         [operations[saver.restore_op_name]])
        if init_op:
            _run_targets(c_api, session, feeds, [operations[init_op]])
    except BaseException:
        bundle.close()
        raise
    return bundle


def _tensor_id(tensor_name: str) -> tuple[str, str]:
    """``x:1`` -> (``x``, ``1``); a name without an index is the op's output 0 (TF's
    ParseTensorName)."""
    op, _, index = tensor_name.rpartition(":")
    return (op, index) if op else (tensor_name, "0")


def _op_name(tensor_name: str) -> str:
    """``x:0`` -> ``x``."""
    return _tensor_id(tensor_name)[0]


def _output(c_api: Any, operations: dict[str, Any], tensor_name: str) -> Any:
    """The TF_Output of ``tensor_name`` (None: no such op, or no such output of it)."""
    op_name, index_text = _tensor_id(tensor_name)
    op = operations.get(op_name)
    if op is None or not index_text.isdigit():
        return None
    index = int(index_text)
    if index >= c_api.TF_OperationNumOutputs(op):
        return None
    output = c_api.TF_Output()
    output.oper, output.index = op, index
    return output


def _string(text: str) -> Any:
    """A DT_STRING scalar for a feed."""
    import numpy as np

    return np.array(text.encode(), dtype=object)


def _run_targets(c_api: Any, session: Any, feeds: dict[Any, Any], targets: list[Any]) -> None:
    """Session::Run(feeds, no fetches, targets) (loader.cc RunOnce)."""
    c_api.TF_SessionRun_wrapper(session, None, feeds, [], targets, None)


def _asset_feeds(export_dir: str, meta_graph: Any) -> dict[str, Any]:
    """loader.cc GetAssetFileDefs + AddAssetsTensorsToInputs: each asset tensor's name and the
    path fed to it (the MetaGraphDef's asset_file_def, else the TF1 assets collection)."""
    from tensorflow.core.protobuf import meta_graph_pb2

    defs = list(meta_graph.asset_file_def)
    if not defs and ASSETS_KEY in meta_graph.collection_def:
        for packed in meta_graph.collection_def[ASSETS_KEY].any_list.value:
            asset = meta_graph_pb2.AssetFileDef()
            packed.Unpack(asset)
            defs.append(asset)
    return {a.tensor_info.name: _string(os.path.join(export_dir, ASSETS_DIR, a.filename))
            for a in defs}


def _init_op_name(meta_graph: Any, export_dir: str) -> str:
    """loader.cc GetInitOp: the TF2 init signature's output, else the one op of the
    ``saved_model_main_op`` (or ``legacy_init_op``) collection; "" for none."""
    from tensorflow.python.framework import errors_impl

    signature = meta_graph.signature_def.get(INIT_OP_SIGNATURE_KEY)
    if signature is not None:
        return str(signature.outputs[INIT_OP_SIGNATURE_KEY].name)
    key = MAIN_OP_KEY if MAIN_OP_KEY in meta_graph.collection_def else LEGACY_INIT_OP_KEY
    if key not in meta_graph.collection_def:
        return ""
    ops = meta_graph.collection_def[key].node_list.value
    if len(ops) != 1:
        raise errors_impl.FailedPreconditionError(
            None, None, f"Expected exactly one main op in : {export_dir}")
    return str(ops[0])


def tf_record_iterator(path: str) -> Any:
    """tf.compat.v1.io.tf_record_iterator: the records of a TFRecord file."""
    from tensorflow.python.lib.io import tf_record

    return tf_record.tf_record_iterator(path)


def errors() -> Any:
    """The module of TensorFlow's status exceptions (tf.errors)."""
    from tensorflow.python.framework import errors as errors_lib

    return errors_lib


def graph_def_versions() -> tuple[int, int, str]:
    """(GRAPH_DEF_VERSION, GRAPH_DEF_VERSION_MIN_PRODUCER, VERSION) of the runtime
    (tf.version)."""
    from tensorflow.python.framework import versions

    return (int(versions.GRAPH_DEF_VERSION), int(versions.GRAPH_DEF_VERSION_MIN_PRODUCER),
            str(versions.VERSION))
