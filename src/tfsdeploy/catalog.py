"""The model catalog: what the inventory says about each model it serves.

Frozen, typed data only. Validation rules live in ``validate``; rendering in ``render``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

DTYPES = frozenset({
    "DT_FLOAT", "DT_DOUBLE", "DT_INT32", "DT_INT64", "DT_UINT8", "DT_INT8", "DT_INT16",
    "DT_STRING", "DT_BOOL", "DT_HALF", "DT_BFLOAT16",
})


def _frozen(mapping: Mapping[str, object] | None) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class TensorSpec:
    """dtype (TensorFlow's DataType name, e.g. ``DT_FLOAT``) and shape (-1 = any)."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Signature:
    """The signature contract a release must serve, as the deploy gate checks it."""

    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    name: str = "serving_default"

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", _frozen(self.inputs))
        object.__setattr__(self, "outputs", _frozen(self.outputs))


@dataclass(frozen=True)
class Batching:
    """TFServing BatchingParameters (session_bundle_config.proto); ``enabled`` sets the flag."""

    enabled: bool = True
    max_batch_size: int = 8
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 32
    num_batch_threads: int = 1
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    thread_pool_name: str | None = None


@dataclass(frozen=True)
class Threads:
    """Server thread flags. 0 means "leave TFServing's default" and emits no flag."""

    intra_op: int = 0
    inter_op: int = 0
    session: int = 0
    grpc_max_threads: int = 0
    rest_api_num_threads: int = 0


@dataclass(frozen=True)
class Warmup:
    """The warmup gate: representative requests sent straight to the new slot."""

    samples: int = 200
    p99_ms: float | None = None  # None: the model's latency SLO
    timeout_s: float = 120.0


@dataclass(frozen=True)
class Rollout:
    """How a model's releases roll across the fleet."""

    serial: tuple[int | str, ...] = (1, "25%", "100%")
    max_fail_percentage: float = 0.0
    on_failure: Literal["revert", "stay"] = "revert"
    keep_releases: int = 3
    strategy: Literal["dual-slot", "recreate"] = "dual-slot"
    load_timeout_s: float = 300.0
    health_timeout_s: float = 60.0
    min_healthy_s: float = 5.0
    drain_timeout_s: float = 30.0
    # after a successful roll the drained old release stays running this long, so that a
    # rollback is a switch back with no model load (0: stop it at the end of the roll)
    window_s: float = 0.0


@dataclass(frozen=True)
class Model:
    """One servable in the catalog.

    ``source`` is the version source: a directory on the deploying machine whose numeric
    sub-directories are the versions. ``labels`` maps a label to a version number, or to
    ``"release"`` for the version being deployed.
    """

    name: str
    source: str
    signature: Signature
    memory_mib: int
    latency_slo_ms: float
    hosts: str = "all"
    batching: Batching = field(default_factory=Batching)
    threads: Threads = field(default_factory=Threads)
    warmup: Warmup = field(default_factory=Warmup)
    rollout: Rollout = field(default_factory=Rollout)
    labels: Mapping[str, int | str] = field(default_factory=dict)
    golden: str | None = None  # JSON file of golden requests and expected outputs
    port_offset: int = 0  # added to every port, so that co-located models do not clash

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen(self.labels))
