"""TFServing's command-line flags: which release knows which flag, and how to read a flags file.

TFServing prints unknown flags and starts anyway (a typo is silent), so the toolkit never emits a
flag the target release does not know. First releases below were read from the history of
tensorflow_serving/model_servers/main.cc (the tag that first contains each flag).
"""

from __future__ import annotations

from dataclasses import dataclass

# flag name -> first TFServing release that accepts it
FLAG_SINCE: dict[str, tuple[int, ...]] = {
    "port": (0, 5, 0), "grpc_socket_path": (1, 13, 0), "rest_api_port": (1, 9, 0),
    "rest_api_num_threads": (1, 9, 0), "rest_api_timeout_in_ms": (1, 9, 0),
    "rest_api_enable_cors_support": (2, 5, 0), "enable_batching": (0, 5, 0),
    "batching_parameters_file": (0, 6, 0), "enable_per_model_batching_parameters": (2, 11, 0),
    "model_config_file": (0, 6, 0), "model_config_file_poll_wait_seconds": (1, 15, 0),
    "model_name": (0, 5, 0), "model_base_path": (0, 5, 0), "num_load_threads": (2, 5, 0),
    "num_unload_threads": (2, 5, 0), "max_num_load_retries": (1, 12, 0),
    "load_retry_interval_micros": (1, 12, 0), "file_system_poll_wait_seconds": (0, 5, 0),
    "flush_filesystem_caches": (1, 5, 0), "tensorflow_session_parallelism": (0, 5, 0),
    "tensorflow_intra_op_parallelism": (1, 13, 0), "tensorflow_inter_op_parallelism": (1, 13, 0),
    "tensorflow_session_config_file": (2, 8, 0), "use_alts_credentials": (2, 6, 0),
    "ssl_config_file": (1, 10, 0), "platform_config_file": (0, 5, 0),
    "per_process_gpu_memory_fraction": (1, 5, 0), "saved_model_tags": (1, 6, 0),
    "grpc_channel_arguments": (1, 6, 0), "grpc_max_threads": (2, 5, 0),
    "enable_model_warmup": (1, 9, 0), "num_request_iterations_for_warmup": (2, 8, 0),
    "monitoring_config_file": (1, 11, 0), "allow_version_labels_for_unavailable_models": (1, 15, 0),
    "remove_unused_fields_from_bundle_metagraph": (1, 15, 0),
    "enable_signature_method_name_check": (2, 4, 0), "prefer_tflite_model": (2, 3, 0),
    "num_tflite_pools": (2, 5, 0), "num_tflite_interpreters_per_pool": (2, 5, 0),
    "enable_profiler": (2, 5, 0), "thread_pool_factory_config_file": (2, 6, 0),
    "xla_cpu_compilation_enabled": (2, 5, 0), "xla_gpu_compilation_enabled": (2, 18, 0),
    "mixed_precision": (2, 15, 0), "skip_initialize_tpu": (2, 15, 0),
    "enable_grpc_healthcheck_service": (2, 15, 0),
    "enable_serialization_as_tensor_content": (2, 19, 0),
}
BOOL_FLAGS = frozenset({
    "enable_batching", "enable_per_model_batching_parameters", "flush_filesystem_caches",
    "use_alts_credentials", "enable_model_warmup", "allow_version_labels_for_unavailable_models",
    "remove_unused_fields_from_bundle_metagraph", "enable_signature_method_name_check",
    "prefer_tflite_model", "enable_profiler", "xla_cpu_compilation_enabled",
    "xla_gpu_compilation_enabled", "skip_initialize_tpu", "enable_grpc_healthcheck_service",
    "rest_api_enable_cors_support", "enable_serialization_as_tensor_content",
})
PARALLELISM_FLAGS = ("tensorflow_session_parallelism", "tensorflow_intra_op_parallelism",
                     "tensorflow_inter_op_parallelism")


def parse_version(text: str) -> tuple[int, ...]:
    """'2.21.0' or '2.21.0-gpu' -> (2, 21, 0); raises ValueError on anything else."""
    core = text.split("-", 1)[0]
    parts = tuple(int(p) for p in core.split("."))
    if len(parts) < 2:
        raise ValueError(text)
    return parts


def known_in(flag: str, version: tuple[int, ...]) -> bool:
    """Whether TFServing ``version`` accepts ``--flag``."""
    since = FLAG_SINCE.get(flag)
    return since is not None and version >= since


@dataclass(frozen=True)
class FlagLine:
    """One ``--name=value`` line of a flags file."""

    line: int
    name: str
    value: str


def parse_flags_file(text: str) -> tuple[list[FlagLine], list[tuple[int, str]]]:
    """Split a flags file into flags and (line, reason) syntax errors.

    TFServing reads only ``--name=value`` (``--port 9000`` does not set the flag) and a bare
    ``--flag`` for booleans; blank lines and ``#`` comments are ours, for people.
    """
    flags: list[FlagLine] = []
    errors: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("--") or " " in line:
            errors.append((number, f"{line!r} is not of the form --name=value"))
            continue
        name, sep, value = line[2:].partition("=")
        if not sep and name not in BOOL_FLAGS:
            errors.append((number, f"{line!r} has no '=value' (TFServing ignores it)"))
            continue
        flags.append(FlagLine(number, name, value if sep else "true"))
    return flags, errors
