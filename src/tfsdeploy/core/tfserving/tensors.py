"""Dense tensors as plain Python values, and TensorProto to and from them.

A deploy machine has no numpy (about 70 MB, for a few tensors per gate): golden requests,
the canary comparison and the load generator's request data hold their tensors as a
``Tensor``: the dtype's name, the shape, and the values flat in row-major order, each as the
dtype holds it (a DT_FLOAT value is the float32 the wire carries, a DT_INT32 one an int in
range). ``struct`` packs and unpacks them little-endian, as TensorProto's ``tensor_content``
is written (tensorflow/core/framework/tensor.proto: "the raw contents of the tensor ...
little-endian").
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# dtype name -> (struct code, TensorProto field holding its values one by one, kind)
# (tensor.proto: DT_HALF's values go in half_val as their 16 bits; int8, uint8, int16 and
# uint16 go in int_val)
NUMERIC_DTYPES: dict[str, tuple[str, str, str]] = {
    "DT_FLOAT": ("f", "float_val", "f"),
    "DT_DOUBLE": ("d", "double_val", "f"),
    "DT_HALF": ("e", "half_val", "f"),
    "DT_INT8": ("b", "int_val", "i"),
    "DT_UINT8": ("B", "int_val", "u"),
    "DT_INT16": ("h", "int_val", "i"),
    "DT_UINT16": ("H", "int_val", "u"),
    "DT_INT32": ("i", "int_val", "i"),
    "DT_INT64": ("q", "int64_val", "i"),
    "DT_UINT32": ("I", "uint32_val", "u"),
    "DT_UINT64": ("Q", "uint64_val", "u"),
    "DT_BOOL": ("?", "bool_val", "b"),
}
STRING = "DT_STRING"
STRING_KIND = "S"


class TensorError(ValueError):
    """Values that do not make a tensor of the dtype and shape asked for."""


@dataclass(frozen=True)
class Tensor:
    """A dense tensor: TensorFlow's dtype name, the shape, the values flat (row-major)."""

    dtype: str
    shape: tuple[int, ...]
    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        if self.dtype not in NUMERIC_DTYPES and self.dtype != STRING:
            raise TensorError(f"unsupported dtype {self.dtype} (one of "
                              f"{', '.join(sorted(NUMERIC_DTYPES))} or {STRING})")
        if len(self.values) != math.prod(self.shape):
            raise TensorError(f"{len(self.values)} values do not fill shape {list(self.shape)}")

    @property
    def size(self) -> int:
        """How many values."""
        return len(self.values)

    @property
    def ndim(self) -> int:
        """How many axes."""
        return len(self.shape)

    @property
    def kind(self) -> str:
        """``f`` float, ``i`` signed, ``u`` unsigned, ``b`` bool, ``S`` bytes."""
        return STRING_KIND if self.dtype == STRING else NUMERIC_DTYPES[self.dtype][2]

    def tolist(self) -> Any:
        """Nested lists (the value itself for a scalar)."""
        return _nest(list(self.values), self.shape)

    def rows(self) -> list[tuple[Any, ...]]:
        """The values cut along the last axis (one row per position of the other axes)."""
        width = self.shape[-1] if self.shape else 1
        return [self.values[i:i + width] for i in range(0, self.size, width)] if width else []

    def position(self, flat: int) -> tuple[int, ...]:
        """The index along each axis of the ``flat``-th value."""
        place = []
        for size in reversed(self.shape):
            flat, rest = divmod(flat, size)
            place.append(rest)
        return tuple(reversed(place))

    def as_floats(self) -> tuple[float, ...]:
        """The values as floats (numbers only)."""
        if self.kind == STRING_KIND:
            raise TensorError(f"{self.dtype} values are not numbers")
        return tuple(float(v) for v in self.values)



def _nest(flat: list[Any], shape: Sequence[int]) -> Any:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = math.prod(shape[1:])
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _flatten(values: Any) -> tuple[tuple[int, ...], list[Any]]:
    """The shape of nested lists (rectangular) and their leaves in row-major order."""
    if not isinstance(values, (list, tuple)):
        return (), [values]
    if not values:
        return (0,), []
    shapes, flat = set(), []
    for item in values:
        shape, leaves = _flatten(item)
        shapes.add(shape)
        flat.extend(leaves)
    if len(shapes) != 1:
        raise TensorError("nested lists must be rectangular (every row of one length)")
    return (len(values), *shapes.pop()), flat


def convert(values: Sequence[Any], dtype: str) -> tuple[Any, ...]:
    """Each value as ``dtype`` holds it: float32 and float16 rounded to nearest, integers
    truncated toward zero and checked against the dtype's range, text as UTF-8 bytes."""
    if dtype == STRING:
        return tuple(v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values)
    if dtype not in NUMERIC_DTYPES:
        raise TensorError(f"unsupported dtype {dtype} (one of "
                          f"{', '.join(sorted(NUMERIC_DTYPES))} or {STRING})")
    code, _, kind = NUMERIC_DTYPES[dtype]
    if kind == "b":
        return tuple(bool(v) for v in values)
    try:
        items = [float(v) if kind == "f" else int(v) for v in values]
        if code in "fe":
            return struct.unpack(f"<{len(items)}{code}", struct.pack(f"<{len(items)}{code}",
                                                                     *items))
        struct.pack(f"<{len(items)}{code}", *items)  # the range check
    except (struct.error, OverflowError, TypeError, ValueError) as err:
        raise TensorError(f"values do not fit {dtype}: {err}") from None
    return tuple(items)


def tensor(values: Any, dtype: str, shape: Sequence[int] | None = None) -> Tensor:
    """A tensor from nested lists (a scalar, flat values ...), shaped as they are or, when
    ``shape`` is given, as it says (the count must match, as numpy's reshape asks)."""
    found, flat = _flatten(values)
    if shape is not None:
        found = tuple(int(s) for s in shape)
    return Tensor(dtype, found, convert(flat, dtype))


def pack(item: Tensor) -> bytes:
    """A numeric tensor's values as ``tensor_content`` (little-endian)."""
    code = NUMERIC_DTYPES[item.dtype][0]
    return struct.pack(f"<{item.size}{code}", *item.values)


def unpack(content: bytes, dtype: str, count: int) -> tuple[Any, ...]:
    """``count`` values of ``dtype`` from ``tensor_content``."""
    code = NUMERIC_DTYPES[dtype][0]
    if len(content) != count * struct.calcsize(f"<{code}"):
        raise TensorError(f"tensor_content holds {len(content)} bytes, not {count} {dtype} "
                          "values")
    return struct.unpack(f"<{count}{code}", content)


def halves(bits: Sequence[int]) -> tuple[float, ...]:
    """DT_HALF values from ``half_val`` (each the 16 bits of one float16)."""
    return struct.unpack(f"<{len(bits)}e", struct.pack(f"<{len(bits)}H",
                                                       *(b & 0xFFFF for b in bits)))
