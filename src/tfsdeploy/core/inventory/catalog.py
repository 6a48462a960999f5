"""The model catalog: what the inventory says about each model it serves.

Frozen, typed data. Constructing a value checks nothing, so that an inventory file always runs
to its end and every mistake in it can be reported at once; ``validate_catalog`` (and
``inventory.build_inventory``) check every field with pydantic against the annotations below
(types, ranges, enums) and then the rules between fields. Rendering is in ``render``; the
rules on rendered files are in ``validate``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, SkipValidation, Strict

from tfsdeploy.core.errors import Problem, shown
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, validate_canary
from tfsdeploy.core.inventory.schema import (
    INT32_MAX,
    INT64_MAX,
    ONE_WEEK_S,
    Flag,
    LabelName,
    ModelName,
    NonNegativeInt64,
    Percent,
    PositiveInt32,
    PositiveSeconds,
    Seconds,
    SerialStep,
    ShortName,
    Text,
    check,
    rule,
)

DType = Literal[
    "DT_FLOAT", "DT_DOUBLE", "DT_INT32", "DT_INT64", "DT_UINT8", "DT_INT8", "DT_INT16",
    "DT_STRING", "DT_BOOL", "DT_HALF", "DT_BFLOAT16",
]

# Values are checked after construction (see the module docstring): revalidate instances.
CHECKED = ConfigDict(revalidate_instances="always", extra="forbid")

Dimension = Annotated[int, Strict(), Field(ge=-1, le=INT64_MAX)]
# Each is an OS thread of the server; TFServing starts them all at start-up.
ThreadCount = Annotated[int, Strict(), Field(ge=0, le=1024)]


def _frozen(mapping: object) -> object:
    """An immutable copy of a mapping (anything else is left for validation to report)."""
    return MappingProxyType(dict(mapping)) if isinstance(mapping, Mapping) else mapping


def _tuple(items: object) -> object:
    """A tuple of a list or tuple (anything else is left for validation to report)."""
    return tuple(items) if isinstance(items, (list, tuple)) else items


@dataclass(frozen=True)
class TensorSpec:
    """dtype (TensorFlow's DataType name, e.g. ``DT_FLOAT``) and shape (-1 = any)."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    dtype: DType
    shape: Annotated[tuple[Dimension, ...], Field(max_length=254)]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _tuple(self.shape))


TensorMap = Annotated[Mapping[Text, TensorSpec], Field(min_length=1, max_length=1024)]


@dataclass(frozen=True)
class Signature:
    """The signature contract a release must serve, as the deploy gate checks it."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    inputs: TensorMap
    outputs: TensorMap
    name: Text = "serving_default"

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", _frozen(self.inputs))
        object.__setattr__(self, "outputs", _frozen(self.outputs))


@dataclass(frozen=True)
class Batching:
    """TFServing BatchingParameters (session_bundle_config.proto); ``enabled`` sets the flag.

    Ranges follow what the server accepts (TensorFlow's shared_batch_scheduler.h: a batch
    size and a queue of at least 1, a timeout of at least 0, at least one thread; the sizes
    are read as int32 by bundle_factory_util.cc). ``max_enqueued_batches`` 0 is refused
    although the server rewrites it to 1: that rewrite exists only for old models, and
    writing 1 says what the server will do."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    enabled: Flag = True
    max_batch_size: PositiveInt32 = 8
    batch_timeout_micros: NonNegativeInt64 = 0
    max_enqueued_batches: PositiveInt32 = 32
    num_batch_threads: Annotated[int, Strict(), Field(ge=1, le=1024)] = 1
    allowed_batch_sizes: Annotated[tuple[PositiveInt32, ...], Field(max_length=1024)] = ()
    pad_variable_length_inputs: Flag = False
    thread_pool_name: ShortName | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_batch_sizes", _tuple(self.allowed_batch_sizes))


@dataclass(frozen=True)
class Threads:
    """Server thread flags. 0 means "leave TFServing's default" and emits no flag."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    intra_op: ThreadCount = 0
    inter_op: ThreadCount = 0
    session: ThreadCount = 0
    # --grpc_max_threads is a gRPC resource quota (main.cc, server.cc); see validate's rule
    grpc_max_threads: Annotated[int, Strict(), Field(ge=0, le=65536)] = 0
    rest_api_num_threads: ThreadCount = 0


@dataclass(frozen=True)
class Warmup:
    """The warmup gate: representative requests sent straight to the new slot."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    samples: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] = 200
    p99_ms: Annotated[float, Strict(), Field(gt=0, le=3_600_000, allow_inf_nan=False)] \
        | None = None  # None: the model's latency SLO
    timeout_s: PositiveSeconds = 120.0


@dataclass(frozen=True)
class Rollout:
    """How a model's releases roll across the fleet."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    serial: Annotated[tuple[SerialStep, ...], Field(min_length=1, max_length=100)] = \
        (1, "25%", "100%")
    max_fail_percentage: Percent = 0.0
    on_failure: Literal["revert", "stay"] = "revert"
    # at least 2: the previous release must stay for rollback to have somewhere to go
    keep_releases: Annotated[int, Strict(), Field(ge=2, le=1000)] = 3
    strategy: Literal["dual-slot", "recreate"] = "dual-slot"
    load_timeout_s: PositiveSeconds = 300.0
    min_healthy_s: Seconds = 5.0
    drain_timeout_s: Seconds = 30.0
    # after a successful roll the drained old release stays running this long, so that a
    # rollback is a switch back with no model load (0: stop it at the end of the roll)
    window_s: Annotated[float, Strict(), Field(ge=0, le=ONE_WEEK_S, allow_inf_nan=False)] = 0.0
    # a host's instances out of rotation at once: instances roll one after the other, so
    # only 1 is accepted (the host keeps instances - 1 serving; with "recreate" the one
    # rolling is out)
    max_unavailable: Annotated[int, Strict(), Field(ge=1, le=64)] = 1
    # the most a run of this model may take, lock wait included (None: no limit): past it the
    # run stops as at SIGTERM, restores what it changed and releases the lock
    # (run.engine.deadline_stops); unattended runs set one above their longest roll
    deadline_s: Annotated[float | None, Strict(),
                          Field(gt=0, le=ONE_WEEK_S, allow_inf_nan=False)] = None
    # weighted steps on the first batch, judged new slot against old on live traffic
    # (canary.CanaryPolicy, checked by canary.validate_canary; None: no canary steps)
    canary: Annotated[CanaryPolicy | None, SkipValidation] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "serial", _tuple(self.serial))


def _label_target_problem(target: object) -> str | None:
    if target == "release" or (isinstance(target, int) and not isinstance(target, bool)
                               and 0 < target <= INT64_MAX):
        return None
    return f"label points at {shown(target)}, neither a positive version number nor 'release'"


LabelTarget = Annotated[int | str, rule(
    _label_target_problem, "point the label at a positive version number or 'release'")]
# a comma-separated list of host names, group names and globs (Inventory.match)
HostPattern = Annotated[str, Strict(), Field(min_length=1, max_length=4096)]


@dataclass(frozen=True)
class Model:
    """One servable in the catalog.

    ``source`` is the version source: a directory on the deploying machine whose numeric
    sub-directories are the versions. ``labels`` maps a label to a version number, or to
    ``"release"`` for the version being deployed. ``expected_concurrency`` is the most
    requests clients keep in flight to one host at once (0: at least ``max_batch_size`` when
    batching is on, since a batch fills only when that many requests wait together).
    """

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    name: ModelName
    source: Text
    signature: Signature
    # footprint of one release in MiB (at most 1 TiB)
    memory_mib: Annotated[int, Strict(), Field(ge=1, le=1 << 20)]
    latency_slo_ms: Annotated[float, Strict(), Field(gt=0, le=3_600_000, allow_inf_nan=False)]
    hosts: HostPattern = "all"
    batching: Batching = field(default_factory=Batching)
    threads: Threads = field(default_factory=Threads)
    warmup: Warmup = field(default_factory=Warmup)
    rollout: Rollout = field(default_factory=Rollout)
    labels: Annotated[Mapping[LabelName, LabelTarget], Field(max_length=64)] = \
        field(default_factory=dict)
    golden: Text | None = None  # JSON file of golden requests and expected outputs
    # added to every port, so that co-located models do not clash (checked per host)
    port_offset: Annotated[int, Strict(), Field(ge=0, le=65535)] = 0
    expected_concurrency: Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)] = 0
    # on GPU hosts: one TFServing instance per GPU ("per_gpu": TensorFlow places a model's ops
    # on the first GPU it sees), or one instance seeing all of them ("host": for models that
    # place ops on several GPUs themselves); ``gpus`` limits the host GPUs used (None: all)
    placement: Literal["per_gpu", "host"] = "per_gpu"
    gpus: Annotated[tuple[Annotated[int, Strict(), Field(ge=0, le=1023)], ...] | None,
                    Field(min_length=1, max_length=64)] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen(self.labels))
        if self.gpus is not None:
            object.__setattr__(self, "gpus", _tuple(self.gpus))


def validate_catalog(models: Sequence[object], file: str) -> tuple[list[Model], list[Problem]]:
    """Every model checked: (the valid ones, the problems of all of them), each problem
    located at ``models.<name>.<field>`` in ``file``."""
    valid: list[Model] = []
    problems: list[Problem] = []
    for index, raw in enumerate(models):
        model, found = check(Model, raw, file=file, prefix=model_field(raw, index))
        if model is not None:
            found = model_rules(model, file)
        problems += found
        if not found:
            valid.append(model)
    return valid, problems


def model_field(raw: object, index: int) -> str:
    """``models.<name>`` when the entry has a usable name, else ``models[<index>]``."""
    name = getattr(raw, "name", None)
    return f"models.{name}" if isinstance(name, str) and name.isprintable() and name \
        and len(name) <= 64 else f"models[{index}]"


def model_rules(model: Model, file: str) -> list[Problem]:
    """Rules between the fields of one valid model."""
    canary = model.rollout.canary
    if canary is not None and not isinstance(canary, CanaryPolicy):
        return [Problem(f"rollout.canary {shown(canary)} is not a CanaryPolicy",
                        fix="write canary=CanaryPolicy(weights=(5, 25, 50), ...)", file=file,
                        field=f"models.{model.name}.rollout.canary")]
    if canary is not None:
        found = validate_canary(canary, field=f"models.{model.name}.rollout.canary", file=file)
        if found:
            return found
    where = f"models.{model.name}"
    problems = []
    sizes = model.batching.allowed_batch_sizes
    if sizes and sizes[-1] != model.batching.max_batch_size:
        problems.append(Problem(
            f"the last allowed_batch_sizes entry {sizes[-1]} must equal max_batch_size "
            f"{model.batching.max_batch_size} (TFServing fails the load otherwise)",
            fix=f"end allowed_batch_sizes with {model.batching.max_batch_size}",
            file=file, field=f"{where}.batching.allowed_batch_sizes"))
    if any(b <= a for a, b in itertools.pairwise(sizes)):
        problems.append(Problem(
            f"allowed_batch_sizes {list(sizes)} are not strictly increasing",
            fix="list the sizes in increasing order (session_bundle_config.proto requires "
                "it; the server pads each batch to the first entry that fits)",
            file=file, field=f"{where}.batching.allowed_batch_sizes"))
    problem = grpc_threads_problem(model)
    if problem:
        problems.append(Problem(problem[0], fix=problem[1], file=file,
                                field=f"{where}.threads.grpc_max_threads"))
    if model.rollout.max_unavailable > 1:
        problems.append(Problem(
            f"max_unavailable {model.rollout.max_unavailable}: a host's instances are replaced "
            "one at a time, so at most 1 is ever out of rotation; a larger value would not "
            "make the roll faster",
            fix="set max_unavailable=1 or leave it out", file=file,
            field=f"{where}.rollout.max_unavailable"))
    return problems


def expected_concurrency(model: Model) -> tuple[int, str]:
    """The requests one server must hold at once for ``model``, and where that comes from."""
    if model.expected_concurrency:
        return model.expected_concurrency, "expected_concurrency"
    if model.batching.enabled:
        return model.batching.max_batch_size, \
            "max_batch_size: a batch fills only when that many requests wait together"
    return 1, "one request at a time"


def grpc_threads_problem(model: Model) -> tuple[str, str] | None:
    """(message, fix) when --grpc_max_threads cannot hold the model's expected concurrency.

    TFServing gives the flag to gRPC as the sync server's thread quota
    (ResourceQuota::SetMaxThreads in model_servers/server.cc). gRPC's sync server runs each
    call on a thread of that quota until it is answered, and keeps one thread polling for
    new calls; a call that arrives when the poller cannot be replaced is answered
    RESOURCE_EXHAUSTED ("Server Threadpool Exhausted": grpc's thread_manager.cc and
    server_cc.cc). So a quota of N holds N - 1 requests at once. 0 leaves TFServing's
    default, 4 x the host's CPUs, which this rule cannot know."""
    threads = model.threads.grpc_max_threads
    need, source = expected_concurrency(model)
    if not threads or threads - 1 >= need:
        return None
    return (f"grpc_max_threads {threads} lets TFServing hold {threads - 1} gRPC request(s) at "
            f"once (one thread of the quota always polls for new calls), fewer than the {need} "
            f"the model expects ({source}); the others are refused with RESOURCE_EXHAUSTED",
            f"set grpc_max_threads to at least {need + 1}, or 0 for TFServing's default "
            "(4 x the host's CPUs)")
