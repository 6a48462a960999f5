"""Golden requests: known inputs and the outputs a version must give (pure).

File format (JSON), per version::

    {"version_details": {"2": {"golden": [
        {"signature": "serving_default", "atol": 1e-6, "rtol": 1e-6,
         "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [3, 1], "values": [[1.0], [2.0], [5.0]]}},
         "outputs": {"y": {"dtype": "DT_FLOAT", "shape": [3, 1], "values": [[3.5], [4.0], [5.5]]}}}
    ]}}}

An input may give ``"fill": {"kind": "ramp", "modulus": M, "scale": S}`` instead of ``values``
(``(arange(n) % M) * S``, reshaped). An output may give ``"top_k": {"indices": [[...]],
"values": [[...]]}``: the listed values at the listed indices of each row. A value matches when
``|got - want| <= atol + rtol * |want|``. ``scripts/make-models`` writes this format as
``catalog.json`` beside the versions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfsdeploy.core.tfserving.api import NUMERIC_DTYPES


@dataclass(frozen=True)
class GoldenExample:
    """One golden request and what its outputs must be."""

    signature: str
    inputs: Mapping[str, np.ndarray]
    outputs: Mapping[str, Mapping[str, Any]]
    atol: float
    rtol: float


def tensor_from_spec(spec: Mapping[str, Any]) -> np.ndarray:
    """The array an input entry describes (``values`` or a ``ramp`` fill)."""
    dtype = np.dtype(NUMERIC_DTYPES[spec["dtype"]][0]).newbyteorder("=")
    shape = tuple(spec["shape"])
    if "values" in spec:
        return np.asarray(spec["values"], dtype=dtype).reshape(shape)
    fill = spec.get("fill", {})
    if fill.get("kind") != "ramp":
        raise ValueError(f"unsupported golden input fill {fill!r}")
    flat = (np.arange(int(np.prod(shape))) % int(fill["modulus"])) * float(fill["scale"])
    return flat.astype(dtype).reshape(shape)


def load_golden(path: str, version: int) -> list[GoldenExample]:
    """The golden examples of ``version`` in ``path`` (empty when the file has none)."""
    data = json.loads(Path(path).read_text())
    entries = data.get("version_details", {}).get(str(version), {}).get("golden", [])
    return [GoldenExample(signature=e.get("signature", "serving_default"),
                          inputs={k: tensor_from_spec(v) for k, v in e["inputs"].items()},
                          outputs=e["outputs"], atol=float(e.get("atol", 1e-6)),
                          rtol=float(e.get("rtol", 1e-6)))
            for e in entries]


def mismatch(example: GoldenExample, outputs: Mapping[str, np.ndarray]) -> str | None:
    """Why ``outputs`` do not match the example, or None when they do."""
    for name, want in example.outputs.items():
        if name not in outputs:
            return f"output {name!r} missing (got {sorted(outputs)})"
        got = np.asarray(outputs[name], dtype=np.float64)
        if "top_k" in want:
            indices = np.asarray(want["top_k"]["indices"])
            expected = np.asarray(want["top_k"]["values"], dtype=np.float64)
            actual = np.take_along_axis(got.reshape(indices.shape[0], -1), indices, axis=1)
        else:
            expected = np.asarray(want["values"], dtype=np.float64)
            if got.shape != expected.shape:
                return f"output {name!r} has shape {got.shape}, expected {expected.shape}"
            actual = got
        error = np.abs(actual - expected) - (example.atol + example.rtol * np.abs(expected))
        if np.any(error > 0):
            worst = int(np.argmax(error))
            return (f"output {name!r} differs: got {actual.flat[worst]:.6g}, expected "
                    f"{expected.flat[worst]:.6g} (atol {example.atol}, rtol {example.rtol})")
    return None
