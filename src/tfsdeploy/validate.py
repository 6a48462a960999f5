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
from tensorflow_serving.config import model_server_config_pb2

from tfsdeploy import tfproto
from tfsdeploy.catalog import DTYPES, Model
from tfsdeploy.errors import Problem
from tfsdeploy.flags import (
    PARALLELISM_FLAGS,
    FlagLine,
    known_in,
    parse_flags_file,
    parse_version,
)
from tfsdeploy.gpu import check_gpu_plan
from tfsdeploy.render import (
    BATCHING_CONFIG,
    CONTAINER_CONFIG_DIR,
    FLAGS,
    MODEL_CONFIG,
    MONITORING_CONFIG,
    HostRender,
)

MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9_]+$")
DEFAULT_MAX_BATCH_SIZE = 1000  # TFServing's default when max_batch_size is unset


def check_model_name(name: str) -> str | None:
    """Why ``name`` cannot be a model name (it becomes a directory on every host), or None."""
    if not MODEL_NAME.match(name):
        return f"model name {name!r} must match [A-Za-z0-9_.-]+"
    if name in {".", ".."} or ".." in name:
        return f"model name {name!r} would escape its directory"
    return None


def check_version(version: int) -> str | None:
    """Why ``version`` is not a TFServing version number, or None."""
    if isinstance(version, bool) or not isinstance(version, int) or version <= 0:
        return f"version {version!r} must be a positive integer (a numeric directory name)"
    return None


def validate_model(model: Model, inventory_file: str) -> list[Problem]:
    """Rules on a catalog entry, before rendering."""
    where: dict[str, Any] = {"file": inventory_file}
    problems: list[Problem] = []

    def add(message: str, fix: str, field: str) -> None:
        problems.append(Problem(message, fix, field=f"models.{model.name}.{field}", **where))

    reason = check_model_name(model.name)
    if reason:
        add(reason, "rename the model: letters, digits, '_', '.' and '-' only", "name")
    if model.memory_mib <= 0:
        add(f"memory_mib is {model.memory_mib}", "set the measured GPU footprint in MiB",
            "memory_mib")
    if model.latency_slo_ms <= 0:
        add(f"latency_slo_ms is {model.latency_slo_ms}", "set the P99 latency SLO in ms",
            "latency_slo_ms")
    for kind, tensors in (("inputs", model.signature.inputs),
                          ("outputs", model.signature.outputs)):
        for tensor_name, spec in tensors.items():
            if spec.dtype not in DTYPES:
                add(f"{kind} {tensor_name!r} has dtype {spec.dtype!r}",
                    f"use a TensorFlow DataType name: {', '.join(sorted(DTYPES))}",
                    f"signature.{kind}.{tensor_name}.dtype")
    for label, target in model.labels.items():
        if not LABEL_NAME.match(label):
            add(f"label {label!r} must match [a-zA-Z0-9_]+ (TFServing's REST label paths)",
                "rename the label", f"labels.{label}")
        if target != "release" and check_version(target) is not None:  # type: ignore[arg-type]
            add(f"label {label!r} points at {target!r}",
                "point it at a positive version number or 'release'", f"labels.{label}")
    problems += _check_serial(model, add)
    return problems


def _check_serial(model: Model, add: Callable[[str, str, str], None]) -> list[Problem]:
    rollout = model.rollout
    for step in rollout.serial:
        ok = (isinstance(step, int) and not isinstance(step, bool) and step > 0) or (
            isinstance(step, str) and re.fullmatch(r"\d+(\.\d+)?%", step)
            and 0 < float(step[:-1]) <= 100)
        if not ok:
            add(f"serial step {step!r} is neither a positive count nor a percentage in (0, 100]",
                "write e.g. serial=(1, '25%', '100%')", "rollout.serial")
    if not 0 <= rollout.max_fail_percentage <= 100:
        add(f"max_fail_percentage {rollout.max_fail_percentage} is outside [0, 100]",
            "set a percentage of hosts, e.g. 0", "rollout.max_fail_percentage")
    if rollout.keep_releases < 2:
        add(f"keep_releases {rollout.keep_releases} cannot hold the previous release",
            "keep at least 2 releases so that rollback has somewhere to go",
            "rollout.keep_releases")
    return []


def validate_render(render: HostRender, inventory_file: str) -> list[Problem]:
    """Parse each rendered file as TFServing would, then check the cross-file rules."""
    host = render.host.name
    problems: list[Problem] = []
    parsed: dict[str, Message] = {}
    for name, message_type in ((MODEL_CONFIG, model_server_config_pb2.ModelServerConfig),
                               (BATCHING_CONFIG, tfproto.BatchingParameters),
                               (MONITORING_CONFIG, tfproto.MonitoringConfig)):
        message, problem = parse_text_proto(render.file(name).text, message_type, host, name)
        if problem:
            problems.append(problem)
        else:
            parsed[name] = message
    flags, syntax = parse_flags_file(render.file(FLAGS).text)
    problems += [Problem(reason, "write one --name=value per line", host=host,
                         file=f"{FLAGS}:{line}") for line, reason in syntax]
    if MODEL_CONFIG in parsed:
        problems += check_model_config(parsed[MODEL_CONFIG], host, flags)
    if BATCHING_CONFIG in parsed:
        problems += check_batching(parsed[BATCHING_CONFIG], host, render.model.latency_slo_ms)
    if MONITORING_CONFIG in parsed:
        problems += check_monitoring(parsed[MONITORING_CONFIG], host)
    problems += check_flags(flags, render)
    if render.gpu:
        problems += check_gpu_plan(render.gpu, inventory_file)
    return problems


def parse_text_proto(text: str, message_type: type[Message], host: str, name: str
                     ) -> tuple[Message, Problem | None]:
    """Parse like TextFormat::ParseFromString: unknown fields, JSON and bare wrappers fail."""
    message = message_type()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        line = f":{exc.GetLine()}" if exc.GetLine() else ""
        return message, Problem(
            f"TFServing would reject this file ({message_type.DESCRIPTOR.name}): {exc}",
            fix="write protobuf text format (not JSON); wrapper fields need "
                "`name { value: N }`; only fields of " + message_type.DESCRIPTOR.full_name,
            host=host, file=name + line)
    return message, None


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


def _wrapper(message: Any, field: str, default: int | None) -> int | None:
    return getattr(message, field).value if message.HasField(field) else default


def check_batching(params: Any, host: str, slo_ms: float) -> list[Problem]:
    """BatchingParameters rules from bundle_factory_util.cc and the batching guide."""
    def problem(message: str, fix: str, field: str) -> Problem:
        return Problem(message, fix, host=host, file=BATCHING_CONFIG, field=field)

    problems = []
    max_batch = _wrapper(params, "max_batch_size", DEFAULT_MAX_BATCH_SIZE) or 0
    if max_batch < 1:
        problems.append(problem(f"max_batch_size is {max_batch}", "set it to 1 or more",
                                "max_batch_size"))
    for field in ("num_batch_threads", "max_enqueued_batches"):
        value = _wrapper(params, field, None)
        if value is not None and value < 1:
            problems.append(problem(f"{field} is {value}; TFServing needs at least 1",
                                    f"set {field} to 1 or more", field))
    timeout = _wrapper(params, "batch_timeout_micros", 0) or 0
    budget = int(slo_ms * 1000 / 3)
    if timeout > budget:
        problems.append(problem(
            f"batch_timeout_micros {timeout} exceeds a third of the {slo_ms} ms latency SLO "
            f"({budget} us): the tail waits about the whole timeout",
            f"lower batch_timeout_micros to at most {budget}, or raise max_batch_size instead",
            "batch_timeout_micros"))
    sizes = list(params.allowed_batch_sizes)
    if sizes:
        if any(b <= a for a, b in itertools.pairwise(sizes)) or sizes[0] < 1:
            problems.append(problem(f"allowed_batch_sizes {sizes} are not strictly increasing",
                                    "list positive sizes in increasing order",
                                    "allowed_batch_sizes"))
        if sizes[-1] != max_batch:
            problems.append(problem(
                f"the last allowed_batch_sizes entry {sizes[-1]} must equal max_batch_size "
                f"{max_batch} (TFServing fails the load otherwise)",
                f"end allowed_batch_sizes with {max_batch}", "allowed_batch_sizes"))
    execution = _wrapper(params, "max_execution_batch_size", None)
    if execution is not None and execution > max_batch:
        problems.append(problem(f"max_execution_batch_size {execution} > max_batch_size "
                                f"{max_batch}", "keep it at most max_batch_size",
                                "max_execution_batch_size"))
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


def check_flags(flags: Sequence[FlagLine], render: HostRender) -> list[Problem]:
    """Flags TFServing would ignore, reject, or not know in the target release."""
    host = render.host.name
    version_text = render.host.vars.tfserving_version

    def problem(message: str, fix: str, line: int | None = None) -> Problem:
        return Problem(message, fix, host=host, file=f"{FLAGS}:{line}" if line else FLAGS)

    try:
        version = parse_version(version_text)
    except ValueError:
        return [Problem(f"tfserving_version {version_text!r} is not a release number",
                        "set tfserving_version like '2.21.0'", host=host,
                        field="tfserving_version")]
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for flag in flags:
        if not known_in(flag.name, version):
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
    problems += _check_slot_ports(render, problem)
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


def _check_slot_ports(render: HostRender, problem: Callable[..., Problem]) -> list[Problem]:
    variables = render.host.vars
    problems = []
    stable = {variables.grpc_port, variables.rest_port}
    used: set[int] = set()
    for slot, (grpc, rest) in variables.slot_ports.items():
        if grpc == rest:
            problems.append(problem(f"slot {slot}: --port and --rest_api_port are both {grpc}; "
                                    "TFServing then serves no REST (and no metrics)",
                                    "give the slot two different ports"))
        if {grpc, rest} & (stable | used):
            problems.append(problem(f"slot {slot} ports {grpc}/{rest} clash with the stable "
                                    "ports or another slot", "give each slot its own ports"))
        used |= {grpc, rest}
    if len(variables.slot_ports) != 2:
        problems.append(problem(f"slot_ports defines {len(variables.slot_ports)} slots",
                                "define exactly two slots (blue and green)"))
    return problems


def check_port_clashes(inventory: Any) -> list[Problem]:
    """Models the inventory places on the same host must not share a port."""
    from tfsdeploy.layout import model_ports
    from tfsdeploy.render import placements

    placed = placements(inventory)
    problems = []
    for host in inventory.hosts:
        owners: dict[int, str] = {}
        for name, on in sorted(placed.items()):
            if host.name not in on:
                continue
            ports = model_ports(host, inventory.models[name])
            used = {ports.grpc, ports.rest, ports.admin,
                    *(p for pair in ports.slots.values() for p in pair)}
            for port in sorted(used):
                if port in owners:
                    problems.append(Problem(
                        f"models {owners[port]!r} and {name!r} both use port {port}",
                        fix=f"give one of them a port_offset (e.g. port_offset=100 on {name!r})",
                        host=host.name, file=inventory.path, field=f"models.{name}.port_offset"))
                    break
                owners[port] = name
    return problems
