"""GPU memory on the simulated GPU (docs/testbed-contract.md "Simulated GPU").

What a TensorFlow process holds (tensorflow/core/common_runtime/gpu/gpu_device.cc, the BFC
allocator): a CUDA context on every GPU it sees, plus an allocator limited to fraction x total
on each of them; when that limit is not free the allocator takes less and the server starts
anyway, and a model that needs more fails later, at load.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import modelgen
import pytest
from emulator_support import EMULATOR_DIR, free_port, status_of, stubs, wait_for

TOTAL_MIB = 16384
CONTEXT_MIB = 256  # the emulator's default per-process CUDA context (gpus.json context_mib)
FAILED = "Failed to start server. Error: "


def make_gpu(tmp_path: pathlib.Path, count: int = 2) -> pathlib.Path:
    directory = tmp_path / "simgpu"
    directory.mkdir()
    (directory / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": i, "name": "Simulated Tesla T4", "uuid": f"GPU-000{i}",
         "memory_total_mib": TOTAL_MIB} for i in range(count)]}))
    return directory


def procs(directory: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((directory / "procs").glob("*.json"))]


def usage(directory: pathlib.Path, pid: int) -> dict[int, int]:
    """{host GPU index: MiB} that process ``pid`` holds, from its procs records."""
    return {r["gpu"]: r["used_mib"] for r in procs(directory) if r["pid"] == pid}


@contextlib.contextmanager
def holder(directory: pathlib.Path, gpu: int, used_mib: int) -> Iterator[None]:
    """Another live process holding memory on a GPU (a locked procs record)."""
    (directory / "procs").mkdir(exist_ok=True)
    path = directory / "procs" / f"other-{gpu}.json"
    with open(path, "w+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps({"gpu": gpu, "used_mib": used_mib, "pid": 1,
                                 "process_name": "other", "container": "x"}))
        handle.flush()
        yield
    path.unlink(missing_ok=True)


def start(emulator: Any, base: pathlib.Path, gpu_dir: pathlib.Path, *args: str,
          env: dict[str, str] | None = None) -> tuple[Any, int]:
    port = free_port()
    server = emulator([f"--port={port}", f"--model_base_path={base}", "--model_name=m",
                       "--max_num_load_retries=0", *args],
                      env={"SIMGPU_DIR": str(gpu_dir), **(env or {})})
    return server, port


def model(tmp_path: pathlib.Path, sources: dict[str, pathlib.Path], key: str = "hpt1"
          ) -> pathlib.Path:
    base = tmp_path / "m"
    modelgen.copy_version(sources[key], base, 1)
    return base


def test_context_plus_fraction_on_every_visible_gpu(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path)
    server, port = start(emulator, model(tmp_path, sources), gpu,
                         "--per_process_gpu_memory_fraction=0.25")
    server.wait_port(port)
    # NVIDIA_VISIBLE_DEVICES unset stands for the -gpu image's "all": both GPUs are charged
    expected = int(TOTAL_MIB * 0.25) + CONTEXT_MIB
    assert usage(gpu, server.proc.pid) == {0: expected, 1: expected}
    assert {r["process_name"] for r in procs(gpu)} == {"tensorflow_model_server"}


def test_nvidia_smi_shows_each_gpu_and_process(emulator, tmp_path, sources) -> None:
    # testbed/fleet/nvidia_smi.py reads the same records: per-GPU memory, one row per GPU
    gpu = make_gpu(tmp_path)
    server, port = start(emulator, model(tmp_path, sources), gpu,
                         "--per_process_gpu_memory_fraction=0.25")
    server.wait_port(port)
    smi = [sys.executable, str(EMULATOR_DIR.parent / "fleet" / "nvidia_smi.py")]
    env = {**os.environ, "SIMGPU_DIR": str(gpu)}
    used = subprocess.run([*smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, env=env, check=True).stdout
    expected = int(TOTAL_MIB * 0.25) + CONTEXT_MIB
    assert used == f"0, {expected}\n1, {expected}\n"
    apps = subprocess.run([*smi, "--query-compute-apps=pid,used_gpu_memory,gpu_uuid",
                           "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, env=env, check=True).stdout
    assert sorted(apps.splitlines()) == [f"{server.proc.pid}, {expected}, GPU-000{i}"
                                         for i in (0, 1)]


def test_an_h200s_pool_is_a_fraction_of_what_cuda_can_allocate(emulator, tmp_path,
                                                               sources) -> None:
    # the H200 card of the testbed (`up --gpu-card h200`): nvidia-smi's total 143,771 MiB, 616
    # reserved, 626 MiB held beside the pool; measured on a real H200 with TensorFlow's
    # allocator (XLA's TSL BFC) at fraction 0.20: 29,257 MiB = 0.20 x 143,156 + 626
    gpu = tmp_path / "simgpu"
    gpu.mkdir()
    (gpu / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": 0, "name": "Simulated NVIDIA H200", "uuid": "GPU-h200",
         "memory_total_mib": 143771, "memory_reserved_mib": 616, "context_mib": 626,
         "compute_capability": "9.0"}]}))
    server, port = start(emulator, model(tmp_path, sources), gpu,
                         "--per_process_gpu_memory_fraction=0.2")
    server.wait_port(port)
    assert usage(gpu, server.proc.pid) == {0: 29257}


@pytest.mark.parametrize(("env", "host_gpus"), [
    ({"NVIDIA_VISIBLE_DEVICES": "1"}, [1]),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "1"}, [1]),
])
def test_visible_devices_choose_the_gpus(emulator, tmp_path, sources, env, host_gpus) -> None:
    gpu = make_gpu(tmp_path)
    server, port = start(emulator, model(tmp_path, sources), gpu,
                         "--per_process_gpu_memory_fraction=0.1", env=env)
    server.wait_port(port)
    assert sorted(usage(gpu, server.proc.pid)) == host_gpus


def test_visible_device_rules() -> None:
    sys.path.insert(0, str(EMULATOR_DIR))
    from tfserving_emulator.simgpu import visible_gpus

    gpus = [{"index": i, "uuid": f"GPU-{i}"} for i in range(3)]

    def hosts(**env: str) -> list[int]:
        return [g["index"] for g in visible_gpus(gpus, env)]

    assert hosts() == [0, 1, 2]  # the -gpu image sets NVIDIA_VISIBLE_DEVICES=all
    assert hosts(NVIDIA_VISIBLE_DEVICES="all") == [0, 1, 2]
    assert hosts(NVIDIA_VISIBLE_DEVICES="2,0") == [2, 0]
    assert hosts(NVIDIA_VISIBLE_DEVICES="GPU-1") == [1]
    for none in ("", "none", "void"):
        assert hosts(NVIDIA_VISIBLE_DEVICES=none) == []
    # CUDA_VISIBLE_DEVICES indexes what the container sees, renumbered from 0
    assert hosts(NVIDIA_VISIBLE_DEVICES="1,2", CUDA_VISIBLE_DEVICES="1") == [2]
    assert hosts(NVIDIA_VISIBLE_DEVICES="2", CUDA_VISIBLE_DEVICES="0") == [2]
    assert hosts(CUDA_VISIBLE_DEVICES="0,7,1") == [0]  # CUDA stops at an invalid entry
    assert hosts(CUDA_VISIBLE_DEVICES="-1") == []
    assert hosts(CUDA_VISIBLE_DEVICES="") == []


def test_fraction_not_free_starts_and_fails_a_later_load(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path, count=1)
    base = model(tmp_path, sources)
    with holder(gpu, 0, 8000):  # 8384 MiB free: less than 0.6 x 16384 + context
        server, port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.6",
                             "--file_system_poll_wait_seconds=1")
        server.wait_port(port)  # the BFC allocator backed off and the server started
        out = server.output()
        assert "failed to allocate" in out and "CUDA_ERROR_OUT_OF_MEMORY" in out
        held = usage(gpu, server.proc.pid)[0]
        assert CONTEXT_MIB < held <= TOTAL_MIB - 8000
        modelgen.copy_version(sources["large"], base, 2)  # needs 8500 MiB
        _predict, models, _channel = stubs(port)
        states = wait_for(lambda: (s := status_of(models, "m")).get(2, (0,))[0] == 50 and s,
                          what="v2 END")
        assert states == {2: (50, 8), 1: (30, 0)}  # RESOURCE_EXHAUSTED; v1 keeps serving
        assert "OOM when allocating" in server.output()


def test_fraction_zero_leaves_the_system_reserve(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path, count=1)
    base = model(tmp_path, sources)
    first, port1 = start(emulator, base, gpu)
    first.wait_port(port1)
    # all memory free after the context, minus MinSystemMemory (1050 MiB for compute 7.x)
    assert usage(gpu, first.proc.pid) == {0: TOTAL_MIB - 1050}
    # a second fraction-0 server gets what is left minus 225 MiB: enough for a small model
    second, port2 = start(emulator, base, gpu)
    second.wait_port(port2)
    assert usage(gpu, second.proc.pid) == {0: CONTEXT_MIB + (1050 - CONTEXT_MIB - 225)}


def test_no_room_for_a_context_fails_every_load(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path, count=1)
    with holder(gpu, 0, TOTAL_MIB - 100):
        server, _port = start(emulator, model(tmp_path, sources), gpu)
        assert server.wait_exit() == 255
    out = server.output()
    assert f"{FAILED}UNKNOWN: 1 servable(s) did not become available" in out
    assert ("failed initializing StreamExecutor for CUDA device ordinal 0 stream group 0: "
            "INTERNAL: failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY") in out


def test_model_larger_than_reservation_fails_to_load(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path, count=1)
    base = model(tmp_path, sources)
    server, port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.25",
                         "--file_system_poll_wait_seconds=1")
    server.wait_port(port)
    modelgen.copy_version(sources["huge"], base, 2)
    _predict, models, _channel = stubs(port)
    states = wait_for(lambda: (s := status_of(models, "m")).get(2, (0,))[0] == 50 and s,
                      what="v2 END")
    assert states == {2: (50, 8), 1: (30, 0)}  # RESOURCE_EXHAUSTED; v1 keeps serving
    assert "OOM when allocating" in server.output()


def test_without_simgpu_dir_runs_on_cpu(emulator, tmp_path, sources) -> None:
    server, port = start(emulator, model(tmp_path, sources, "huge"), tmp_path / "absent",
                         "--per_process_gpu_memory_fraction=0.01")
    server.wait_port(port)
    _predict, models, _channel = stubs(port)
    assert status_of(models, "m") == {1: (30, 0)}


def test_allow_growth_takes_memory_on_demand(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path, count=1)
    base = model(tmp_path, sources)
    session = tmp_path / "session.config"
    session.write_text("gpu_options { allow_growth: true }\n")
    first, port1 = start(emulator, base, gpu, f"--tensorflow_session_config_file={session}")
    second, port2 = start(emulator, base, gpu, env={"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    first.wait_port(port1)
    second.wait_port(port2)
    # CUDA context plus the model's default footprint (tiny variables x 2 + 64 MiB)
    assert [p["used_mib"] for p in procs(gpu)] == [CONTEXT_MIB + 64] * 2


def test_processes_hold_their_records_until_they_die(emulator, tmp_path, sources) -> None:
    gpu = make_gpu(tmp_path, count=1)
    base = model(tmp_path, sources)
    blue, blue_port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.45")
    blue.wait_port(blue_port)
    pid = blue.proc.pid
    blue.stop()
    green, green_port = start(emulator, base, gpu, "--per_process_gpu_memory_fraction=0.5")
    green.wait_port(green_port)
    # the dead owner's record was deleted by the next reader
    assert [r["pid"] for r in procs(gpu)] == [green.proc.pid]
    assert pid != green.proc.pid
    assert os.path.exists(gpu / "lock")
