"""Where the C++ model server refuses a SavedModel that Python TensorFlow, which this server
runs on, accepts (or refuses with another status): the same refusal, in the C++ server's words.

- **Kernels only Python has.** ``PyFunc``, ``PyFuncStateless`` and ``EagerPyFunc``
  (``tf.numpy_function``, ``tf.py_func``, ``tf.py_function``) are registered as ops by
  TensorFlow's core op library (tensorflow/core/ops/script_ops.cc, part of
  //tensorflow/core/ops:ops, which tensorflow_model_server links), but their kernels are
  registered only by TensorFlow's Python extension (tensorflow/python/lib/core/py_func.cc). In
  the C++ server the placer finds no kernel for such a node and fails the Session::Run that
  needs it with INVALID_ARGUMENT "No OpKernel was registered to support Op 'EagerPyFunc' used
  by {{node ...}} with these attrs: [...] Registered kernels: <no registered kernels>"
  (tensorflow/core/common_runtime/colocation_graph.cc): a node of the top-level graph fails the
  load (the session places its whole graph at the first run, the restore), one inside a
  signature's function fails each run of that signature (the warmup, then every request).
  Here the kernel exists, so the run would instead fail looking up a Python callback the
  saving process registered.
- **GraphDef versions.** A GraphDef whose ``min_consumer`` is above the server's
  TensorFlow (or whose producer is below its minimum, or that lists it as a bad consumer) is
  refused by CheckVersions (tensorflow/core/framework/versions.cc) when the session is
  created: INVALID_ARGUMENT. Python's importer says the same words as a ValueError, which would
  surface here as UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from . import tfruntime
from .status import Code, ServingError

PYTHON_KERNEL_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})

Functions = Mapping[str, Sequence[node_def_pb2.NodeDef]]


def check_graph_versions(meta_graph: meta_graph_pb2.MetaGraphDef) -> None:
    """CheckVersions(graph_def.versions, TF_GRAPH_DEF_VERSION, TF_GRAPH_DEF_VERSION_MIN_PRODUCER,
    "GraphDef", "graph"): raise the C++ server's INVALID_ARGUMENT when it refuses the graph."""
    versions = meta_graph.graph_def.versions
    consumer, min_producer, release = tfruntime.graph_def_versions()
    if versions.producer < min_producer:
        raise ServingError(Code.INVALID_ARGUMENT, (
            f"GraphDef producer version {versions.producer} below min producer {min_producer} "
            f"supported by TensorFlow {release}.  Please regenerate your graph."))
    if versions.min_consumer > consumer:
        raise ServingError(Code.INVALID_ARGUMENT, (
            f"GraphDef min consumer version {versions.min_consumer} above current version "
            f"{consumer} for TensorFlow {release}.  Please upgrade TensorFlow."))
    if consumer in versions.bad_consumers:
        raise ServingError(Code.INVALID_ARGUMENT, (
            f"GraphDef disallows consumer version {consumer}.  Please upgrade TensorFlow: this "
            "version is likely buggy."))


def _attr_text(value: attr_value_pb2.AttrValue) -> str:
    """An attr as TensorFlow's node summaries show it (the kinds a Python op has)."""
    kind = value.WhichOneof("value")
    if kind == "list":
        return "[" + ", ".join(types_pb2.DataType.Name(t) for t in value.list.type) + "]"
    if kind == "type":
        return str(types_pb2.DataType.Name(value.type))
    if kind == "s":
        return f'"{value.s.decode(errors="replace")}"'
    if kind == "b":
        return "true" if value.b else "false"
    return f"{getattr(value, kind)}" if kind else ""


def no_kernel_error(path: Sequence[str], node: node_def_pb2.NodeDef) -> ServingError:
    """The placer's refusal of ``node``, reached through the call nodes ``path``."""
    name = "/".join([*path, node.name])
    attrs = ", ".join(f"{key}={_attr_text(node.attr[key])}" for key in sorted(node.attr)
                      if not key.startswith("_"))
    context = "".join(f"\n\t [[{'/'.join(path[:depth])}]]" for depth in range(len(path), 0, -1))
    return ServingError(Code.INVALID_ARGUMENT, (
        f"No OpKernel was registered to support Op '{node.op}' used by {{{{node {name}}}}} with "
        f"these attrs: [{attrs}]\nRegistered devices: [CPU]\nRegistered kernels:\n  <no "
        f"registered kernels>\n\n\t [[{name}]]{context}"))


def _callees(node: node_def_pb2.NodeDef, functions: Functions) -> list[str]:
    """The library functions a node calls: as its op, or through a func attr (``f``,
    ``then_branch``, ``body``, ...)."""
    named = [node.op, *(v.func.name for v in node.attr.values() if v.HasField("func"))]
    return [name for name in named if name in functions]


def python_node(nodes: Iterable[node_def_pb2.NodeDef], functions: Functions,
                seen: set[str] | None = None
                ) -> tuple[list[str], node_def_pb2.NodeDef] | None:
    """The first node with a Python-only kernel among ``nodes`` or in the functions they call
    (with the call nodes on the way), or None."""
    seen = set() if seen is None else seen
    for node in nodes:
        if node.op in PYTHON_KERNEL_OPS:
            return [], node
        for callee in _callees(node, functions):
            if callee in seen:
                continue
            seen.add(callee)
            found = python_node(functions[callee], functions, seen)
            if found is not None:
                return [node.name, *found[0]], found[1]
    return None


def _ancestors(graph: graph_pb2.GraphDef, tensors: Iterable[str]) -> list[node_def_pb2.NodeDef]:
    """The top-level nodes a run fetching ``tensors`` executes."""
    by_name = {node.name: node for node in graph.node}
    todo = [t.lstrip("^").split(":")[0] for t in tensors]
    found: dict[str, node_def_pb2.NodeDef] = {}
    while todo:
        name = todo.pop()
        if name in found or name not in by_name:
            continue
        found[name] = by_name[name]
        todo.extend(i.lstrip("^").split(":")[0] for i in by_name[name].input)
    return list(found.values())


def unrunnable_fetches(meta_graph: meta_graph_pb2.MetaGraphDef) -> dict[str, ServingError]:
    """What the C++ server refuses to run: each signature output tensor whose run needs a
    Python-only kernel -> the placer's error. A top-level node with such a kernel fails the
    load itself (raised here)."""
    graph = meta_graph.graph_def
    functions = {f.signature.name: list(f.node_def) for f in graph.library.function}
    top = next((n for n in graph.node if n.op in PYTHON_KERNEL_OPS), None)
    if top is not None:
        raise no_kernel_error([], top)
    refused: dict[str, ServingError] = {}
    for signature in meta_graph.signature_def.values():
        for output in signature.outputs.values():
            found = python_node(_ancestors(graph, [output.name]), functions)
            if found is not None:
                refused[output.name] = no_kernel_error(*found)
    return refused
