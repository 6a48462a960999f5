"""Flags, start-up validation, config-file rejection and exit codes (no shared server)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import time

import modelgen
import pytest
from emulator_support import free_port, port_open, predict_request, status_of, stubs, write

FAILED = "Failed to start server. Error: "


def run_to_exit(emulator, args: list[str]) -> tuple[int, str]:
    server = emulator(args)
    return server.wait_exit(), server.output()


def test_version_exits_zero(emulator) -> None:
    code, out = run_to_exit(emulator, ["--version"])
    assert code == 0
    assert "TensorFlow ModelServer: 2.21.0" in out
    assert "TensorFlow Library: " in out


@pytest.mark.parametrize("flag", ["--port=abc", "--enable_batching=1", "--rest_api_port=80x",
                                  "--per_process_gpu_memory_fraction=half", "--help"])
def test_bad_value_or_help_prints_usage_and_exits_255(emulator, flag: str) -> None:
    code, out = run_to_exit(emulator, ["--model_base_path=/nonexistent", flag])
    assert code == 255
    assert "usage: tensorflow_model_server" in out
    assert "--enable_batching=false" in out and "--port=8500" in out


def test_bad_value_is_reported_with_tf_message(emulator) -> None:
    _code, out = run_to_exit(emulator, ["--port=12x"])
    assert "Couldn't interpret value 12x for flag port." in out


@pytest.mark.parametrize(("args", "message"), [
    ([], "INVALID_ARGUMENT: Both server_options.model_base_path and "
         "server_options.model_config_file are empty!"),
    # `--model_base_path /x` is two unknown words, so the base path stays empty
    (["--model_base_path", "/models/x"], "server_options.model_config_file are empty!"),
    (["--port=0", "--model_base_path=/m"], "At least one of server_options.grpc_port or "
                                           "server_options.grpc_socket_path must be set."),
    (["--model_base_path=/m", "--batching_parameters_file=/b.txt"],
     "INVALID_ARGUMENT: server_options.batching_parameters_file is set without setting "
     "server_options.enable_batching to true."),
    (["--model_base_path=/m", "--tensorflow_intra_op_parallelism=1",
      "--tensorflow_inter_op_parallelism=1", "--tensorflow_session_parallelism=1"],
     "You cannot configure all."),
    (["--model_config_file=/does/not/exist.config"], "NOT_FOUND: /does/not/exist.config"),
])
def test_start_up_validation_errors(emulator, args: list[str], message: str) -> None:
    code, out = run_to_exit(emulator, args)
    assert code == 255
    assert FAILED in out
    assert message in out


@pytest.mark.parametrize(("name", "text"), [
    ("json.config", '{"model_config_list": {"config": [{"name": "m"}]}}'),
    ("unknown.config", 'model_config_list { config { name: "m" base_path: "/m" '
                       'model_platform: "tensorflow" no_such_field: 1 } }'),
])
def test_model_config_must_be_text_proto(emulator, tmp_path: pathlib.Path, name: str,
                                         text: str) -> None:
    path = write(tmp_path / name, text)
    code, out = run_to_exit(emulator, [f"--model_config_file={path}"])
    assert code == 255
    assert f"{FAILED}INVALID_ARGUMENT: Invalid protobuf file: '{path}'" in out


@pytest.mark.parametrize("text", ["max_batch_size: 8", '{"max_batch_size": 8}',
                                  "max_batch_size { value: 8 } bogus: 1"])
def test_batching_file_must_be_text_proto_with_wrappers(emulator, tmp_path: pathlib.Path,
                                                        text: str) -> None:
    path = write(tmp_path / "batching.txt", text)
    code, out = run_to_exit(emulator, ["--model_base_path=/m", "--enable_batching",
                                       f"--batching_parameters_file={path}"])
    assert code == 255
    assert f"Invalid protobuf file: '{path}'" in out


def test_model_config_file_makes_name_and_base_path_ignored(emulator, tmp_path) -> None:
    # An empty ModelServerConfig is accepted; the bogus base path is ignored entirely.
    config = write(tmp_path / "empty.config", "")
    port = free_port()
    server = emulator([f"--port={port}", "--model_base_path=relative/ignored",
                       f"--model_config_file={config}"])
    server.wait_port(port)
    assert "Taking no action for empty config." in server.output()


def test_labels_on_fresh_server_fail_without_allow_flag(emulator, tmp_path, sources) -> None:
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    config = write(tmp_path / "m.config", f'model_config_list {{ config {{ name: "m" '
                   f'base_path: "{base}" model_platform: "tensorflow" '
                   'version_labels { key: "stable" value: 1 } } }')
    code, out = run_to_exit(emulator, [f"--port={free_port()}", f"--model_config_file={config}"])
    assert code == 255
    assert (f"{FAILED}FAILED_PRECONDITION: Request to assign label to version 1 of model m, "
            "which is not currently available for inference") in out


def test_version_failing_all_retries_stops_start_up(emulator, tmp_path, sources) -> None:
    base = tmp_path / "bad"
    modelgen.copy_version(sources["corrupt"], base, 1)
    code, out = run_to_exit(emulator, [f"--port={free_port()}", f"--model_base_path={base}",
                                       "--model_name=bad", "--max_num_load_retries=1",
                                       "--load_retry_interval_micros=10000"])
    assert code == 255
    assert ("UNKNOWN: 1 servable(s) did not become available: "
            "{{{name: bad version: 1} due to error: DATA_LOSS:") in out
    assert "Retrying of Loading servable: {name: bad version: 1} retry: 1" in out


def test_allowed_batch_sizes_last_must_equal_max(emulator, tmp_path, sources) -> None:
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    batching = write(tmp_path / "b.txt", "max_batch_size { value: 8 } allowed_batch_sizes: 2 "
                     "allowed_batch_sizes: 4")
    code, out = run_to_exit(emulator, [f"--port={free_port()}", f"--model_base_path={base}",
                                       "--enable_batching",
                                       f"--batching_parameters_file={batching}",
                                       "--max_num_load_retries=0"])
    assert code == 255
    assert ("Last entry in allowed_batch_sizes must match max_batch_size; last entry was 4; "
            "expected 8") in out


def test_failure_after_grpc_started_leaves_grpc_serving(emulator, tmp_path, sources) -> None:
    # server.cc reads the monitoring config after the gRPC server started: BuildAndStart fails,
    # main returns, and ~Server waits on the running gRPC server. gRPC keeps serving, with no
    # REST port and no metrics endpoint.
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    monitoring = write(tmp_path / "mon.txt", "prometheus_config { enable: true colour: 1 }")
    grpc_port, rest_port = free_port(), free_port()
    server = emulator([f"--port={grpc_port}", f"--rest_api_port={rest_port}",
                       f"--model_base_path={base}", "--model_name=m",
                       f"--monitoring_config_file={monitoring}"])
    server.wait_port(grpc_port)
    deadline = time.monotonic() + 30
    while FAILED not in server.output():
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.1)
    assert f"{FAILED}INVALID_ARGUMENT: Invalid protobuf file: '{monitoring}'" in server.output()
    time.sleep(1.0)
    assert server.proc.poll() is None
    assert not port_open(rest_port)
    predict, models, _channel = stubs(grpc_port)
    assert status_of(models, "m") == {1: (30, 0)}
    response = predict.Predict(predict_request("m", [[1.0]]), timeout=10)
    assert list(response.outputs["y"].float_val) == [2.5]


def test_sigterm_ends_a_server_that_is_not_pid_1(emulator, tmp_path, sources) -> None:
    # no SIGTERM handler, like the real binary: the default action ends it at once (in a
    # container only PID 1 is spared, see tests/conformance)
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    port = free_port()
    server = emulator([f"--port={port}", f"--model_base_path={base}", "--model_name=m"])
    server.wait_port(port)
    os.kill(server.proc.pid, signal.SIGTERM)
    assert server.proc.wait(10) == -signal.SIGTERM


def test_ports_open_only_after_initial_load(emulator, tmp_path, sources) -> None:
    base = tmp_path / "late"
    base.mkdir()
    (base / "v1").mkdir()  # not a version: ignored with a warning
    port = free_port()
    server = emulator([f"--port={port}", f"--model_base_path={base}", "--model_name=late"])
    deadline = time.monotonic() + 60
    while "No versions of servable late found under base path" not in server.output():
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.2)
    time.sleep(1.5)
    assert not port_open(port)
    assert server.proc.poll() is None
    modelgen.copy_version(sources["hpt1"], base, "00000003")
    server.wait_port(port)
    assert "Successfully loaded servable version {name: late version: 3}" in server.output()


def test_entrypoint_appends_flags_and_same_ports_skip_rest(emulator, tmp_path, sources) -> None:
    base = tmp_path / "models"
    modelgen.copy_version(sources["hpt1"], base / "model", 1)
    port = free_port()
    bash = shutil.which("bash")
    assert bash
    server = emulator([f"--port={port}", f"--rest_api_port={port}"],
                      argv0=[bash, str(pathlib.Path(__file__).parents[2] / "testbed" /
                                       "emulator" / "tf_serving_entrypoint.sh")],
                      env={"MODEL_NAME": "model", "MODEL_BASE_PATH": str(base),
                           "PATH": f"{pathlib.Path(__file__).parents[2] / 'testbed' / 'emulator'}"
                                   ":/usr/bin:/bin"})
    server.wait_port(port)
    deadline = time.monotonic() + 10
    while "Skipped exporting HTTP/REST API." not in server.output():
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.1)
    assert f"Running gRPC ModelServer at 0.0.0.0:{port} ..." in server.output()


def test_model_config_file_is_re_read(emulator, tmp_path, sources) -> None:
    from emulator_support import status_of, stubs, wait_for

    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    entry = f'config {{ name: "%s" base_path: "{base}" model_platform: "tensorflow" }}'
    config = write(tmp_path / "models.config", f"model_config_list {{ {entry % 'a'} }}")
    port = free_port()
    server = emulator([f"--port={port}", f"--model_config_file={config}",
                       "--model_config_file_poll_wait_seconds=1"])
    server.wait_port(port)
    _predict, models, _channel = stubs(port)
    write(tmp_path / "models.config", "this is { not a config")
    # the next poll (every 1 s) reads the bad file: logged, and nothing else changes
    server.wait_output("Failed to read ModelServerConfig file: Invalid protobuf file:")
    assert status_of(models, "a") == {1: (30, 0)}
    write(tmp_path / "models.config", f"model_config_list {{ {entry % 'b'} }}")
    wait_for(lambda: status_of(models, "b") == {1: (30, 0)}, what="model b loaded")
    wait_for(lambda: status_of(models, "a") == {1: (50, 0)}, what="model a unloaded")
