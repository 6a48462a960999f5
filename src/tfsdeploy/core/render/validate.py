"""Validation before any connection: the catalog, and every rendered file parsed with
TFServing's own message definitions, then checked against the rules that TFServing enforces
late (at start-up or load) or silently (ignored flags).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message

from tfsdeploy.core.errors import Problem
from tfsdeploy.core.inventory.catalog import Model, validate_catalog
from tfsdeploy.core.inventory.gpu import check_gpu_plan
from tfsdeploy.core.inventory.load import Inventory, placement_problems
from tfsdeploy.core.inventory.schema import INT64_MAX, model_name_problem
from tfsdeploy.core.render.files import (
    BATCHING_CONFIG,
    CONTAINER_CONFIG_DIR,
    FLAGS,
    MODEL_CONFIG,
    MONITORING_CONFIG,
    HostRender,
)
from tfsdeploy.core.render.flags import (
    PARALLELISM_FLAGS,
    FlagLine,
    FlagsFile,
    read_flags_file,
)
from tfsdeploy.core.tfserving import configs as tfproto

LABEL_NAME = re.compile(r"^[A-Za-z0-9_]+$")
DEFAULT_MAX_BATCH_SIZE = 1000  # TFServing's default when max_batch_size is unset


def check_model_name(name: str) -> str | None:
    """Why ``name`` cannot be a model name (it becomes a directory on every host), or None."""
    if not isinstance(name, str):
        return f"model name {name!r} is not a string"
    return model_name_problem(name)


def check_version(version: int) -> str | None:
    """Why ``version`` is not a TFServing version number (a positive int64), or None."""
    if isinstance(version, bool) or not isinstance(version, int) or not 0 < version <= INT64_MAX:
        return (f"version {version!r} must be a positive integer up to {INT64_MAX} (a numeric "
                "directory name)")
    return None


def validate_model(model: Model, inventory_file: str) -> list[Problem]:
    """Every field of a catalog entry and the rules between them (also run by
    ``build_inventory`` for every model); each problem located at ``models.<name>.<field>``."""
    return validate_catalog([model], inventory_file)[1]


def validate_render(render: HostRender, inventory_file: str) -> list[Problem]:
    """Parse each rendered file as TFServing would, then check the cross-file rules."""
    host = render.host.name
    problems: list[Problem] = []
    parsed: dict[str, Message] = {}
    for name, message_type in ((MODEL_CONFIG, tfproto.ModelServerConfig),
                               (BATCHING_CONFIG, tfproto.BatchingParameters),
                               (MONITORING_CONFIG, tfproto.MonitoringConfig)):
        message, problem = parse_text_proto(render.file(name).text, message_type, host, name)
        if problem:
            problems.append(problem)
        else:
            parsed[name] = message
    read = read_flags_file(render.file(FLAGS).text, render.host.vars.tfserving_version)
    flags = read.flags
    problems += [Problem(reason, "write one --name=value per line", host=host,
                         file=f"{FLAGS}:{line}") for line, reason in read.syntax]
    if MODEL_CONFIG in parsed:
        problems += check_model_config(parsed[MODEL_CONFIG], host, flags)
    if BATCHING_CONFIG in parsed:
        problems += check_batching(parsed[BATCHING_CONFIG], host, render.model.latency_slo_ms)
    if MONITORING_CONFIG in parsed:
        problems += check_monitoring(parsed[MONITORING_CONFIG], host)
    problems += check_flags(read, render)
    for instance in render.instances:
        if instance.plan:
            problems += check_gpu_plan(instance.plan, inventory_file)
    return problems


def parse_text_proto(text: str, message_type: type[Message], host: str, name: str
                     ) -> tuple[Message, Problem | None]:
    """Parse like TextFormat::ParseFromString: unknown fields, JSON and bare wrappers fail.

    The message returned may be shared with other hosts whose file differs only in comments
    (a fleet's files do): read it, never change it."""
    message, error = _parse(_without_comment_lines(text), message_type)
    if error is None:
        return message, None
    reason, line = error
    return message, Problem(
        f"TFServing would reject this file ({message_type.DESCRIPTOR.name}): {reason}",
        fix="write protobuf text format (not JSON); wrapper fields need "
            "`name { value: N }`; only fields of " + message_type.DESCRIPTOR.full_name,
        host=host, file=f"{name}:{line}" if line else name)


def _without_comment_lines(text: str) -> str:
    """``text`` with whole-line comments emptied: the same message, the same line numbers."""
    return "\n".join("" if line.lstrip().startswith("#") else line
                     for line in text.split("\n"))


Parsed = tuple[Message, tuple[str, int | None] | None]
_PARSED: dict[tuple[str, str], Parsed] = {}


def _parse(text: str, message_type: type[Message]) -> Parsed:
    """The parsed message and (reason, line) of a parse error, cached: a fleet's files are
    the same text for every host, and parsing is most of the time a render takes."""
    key = (message_type.DESCRIPTOR.full_name, text)
    if key not in _PARSED:
        if len(_PARSED) > 256:
            _PARSED.clear()
        message = message_type()
        try:
            text_format.Parse(text, message)
            _PARSED[key] = (message, None)
        except text_format.ParseError as exc:
            _PARSED[key] = (message, (str(exc), exc.GetLine() or None))
    return _PARSED[key]


def check_model_config(config: Any, host: str, flags: Sequence[FlagLine]) -> list[Problem]:
    """ModelServerConfig rules: list form, names, absolute paths, versions and labels."""
    def problem(message: str, fix: str, field: str) -> Problem:
        return Problem(message, fix, host=host, file=MODEL_CONFIG, field=field)

    if config.WhichOneof("config") != "model_config_list":
        return [problem("only model_config_list is supported by TFServing",
                        "write model_config_list { config { ... } }", "config")]
    problems: list[Problem] = []
    allow_unavailable = _flag_value(flags, "allow_version_labels_for_unavailable_models")
    for entry in config.model_config_list.config:
        reason = check_model_name(entry.name)
        if reason:
            problems.append(problem(reason, "rename the model", "name"))
        if not (entry.base_path.startswith("/") or "://" in entry.base_path):
            problems.append(problem(f"base_path {entry.base_path!r} is not absolute",
                                    "use an absolute path (or a URI)", "base_path"))
        if entry.model_platform != "tensorflow":
            problems.append(problem(f"model_platform is {entry.model_platform!r}",
                                    'set model_platform: "tensorflow"', "model_platform"))
        loaded = _loaded_versions(entry)
        for version in loaded or ():
            reason = check_version(version)
            if reason:
                problems.append(problem(reason, "use positive version numbers",
                                        "model_version_policy"))
        for label, version in entry.version_labels.items():
            if not LABEL_NAME.match(label):
                problems.append(problem(f"label {label!r} must match [a-zA-Z0-9_]+",
                                        "rename the label", f"version_labels.{label}"))
            if loaded is not None and version not in loaded:
                problems.append(problem(
                    f"label {label!r} points at version {version}, which this config does not "
                    f"load (loads {sorted(loaded)})", "point the label at a loaded version",
                    f"version_labels.{label}"))
        if entry.version_labels and allow_unavailable != "true":
            problems.append(problem(
                "labels on a fresh server fail start-up until their versions are AVAILABLE",
                "emit --allow_version_labels_for_unavailable_models=true with labels",
                "version_labels"))
    return problems


def _loaded_versions(entry: Any) -> set[int] | None:
    policy = entry.model_version_policy
    if policy.WhichOneof("policy_choice") == "specific":
        return set(policy.specific.versions)
    return None  # latest/all: depends on the directory, checked at deploy time


def timeout_budget_us(slo_ms: float) -> int:
    """The longest batch_timeout_micros the toolkit allows under a latency SLO: a third of it
    (a request that waits the whole timeout must still have time to run and answer)."""
    return int(slo_ms * 1000 / 3)


def _wrapper(message: Any, field: str, default: int | None) -> int | None:
    return getattr(message, field).value if message.HasField(field) else default


def check_batching(params: Any, host: str, slo_ms: float) -> list[Problem]:
    """BatchingParameters as the server checks them, then the toolkit's latency rules.

    The server (TensorFlow's shared_batch_scheduler.h, TFServing's bundle_factory_util.cc):
    the load fails when max_batch_size is below 1, batch_timeout_micros is negative, the
    last allowed_batch_sizes entry is not max_batch_size, or, with
    enable_large_batch_splitting, max_execution_batch_size exceeds max_batch_size;
    start-up fails when num_batch_threads is below 1; max_enqueued_batches 0 is rewritten to
    1 (and fails with splitting). The toolkit also refuses max_enqueued_batches 0 (write what
    the server will do), sizes that do not increase (session_bundle_config.proto requires
    increasing entries; the server only pads each batch to the first entry that fits, so an
    entry after a larger one is never used), and a timeout above a third of the SLO."""
    def problem(message: str, fix: str, field: str) -> Problem:
        return Problem(message, fix, host=host, file=BATCHING_CONFIG, field=field)

    problems = []
    max_batch = _wrapper(params, "max_batch_size", DEFAULT_MAX_BATCH_SIZE) or 0
    if max_batch < 1:
        problems.append(problem(f"max_batch_size is {max_batch}; TFServing fails the load "
                                "(it must be positive)", "set it to 1 or more",
                                "max_batch_size"))
    splitting = bool(_wrapper(params, "enable_large_batch_splitting", 0))
    for field, reason in (("num_batch_threads", "TFServing fails at start-up"),
                          ("max_enqueued_batches",
                           "TFServing fails the load" if splitting else
                           "TFServing replaces 0 with 1 and fails the load below 0")):
        value = _wrapper(params, field, None)
        if value is not None and value < 1:
            problems.append(problem(f"{field} is {value}; {reason}",
                                    f"set {field} to 1 or more", field))
    timeout = _wrapper(params, "batch_timeout_micros", 0) or 0
    budget = timeout_budget_us(slo_ms)
    if timeout < 0:
        problems.append(problem(f"batch_timeout_micros is {timeout}; TFServing fails the load "
                                "(it must be non-negative)", "set it to 0 or more",
                                "batch_timeout_micros"))
    elif timeout > budget:
        problems.append(problem(
            f"batch_timeout_micros {timeout} exceeds a third of the {slo_ms:g} ms latency SLO "
            f"({budget} us): the tail waits about the whole timeout",
            f"lower batch_timeout_micros to at most {budget}, or raise max_batch_size instead",
            "batch_timeout_micros"))
    problems += _check_sizes(list(params.allowed_batch_sizes), max_batch, problem)
    execution = _wrapper(params, "max_execution_batch_size", None)
    if splitting and execution is not None and execution > max_batch:
        problems.append(problem(f"max_execution_batch_size {execution} > max_batch_size "
                                f"{max_batch} with enable_large_batch_splitting: TFServing "
                                "fails the load", "keep it at most max_batch_size",
                                "max_execution_batch_size"))
    return problems


def _check_sizes(sizes: list[int], max_batch: int, problem: Callable[[str, str, str], Problem]
                 ) -> list[Problem]:
    if not sizes:
        return []
    problems = []
    if any(b <= a for a, b in itertools.pairwise(sizes)) or sizes[0] < 1:
        problems.append(problem(f"allowed_batch_sizes {sizes} are not strictly increasing",
                                "list positive sizes in increasing order (the server pads a "
                                "batch to the first entry that fits)", "allowed_batch_sizes"))
    if sizes[-1] != max_batch:
        problems.append(problem(
            f"the last allowed_batch_sizes entry {sizes[-1]} must equal max_batch_size "
            f"{max_batch} (TFServing fails the load otherwise)",
            f"end allowed_batch_sizes with {max_batch}", "allowed_batch_sizes"))
    return problems


def check_monitoring(config: Any, host: str) -> list[Problem]:
    """MonitoringConfig rules: enabled, and a path outside the /v1/ API."""
    prometheus = config.prometheus_config
    path = prometheus.path or "/monitoring/prometheus/metrics"
    problems = []
    if not prometheus.enable:
        problems.append(Problem("Prometheus metrics are disabled; the deploy guard reads them",
                                "set prometheus_config { enable: true }", host=host,
                                file=MONITORING_CONFIG, field="prometheus_config.enable"))
    if not path.startswith("/") or path.lower().startswith("/v1/"):
        problems.append(Problem(f"metrics path {path!r} must be absolute and outside /v1/",
                                "use /monitoring/prometheus/metrics", host=host,
                                file=MONITORING_CONFIG, field="prometheus_config.path"))
    return problems


def _flag_value(flags: Sequence[FlagLine], name: str) -> str | None:
    values = [f.value for f in flags if f.name == name]
    return values[-1] if values else None  # TFServing: the last one wins


def check_flags(read: FlagsFile, render: HostRender) -> list[Problem]:
    """Flags TFServing would ignore, reject, or not know in the target release."""
    host = render.host.name
    version_text = render.host.vars.tfserving_version
    flags = read.flags

    def problem(message: str, fix: str, line: int | None = None) -> Problem:
        return Problem(message, fix, host=host, file=f"{FLAGS}:{line}" if line else FLAGS)

    if read.version is None:
        return [Problem(f"tfserving_version {version_text!r} is not a release number",
                        "set tfserving_version like '2.21.0'", host=host,
                        field="tfserving_version")]
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for flag in flags:
        if flag in read.unknown:
            problems.append(problem(
                f"--{flag.name} is unknown to TFServing {version_text}, which prints it and "
                "starts anyway (the setting is silently lost)",
                "remove the flag or raise tfserving_version", flag.line))
        if flag.name in seen:
            problems.append(problem(f"--{flag.name} repeats (line {seen[flag.name]})",
                                    "give each flag once", flag.line))
        seen[flag.name] = flag.line
    value = {f.name: f.value for f in flags}.get
    if value("model_config_file") and (value("model_name") or value("model_base_path")):
        problems.append(problem("--model_name/--model_base_path are silently ignored with "
                                "--model_config_file", "drop them; the model config names "
                                "the model"))
    if value("batching_parameters_file") and value("enable_batching") != "true":
        problems.append(problem("--batching_parameters_file without --enable_batching=true "
                                "fails TFServing's start-up", "add --enable_batching=true"))
    set_threads = [n for n in PARALLELISM_FLAGS if value(n) not in (None, "0")]
    if len(set_threads) == 3:
        problems.append(problem("all three parallelism flags set: TFServing refuses to start",
                                "set intra/inter op parallelism, or session parallelism"))
    elif "tensorflow_session_parallelism" in set_threads and len(set_threads) == 2:
        problems.append(problem("--tensorflow_session_parallelism is ignored when intra/inter "
                                "op parallelism is set", "drop one of them"))
    problems += _check_fraction_flag(value("per_process_gpu_memory_fraction"), render, problem)
    problems += _check_files(flags, render, problem)
    return problems


def _check_fraction_flag(text: str | None, render: HostRender,
                         problem: Callable[..., Problem]) -> list[Problem]:
    if render.gpu is None:
        return []
    if text is None:
        return [problem("no --per_process_gpu_memory_fraction on a GPU host: fraction 0 takes "
                        "nearly all GPU memory and a second release cannot start",
                        "emit an explicit fraction (templates/tfserving.flags.j2)")]
    try:
        fraction = float(text)
    except ValueError:
        return [problem(f"--per_process_gpu_memory_fraction={text} is not a number",
                        "write a decimal fraction such as 0.35")]
    if not 0 < fraction <= 1:
        return [problem(f"--per_process_gpu_memory_fraction={text} is outside (0, 1]",
                        "use an explicit fraction below 1")]
    return []


def _check_files(flags: Sequence[FlagLine], render: HostRender,
                 problem: Callable[..., Problem]) -> list[Problem]:
    shipped = {f"{CONTAINER_CONFIG_DIR}/{f.name}" for f in render.files}
    return [problem(f"--{f.name}={f.value} names a file the release does not ship",
                    f"point it at one of {sorted(shipped)}", f.line)
            for f in flags if f.name.endswith("_file") and f.value and f.value not in shipped]


def check_port_clashes(inventory: Inventory) -> list[Problem]:
    """Models the inventory places on the same host must not share a port, and every port
    shifted by a model's ``port_offset`` must exist (``build_inventory`` runs this too)."""
    return placement_problems(inventory)
