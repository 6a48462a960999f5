"""GPU memory on the simulated GPU (docs/testbed-contract.md "Simulated GPU")."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import grpc
import modelgen
from emulator_support import free_port, stubs

TOTAL_MIB = 16384


def make_gpu(tmp_path: pathlib.Path) -> pathlib.Path:
    directory = tmp_path / "simgpu"
    directory.mkdir()
    (directory / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": 0, "name": "Simulated Tesla T4", "uuid": "GPU-0000", "memory_total_mib":
         TOTAL_MIB},
        {"index": 1, "name": "Simulated Tesla T4", "uuid": "GPU-0001", "memory_total_mib":
         TOTAL_MIB}]}))
    return directory


def procs(directory: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((directory / "procs").glob("*.json"))]


def start(emulator: Any, base: pathlib.Path, gpu_dir: pathlib.Path, *args: str,
          env: dict[str, str] | None = None) -> tuple[Any, int]:
    port = free_port()
    server = emulator([f"--port={port}", f"--model_base_path={base}", "--model_name=m",
                       "--max_num_load_retries=0", *args],
                      env={"SIMGPU_DIR": str(gpu_dir), **(env or {})})
    return server, port


def test_fraction_zero_takes_all_free_memory(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path)
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    first, port = start(emulator, base, gpu)
    first.wait_port(port)
    assert [(p["gpu"], p["used_mib"], p["process_name"]) for p in procs(gpu)] == \
        [(0, TOTAL_MIB, "tensorflow_model_server")]
    second, _ = start(emulator, base, gpu)
    assert second.wait_exit() == 255
    assert "CUDA_ERROR_OUT_OF_MEMORY: out of memory" in second.output()
    # the other GPU is still free
    third, port3 = start(emulator, base, gpu, env={"CUDA_VISIBLE_DEVICES": "1"})
    third.wait_port(port3)
    first.stop()
    third.stop()


def test_fractions_below_one_share_a_gpu(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path)
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    blue, blue_port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.45")
    green, green_port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.45")
    blue.wait_port(blue_port)
    green.wait_port(green_port)
    assert sorted(p["used_mib"] for p in procs(gpu)) == [int(TOTAL_MIB * 0.45)] * 2
    third, _ = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.2")
    assert third.wait_exit() == 255
    assert "Failed to start server. Error: INTERNAL: Failed to create GPU device" in \
        third.output()
    # a dead owner's reservation is released: the next reader deletes its file
    blue.stop()
    fourth, fourth_port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.5")
    fourth.wait_port(fourth_port)
    assert sorted(p["used_mib"] for p in procs(gpu)) == [int(TOTAL_MIB * 0.45),
                                                          int(TOTAL_MIB * 0.5)]


def test_model_larger_than_reservation_fails_to_load(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path)
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    server, port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.25",
                         "--file_system_poll_wait_seconds=1")
    server.wait_port(port)
    modelgen.copy_version(sources["huge"], base, 2)
    from emulator_support import status_of, wait_for

    _predict, models, _channel = stubs(port)
    states = wait_for(lambda: (s := status_of(models, "m")).get(2, (0,))[0] == 50 and s,
                      what="v2 END")
    assert states == {2: (50, 8), 1: (30, 0)}  # RESOURCE_EXHAUSTED; v1 keeps serving
    assert "OOM when allocating" in server.output()


def test_without_simgpu_dir_runs_on_cpu(emulator, tmp_path, sources) -> None:
    base = tmp_path / "m"
    modelgen.copy_version(sources["huge"], base, 1)
    server, port = start(emulator, base, tmp_path / "absent",
                         "--per_process_gpu_memory_fraction=0.01")
    server.wait_port(port)
    _predict, models, _channel = stubs(port)
    try:
        from emulator_support import status_of

        assert status_of(models, "m") == {1: (30, 0)}
    except grpc.RpcError as exc:  # pragma: no cover - diagnostic
        raise AssertionError(server.output()) from exc


def test_allow_growth_takes_memory_on_demand(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path)
    base = tmp_path / "m"
    modelgen.copy_version(sources["hpt1"], base, 1)
    session = tmp_path / "session.config"
    session.write_text("gpu_options { allow_growth: true }\n")
    first, port1 = start(emulator, base, gpu, f"--tensorflow_session_config_file={session}")
    second, port2 = start(emulator, base, gpu, env={"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    first.wait_port(port1)
    second.wait_port(port2)
    # CUDA context (256 MiB) plus the model's default footprint (tiny variables x 2 + 64 MiB)
    assert [p["used_mib"] for p in procs(gpu)] == [320, 320]
