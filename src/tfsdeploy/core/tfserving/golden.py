"""Golden requests: known inputs and the outputs a version must give (pure).

File format (JSON), per version::

    {"version_details": {"2": {"golden": [
        {"signature": "serving_default", "atol": 1e-6, "rtol": 1e-6,
         "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [3, 1], "values": [[1.0], [2.0], [5.0]]}},
         "outputs": {"y": {"dtype": "DT_FLOAT", "shape": [3, 1], "values": [[3.5], [4.0], [5.5]]}}}
    ]}}}

An input may give ``"fill": {"kind": "ramp", "modulus": M, "scale": S}`` instead of ``values``
(value i is ``(i % M) * S``, in row-major order). An output may give ``"top_k": {"indices": [[...]],
"values": [[...]]}``: the listed values at the listed indices of each row. A value matches when
``|got - want| <= atol + rtol * |want|``. ``scripts/make-models`` writes this format as
``catalog.json`` beside the versions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfsdeploy.core.tfserving.tensors import Tensor, TensorError, tensor


@dataclass(frozen=True)
class GoldenExample:
    """One golden request and what its outputs must be."""

    signature: str
    inputs: Mapping[str, Tensor]
    outputs: Mapping[str, Mapping[str, Any]]
    atol: float
    rtol: float


def tensor_from_spec(spec: Mapping[str, Any]) -> Tensor:
    """The tensor an input entry describes (``values`` or a ``ramp`` fill)."""
    dtype, shape = spec["dtype"], tuple(spec["shape"])
    if "values" in spec:
        return tensor(spec["values"], dtype, shape)
    fill = spec.get("fill", {})
    if fill.get("kind") != "ramp":
        raise ValueError(f"unsupported golden input fill {fill!r}")
    modulus, scale = int(fill["modulus"]), float(fill["scale"])
    return tensor([(i % modulus) * scale for i in range(math.prod(shape))], dtype, shape)


def load_golden(path: str, version: int) -> list[GoldenExample]:
    """The golden examples of ``version`` in ``path`` (empty when the file has none)."""
    data = json.loads(Path(path).read_text())
    entries = data.get("version_details", {}).get(str(version), {}).get("golden", [])
    return [GoldenExample(signature=e.get("signature", "serving_default"),
                          inputs={k: tensor_from_spec(v) for k, v in e["inputs"].items()},
                          outputs=e["outputs"], atol=float(e.get("atol", 1e-6)),
                          rtol=float(e.get("rtol", 1e-6)))
            for e in entries]


def _expected(want: Mapping[str, Any], got: Tensor) -> tuple[list[float], list[float]] | str:
    """(actual, expected) values to compare, or why the output cannot match."""
    if "top_k" in want:
        indices = tensor(want["top_k"]["indices"], "DT_INT64")
        expected = tensor(want["top_k"]["values"], "DT_DOUBLE")
        rows = indices.shape[0] if indices.shape else 1
        if not got.size or got.size % rows:
            return f"has shape {list(got.shape)}, expected {rows} rows"
        width = got.size // rows
        values = got.as_floats()
        per_row = indices.size // rows if rows else 0
        try:
            actual = [values[(i // per_row) * width + index]
                      for i, index in enumerate(indices.values)]
        except IndexError:
            return f"has no class {max(indices.values)} (a row holds {width})"
        return actual, list(expected.values)
    expected = tensor(want["values"], "DT_DOUBLE")
    if got.shape != expected.shape:
        return f"has shape {got.shape}, expected {expected.shape}"
    return list(got.as_floats()), list(expected.values)


def mismatch(example: GoldenExample, outputs: Mapping[str, Tensor]) -> str | None:
    """Why ``outputs`` do not match the example, or None when they do (a NaN where a number is
    expected does not match)."""
    for name, want in example.outputs.items():
        if name not in outputs:
            return f"output {name!r} missing (got {sorted(outputs)})"
        try:
            pair = _expected(want, outputs[name])
        except TensorError as err:
            return f"output {name!r}: {err}"
        if isinstance(pair, str):
            return f"output {name!r} {pair}"
        actual, expected = pair
        errors = [abs(a - e) - (example.atol + example.rtol * abs(e))
                  for a, e in zip(actual, expected, strict=True)]
        bad = [i for i, error in enumerate(errors) if not error <= 0]
        if bad:
            worst = max(bad, key=lambda i: math.inf if math.isnan(errors[i]) else errors[i])
            return (f"output {name!r} differs: got {actual[worst]:.6g}, expected "
                    f"{expected[worst]:.6g} (atol {example.atol}, rtol {example.rtol})")
    return None
