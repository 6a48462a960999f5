"""Command-line flags of ``tensorflow_model_server`` and TF's parsing rules.

Flag names, types, defaults and order follow model_servers/main.cc and server.h; the parser
follows tensorflow/core/util/command_line_flags.cc:
- only ``--name=value`` sets a non-bool flag (``--port 9000`` leaves both words unknown);
- bools take ``--f``, ``--f=true`` or ``--f=false``; anything else after the name is an error
  (so ``--enable_batching_x`` is a bad value for ``enable_batching``, as in TF);
- flags are tried in declaration order, the last occurrence wins, everything after ``--`` is
  left unparsed;
- a bad value makes the whole parse fail (usage, exit 255) after all arguments are seen;
  ``--help`` as the first leftover argument also fails the parse.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any


def _schedulable_cpus() -> int:
    """port::NumSchedulableCPUs(): the CPUs in this process's affinity mask (cpusets count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


_NCPU = _schedulable_cpus()

_INT_RE = re.compile(r"\s*[+-]?\d+")
_FLOAT_RE = re.compile(
    r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)

INT32 = "int32"
INT64 = "int64"
BOOL = "bool"
STRING = "string"
FLOAT = "float"


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag: name, type, default and help text (as printed in the usage)."""

    name: str
    kind: str
    default: Any
    help: str


FLAGS: tuple[Flag, ...] = (
    Flag("port", INT32, 8500, "TCP port to listen on for gRPC/HTTP API. Disabled if port set "
         "to zero."),
    Flag("grpc_socket_path", STRING, "", "If non-empty, listen to a UNIX socket for gRPC API "
         "on the given path. Can be either relative or absolute path."),
    Flag("rest_api_port", INT32, 0, "Port to listen on for HTTP/REST API. If set to zero "
         "HTTP/REST API will not be exported. This port must be different than the one "
         "specified in --port."),
    Flag("rest_api_num_threads", INT32, 4 * _NCPU, "Number of threads for HTTP/REST API "
         "processing. If not set, will be auto set based on number of CPUs."),
    Flag("rest_api_timeout_in_ms", INT32, 30000, "Timeout for HTTP/REST API calls."),
    Flag("rest_api_enable_cors_support", BOOL, False, "Enable CORS headers in response"),
    Flag("enable_batching", BOOL, False, "enable batching"),
    Flag("allow_version_labels_for_unavailable_models", BOOL, False, "If true, allows "
         "assigning unused version labels to models that are not available yet."),
    Flag("batching_parameters_file", STRING, "", "If non-empty, read an ascii "
         "BatchingParameters protobuf from the supplied file name and use the contained "
         "values instead of the defaults."),
    Flag("enable_per_model_batching_parameters", BOOL, False, "Enables model specific "
         "batching params like batch sizes, timeouts, batching feature flags to be read from "
         "`batching_params.pbtxt` file present in SavedModel dir of the model."),
    Flag("model_config_file", STRING, "", "If non-empty, read an ascii ModelServerConfig "
         "protobuf from the supplied file name, and serve the models in that file. (If used, "
         "--model_name, --model_base_path are ignored.)"),
    Flag("model_config_file_poll_wait_seconds", INT32, 0, "Interval in seconds between each "
         "poll of the filesystemfor model_config_file. If unset or set to zero, poll will be "
         "done exactly once and not periodically."),
    Flag("model_name", STRING, "default", "name of model (ignored if --model_config_file flag "
         "is set)"),
    Flag("model_base_path", STRING, "", "path to export (ignored if --model_config_file flag "
         "is set, otherwise required)"),
    Flag("num_load_threads", INT32, 0, "The number of threads in the thread-pool used to load "
         "servables. If set as 0, we don't use a thread-pool, and servable loads are performed "
         "serially in the manager's main work loop. Default: 0"),
    Flag("num_unload_threads", INT32, 0, "The number of threads in the thread-pool used to "
         "unload servables. Default: 0"),
    Flag("max_num_load_retries", INT32, 5, "maximum number of times it retries loading a model "
         "after the first failure, before giving up. If set to 0, a load is attempted only "
         "once. Default: 5"),
    Flag("load_retry_interval_micros", INT64, 60_000_000, "The interval, in microseconds, "
         "between each servable load retry. If set negative, it doesn't wait. Default: 1 "
         "minute"),
    Flag("file_system_poll_wait_seconds", INT32, 1, "Interval in seconds between each poll of "
         "the filesystem for new model version. If set to zero poll will be exactly done once "
         "and not periodically. Negative values are reserved for testing purposes only."),
    Flag("flush_filesystem_caches", BOOL, True, "If true (the default), filesystem caches will "
         "be flushed after the initial load of all servables."),
    Flag("tensorflow_session_parallelism", INT64, 0, "Number of threads to use for running a "
         "Tensorflow session. Auto-configured by default."),
    Flag("tensorflow_session_config_file", STRING, "", "If non-empty, read an ascii TensorFlow "
         "Session ConfigProto protobuf from the supplied file name."),
    Flag("tensorflow_intra_op_parallelism", INT64, 0, "Number of threads to use to parallelize "
         "the executionof an individual op. Auto-configured by default."),
    Flag("tensorflow_inter_op_parallelism", INT64, 0, "Controls the number of operators that "
         "can be executed simultaneously. Auto-configured by default."),
    Flag("use_alts_credentials", BOOL, False, "Use Google ALTS credentials"),
    Flag("ssl_config_file", STRING, "", "If non-empty, read an ascii SSLConfig protobuf from "
         "the supplied file name and set up a secure gRPC channel"),
    Flag("platform_config_file", STRING, "", "If non-empty, read an ascii PlatformConfigMap "
         "protobuf from the supplied file name, and use that platform config instead of the "
         "Tensorflow platform. (If used, --enable_batching is ignored.)"),
    Flag("per_process_gpu_memory_fraction", FLOAT, 0.0, "Fraction that each process occupies "
         "of the GPU memory space the value is between 0.0 and 1.0 (with 0.0 as the default) "
         "If 1.0, the server will allocate all the memory when the server starts, If 0.0, "
         "Tensorflow will automatically select a value."),
    Flag("saved_model_tags", STRING, "serve", "Comma-separated set of tags corresponding to "
         "the meta graph def to load from SavedModel."),
    Flag("grpc_channel_arguments", STRING, "", "A comma separated list of arguments to be "
         "passed to the grpc server. (e.g. grpc.max_connection_age_ms=2000)"),
    Flag("grpc_max_threads", INT32, 4 * _NCPU, "Max grpc server threads to handle grpc "
         "messages."),
    Flag("enable_model_warmup", BOOL, True, "Enables model warmup, which triggers lazy "
         "initializations (such as TF optimizations) at load time, to reduce first request "
         "latency."),
    Flag("num_request_iterations_for_warmup", INT32, 0, "Number of times a request is "
         "iterated during warmup replay. This value is used only if > 0."),
    Flag("version", BOOL, False, "Display version"),
    Flag("monitoring_config_file", STRING, "", "If non-empty, read an ascii MonitoringConfig "
         "protobuf from the supplied file name"),
    Flag("remove_unused_fields_from_bundle_metagraph", BOOL, True, "Removes unused fields from "
         "MetaGraphDef proto message to save memory."),
    Flag("prefer_tflite_model", BOOL, False, "EXPERIMENTAL; CAN BE REMOVED ANYTIME! Prefer "
         "TensorFlow Lite model from `model.tflite` file in SavedModel directory."),
    Flag("num_tflite_pools", INT32, _NCPU, "EXPERIMENTAL; CAN BE REMOVED ANYTIME! Number of "
         "TFLite interpreters in an interpreter pool of TfLiteSession."),
    Flag("num_tflite_interpreters_per_pool", INT32, 1, "EXPERIMENTAL; CAN BE REMOVED ANYTIME! "
         "Number of TFLite interpreters in an interpreter pool of TfLiteSession."),
    Flag("enable_signature_method_name_check", BOOL, False, "Enable method_name check for "
         "SignatureDef. Disable this if serving native TF2 regression/classification models."),
    Flag("xla_cpu_compilation_enabled", BOOL, False, "EXPERIMENTAL; CAN BE REMOVED ANYTIME! "
         "Enable XLA:CPU JIT (default is disabled)."),
    Flag("xla_gpu_compilation_enabled", BOOL, False, "EXPERIMENTAL; CAN BE REMOVED ANYTIME! "
         "Enable both XLA:CPU JIT and XLA:GPU JIT (default is disabled)."),
    Flag("enable_profiler", BOOL, True, "Enable profiler service."),
    Flag("thread_pool_factory_config_file", STRING, "", "If non-empty, read an ascii "
         "ThreadPoolConfig protobuf from the supplied file name."),
    Flag("mixed_precision", STRING, "", "specify mixed_precision mode"),
    Flag("skip_initialize_tpu", BOOL, False, "Whether to skip auto initializing TPU."),
    Flag("enable_grpc_healthcheck_service", BOOL, False, "Enable the standard gRPC healthcheck "
         "service."),
    Flag("enable_serialization_as_tensor_content", BOOL, False, "Enable serialization of "
         "predict response as tensor content."),
)


@dataclasses.dataclass
class ParseResult:
    """What the parse produced: values by flag name, leftover arguments, success."""

    values: dict[str, Any]
    unknown: list[str]
    ok: bool
    errors: list[str]


def defaults() -> dict[str, Any]:
    """Every flag's default value, by name."""
    return {flag.name: flag.default for flag in FLAGS}


def _parse_value(flag: Flag, rest: str) -> tuple[bool, Any]:
    """Parse what follows ``--name`` for ``flag``: (matched, value or _BAD)."""
    if flag.kind == BOOL:
        if rest == "":
            return True, True
        if rest == "=true":
            return True, True
        if rest == "=false":
            return True, False
        return True, _BAD
    if not rest.startswith("="):
        return False, None
    text = rest[1:]
    if flag.kind in (INT32, INT64):
        if not _INT_RE.fullmatch(text):
            return True, _BAD
        value = int(text)
        bits = 31 if flag.kind == INT32 else 63
        if not -(2**bits) <= value < 2**bits:
            return True, _BAD
        return True, value
    if flag.kind == FLOAT:
        if not _FLOAT_RE.fullmatch(text):
            return True, _BAD
        return True, float(text)
    return True, text


_BAD = object()


def parse(argv: list[str]) -> ParseResult:
    """Parse ``argv`` (without the program name) like TF's ``Flags::Parse``."""
    values = defaults()
    unknown: list[str] = []
    errors: list[str] = []
    ok = True
    for index, arg in enumerate(argv):
        if arg == "--":
            unknown.extend(argv[index:])
            break
        matched = False
        for flag in FLAGS:
            prefix = "--" + flag.name
            if not arg.startswith(prefix):
                continue
            matched, value = _parse_value(flag, arg[len(prefix):])
            if not matched:
                continue
            if value is _BAD:
                ok = False
                shown = arg[len(prefix):]
                if flag.kind != BOOL:
                    shown = shown[1:]
                errors.append(f"Couldn't interpret value {shown} for flag {flag.name}.")
            else:
                values[flag.name] = value
            break
        if not matched:
            unknown.append(arg)
    if unknown and unknown[0] == "--help":
        ok = False
    return ParseResult(values=values, unknown=unknown, ok=ok, errors=errors)


def _display_default(flag: Flag) -> str:
    if flag.kind == BOOL:
        return "true" if flag.default else "false"
    if flag.kind == STRING:
        return f'"{flag.default}"'
    if flag.kind == FLOAT:
        return f"{flag.default:f}"
    return str(flag.default)


def usage(program: str) -> str:
    """The usage text, laid out like TF's ``Flags::Usage``."""
    lines = [f"usage: {program}", "Flags:"]
    for flag in FLAGS:
        flag_string = f"--{flag.name}={_display_default(flag)}"
        lines.append(f"\t{flag_string:<33}\t{flag.kind}\t{flag.help}")
    return "\n".join(lines) + "\n"
