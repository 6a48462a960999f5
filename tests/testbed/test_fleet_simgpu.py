"""The simulated GPU: nvidia-smi answers from /run/simgpu; a container that asks for GPUs gets
them (test_fleet_gpus.py has the rules of who gets which)."""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fleet_helpers import Testbed, TestbedHost

pytestmark = pytest.mark.testbed

GPU_QUERY = "--query-gpu=index,name,uuid,memory.total,memory.used,memory.free"
APPS_QUERY = "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid"


def gpu_host(testbed: Testbed) -> TestbedHost:
    for host in testbed.hosts:
        if host.gpus:
            return host
    pytest.fail(
        "no testbed host has a simulated GPU (scripts/testbed up gives each one by default)"
    )


@contextmanager
def reservation(host: TestbedHost, used_mib: int) -> Iterator[str]:
    """A reservation file held like a live owner does: an exclusive flock for its lifetime."""
    token = uuid.uuid4().hex
    path = host.private_dir / "run" / "simgpu" / "procs" / f"{token}.json"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(
            fd,
            json.dumps(
                {
                    "gpu": 0,
                    "used_mib": used_mib,
                    "pid": 4242,
                    "process_name": "tensorflow_model_server",
                    "container": "probe",
                }
            ).encode(),
        )
        yield token
    finally:
        os.close(fd)  # releases the lock: the owner is "dead" from now on


def test_nvidia_smi_reports_the_configured_gpu(testbed: Testbed) -> None:
    host = gpu_host(testbed)
    gpu = host.gpus[0]
    out = testbed.ssh(host, f"nvidia-smi {GPU_QUERY} --format=csv").stdout.splitlines()
    assert out[0] == ("index, name, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]")
    index, name, gpu_uuid, total, used, free = out[1].split(", ")
    assert (index, name) == ("0", gpu["name"])
    assert gpu_uuid.startswith("GPU-") and gpu_uuid == gpu.get("uuid", gpu_uuid)
    assert total == f"{gpu['memory_mib']} MiB"
    assert int(used.split()[0]) + int(free.split()[0]) == gpu["memory_mib"]
    bare = testbed.ssh(host, "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits")
    assert bare.stdout == f"{gpu['memory_mib']}\n"
    listing = testbed.ssh(host, "nvidia-smi -L").stdout
    assert listing == f"GPU 0: {gpu['name']} (UUID: {gpu_uuid})\n"


def test_gpu_files_are_private_to_each_host(testbed: Testbed) -> None:
    uuids = [
        testbed.ssh(h, "nvidia-smi --query-gpu=uuid --format=csv,noheader").stdout
        for h in testbed.hosts
        if h.gpus
    ]
    assert len(set(uuids)) == len(uuids)


def test_reservation_shows_as_used_memory_and_a_process(testbed: Testbed) -> None:
    host = gpu_host(testbed)
    total = host.gpus[0]["memory_mib"]
    with reservation(host, 4096):
        used = testbed.ssh(
            host, "nvidia-smi --query-gpu=memory.used,memory.free --format=csv,noheader,nounits"
        ).stdout.strip()
        used_mib, free_mib = (int(v) for v in used.split(", "))
        assert used_mib >= 4096 and used_mib + free_mib == total
        apps = testbed.ssh(host, f"nvidia-smi {APPS_QUERY} --format=csv").stdout.splitlines()
        assert apps[0] == "pid, process_name, used_gpu_memory [MiB], gpu_uuid"
        # the pid is the lock holder's as the host sees it (this test process: the testbed's
        # hosts share this machine's pid namespace), not the record's own 4242 (a container's
        # view), as the real nvidia-smi run on a host reports host pids
        assert any(
            line.startswith(f"{os.getpid()}, tensorflow_model_server, 4096 MiB, GPU-")
            for line in apps[1:]
        ), apps


def test_reservation_of_a_dead_owner_is_cleaned(testbed: Testbed) -> None:
    host = gpu_host(testbed)
    with reservation(host, 2048) as token:
        pass  # the owner "died": its lock is gone, its file is still there
    path = host.private_dir / "run" / "simgpu" / "procs" / f"{token}.json"
    assert path.exists()
    apps = testbed.ssh(host, f"nvidia-smi {APPS_QUERY} --format=csv,noheader").stdout
    assert "4242, " not in apps
    assert not path.exists()


def test_nvidia_smi_rejects_unknown_fields_like_the_real_one(testbed: Testbed) -> None:
    proc = testbed.ssh(gpu_host(testbed), "nvidia-smi --query-gpu=bogus --format=csv", check=False)
    assert proc.returncode == 2 and 'Field "bogus" is not a valid field to query.' in proc.stdout


def test_a_container_asking_for_all_gpus_gets_the_hosts_gpu_files(testbed: Testbed) -> None:
    host = gpu_host(testbed)
    # `--gpus all`: dockerd's NVIDIA driver and the testbed's hook give it the host's GPUs
    out = testbed.docker(
        host,
        "run",
        "--rm",
        "--gpus",
        "all",
        "--entrypoint",
        "cat",
        testbed.image("tfsdeploy-proxy"),
        "/run/simgpu/gpus.json",
    ).stdout
    assert json.loads(out)["gpus"][0]["memory_total_mib"] == host.gpus[0]["memory_mib"]
    runtime = testbed.docker(host, "info", "--format", "{{.DefaultRuntime}}").stdout.strip()
    assert runtime == "simgpu"


def test_a_container_sees_reservations_and_its_lock_is_shared(testbed: Testbed) -> None:
    host = gpu_host(testbed)
    with reservation(host, 1024) as token:
        script = (
            "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR)\n"
            "try:\n    fcntl.flock(fd, fcntl.LOCK_EX|fcntl.LOCK_NB); print('free')\n"
            "except OSError:\n    print('held')"
        )
        out = testbed.docker(
            host,
            "run",
            "--rm",
            "--gpus",
            "all",
            "--entrypoint",
            "python3",
            testbed.image("tfsdeploy-proxy"),
            "-c",
            script,
            f"/run/simgpu/procs/{token}.json",
        ).stdout.strip()
    assert out == "held"
