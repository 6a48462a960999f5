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


def graph() -> Any:
    """A new, empty ``Graph`` (tf.Graph)."""
    from tensorflow.python.framework import ops

    return ops.Graph()


def session(graph: Any, config: Any) -> Any:
    """A ``Session`` on ``graph`` with ConfigProto ``config`` (tf.compat.v1.Session)."""
    from tensorflow.python.client import session as session_lib

    return session_lib.Session(graph=graph, config=config)


def load_saved_model(sess: Any, tags: list[str], export_dir: str) -> Any:
    """tf.compat.v1.saved_model.loader.load: import the MetaGraph of ``tags`` into the
    session's graph and restore its variables (what the C++ LoadSavedModel does)."""
    from tensorflow.python.saved_model import loader_impl

    return loader_impl.load(sess, tags, export_dir)


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
