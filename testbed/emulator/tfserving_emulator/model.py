"""One loaded SavedModel version: its MetaGraphDef signatures and callable functions.

Loads with ``tf.saved_model.load``, which handles both TF2 ``tf.saved_model.save`` output and
TF1 ``SavedModelBuilder`` output. Signature metadata comes from the MetaGraphDef itself (as in
the real server's SavedModelBundle), so GetModelMetadata shows what TFServing shows, including
``__saved_model_init_op`` for TF2 models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from typing import Any

import numpy as np
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from .status import Code, ServingError, from_tf_exception, invalid_argument
from .tensors import dtype_name, numpy_dtype


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One signature input or output: alias, graph tensor name, dtype, static shape."""

    alias: str
    name: str
    dtype: int
    shape: tuple[int, ...] | None


@dataclasses.dataclass(frozen=True)
class Signature:
    """A signature's inputs and outputs by alias, and its method name."""

    key: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    method_name: str


def _spec(alias: str, info: Any) -> TensorSpec:
    shape = None if info.tensor_shape.unknown_rank else tuple(
        int(d.size) for d in info.tensor_shape.dim)
    return TensorSpec(alias=alias, name=info.name, dtype=info.dtype, shape=shape)


def read_meta_graph(export_dir: str, tags: list[str]) -> meta_graph_pb2.MetaGraphDef:
    """Read saved_model.pb and return the MetaGraphDef whose tag set equals ``tags``."""
    pb = pathlib.Path(export_dir, "saved_model.pb")
    if not pb.exists():
        raise ServingError(
            Code.NOT_FOUND,
            "Could not find SavedModel .pb or .pbtxt at supplied export directory path: "
            f"{export_dir}. Check that the directory exists and that you have the right "
            "permissions for accessing it.")
    saved_model = saved_model_pb2.SavedModel()
    try:
        saved_model.ParseFromString(pb.read_bytes())
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


def signatures_of(meta_graph: meta_graph_pb2.MetaGraphDef) -> dict[str, Signature]:
    """All SignatureDefs of a MetaGraphDef as Signature records."""
    out = {}
    for key, sig in meta_graph.signature_def.items():
        out[key] = Signature(
            key=key,
            inputs={a: _spec(a, i) for a, i in sig.inputs.items()},
            outputs={a: _spec(a, i) for a, i in sig.outputs.items()},
            method_name=sig.method_name)
    return out


def variables_size(export_dir: str) -> int:
    """Bytes under <export_dir>/variables (0 if absent)."""
    total = 0
    for root, _dirs, files in os.walk(os.path.join(export_dir, "variables")):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


class LoadedModel:
    """A SavedModel loaded with TensorFlow, callable per signature with numpy in/out."""

    def __init__(self, export_dir: str, tags: list[str]) -> None:
        self.export_dir = export_dir
        self.meta_graph = read_meta_graph(export_dir, tags)
        self.signatures = signatures_of(self.meta_graph)
        import tensorflow as tf

        try:
            self._loaded = tf.saved_model.load(export_dir, tags=tags)
        except Exception as exc:
            raise from_tf_exception(exc) from exc
        self._functions = dict(getattr(self._loaded, "signatures", {}) or {})

    def run(self, key: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run signature ``key`` on numpy inputs; returns every output alias as numpy."""
        function = self._functions.get(key)
        if function is None:
            raise ServingError(Code.FAILED_PRECONDITION,
                               f'Serving signature key "{key}" is not callable.')
        signature = self.signatures[key]
        feeds = {}
        for index, (alias, array) in enumerate(sorted(inputs.items())):
            spec = signature.inputs[alias]
            expected = numpy_dtype(spec.dtype)
            if expected is not object and array.dtype != np.dtype(expected):
                from .tensors import tf_dtype
                raise invalid_argument(
                    f"Expects arg[{index}] to be {dtype_name(spec.dtype)} but "
                    f"{dtype_name(tf_dtype(array))} is provided")
            feeds[alias] = array
        try:
            results = function(**feeds)
        except Exception as exc:
            error = from_tf_exception(exc)
            if error.code == Code.UNKNOWN:
                error = invalid_argument(str(exc).strip().splitlines()[0] if str(exc) else
                                         type(exc).__name__)
            raise error from exc
        return {alias: np.asarray(value) for alias, value in results.items()}
