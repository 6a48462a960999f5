"""Golden requests: run them through a saved version, and check outputs against them.

A golden example in catalog.json is::

    {"signature": "serving_default",
     "inputs":  {"x": {"dtype": "DT_FLOAT", "shape": [3, 1], "values": [[1.0], [2.0], [5.0]]}},
     "outputs": {"y": {"dtype": "DT_FLOAT", "shape": [3, 1], "values": [[2.5], [3.0], [4.5]]}},
     "rtol": 1e-06, "atol": 1e-06}

An input may use ``"fill": {"kind": "ramp", ...}`` instead of ``values`` (see
``savedmodel.decode_array``). With ``"top_k": K`` the outputs hold, per output and per batch
row, the indices of the K largest values and those values: ``{"predictions": {"dtype",
"shape", "top_k": {"indices": [[...]], "values": [[...]]}}}``. An output matches when every
listed value satisfies ``|got - want| <= atol + rtol * |want|`` (for top_k: at the listed indices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testbed.models import savedmodel


def example_inputs(example: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Materialise the input arrays of a golden example."""
    return {name: savedmodel.decode_array(spec) for name, spec in example["inputs"].items()}


def describe_output(value: np.ndarray, top_k: int | None) -> dict[str, Any]:
    """Encode one output tensor for the catalog: all values, or the top-k per row."""
    if not top_k:
        return savedmodel.encode_array(value)
    rows = value.reshape(value.shape[0], -1)
    order = np.argsort(-rows, axis=1, kind="stable")[:, :top_k]
    values = np.take_along_axis(rows, order, axis=1)
    return {
        "dtype": savedmodel.tf_dtype_name(value.dtype),
        "shape": list(value.shape),
        "top_k": {"indices": order.tolist(), "values": values.tolist()},
    }


def compute(version_dir: Path, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Run each example through the SavedModel as TFServing runs it (Session-style, loaded
    once) and return it with ``outputs``."""
    if not examples:
        return []
    bundle = savedmodel.SessionBundle(version_dir)
    done = []
    try:
        for example in examples:
            result = bundle.run(example["signature"], example_inputs(example))
            outputs = {
                name: describe_output(value, example.get("top_k"))
                for name, value in sorted(result.items())
            }
            done.append({**example, "outputs": outputs})
    finally:
        bundle.close()
    return done


def mismatches(example: Mapping[str, Any], outputs: Mapping[str, np.ndarray]) -> list[str]:
    """Compare actual ``outputs`` with a golden example; return the problems (empty: match)."""
    rtol, atol = float(example["rtol"]), float(example["atol"])
    problems = []
    for name, want in example["outputs"].items():
        if name not in outputs:
            problems.append(f"output {name!r} missing")
            continue
        got = np.asarray(outputs[name])
        if list(got.shape) != list(want["shape"]):
            problems.append(f"output {name!r}: shape {list(got.shape)} != {want['shape']}")
            continue
        if "top_k" in want:
            rows = got.reshape(got.shape[0], -1)
            index = np.asarray(want["top_k"]["indices"])
            got_values = np.take_along_axis(rows, index, axis=1)
            want_values = np.asarray(want["top_k"]["values"])
        else:
            got_values, want_values = got, np.asarray(want["values"])
        if not np.allclose(got_values, want_values, rtol=rtol, atol=atol):
            worst = float(np.max(np.abs(got_values - want_values)))
            problems.append(f"output {name!r}: off by up to {worst:g} (rtol {rtol}, atol {atol})")
    return problems
