"""Several GPUs per host, and containers that get only the GPUs they ask for, as on a host with
the NVIDIA Container Toolkit: docker's `--gpus` and the SDK's DeviceRequest (dockerd's NVIDIA
driver and its hook), NVIDIA_VISIBLE_DEVICES (the runtime wrapper), nothing for no request.

A host with 2 GPUs is needed: when no host has them, the module runs `up --gpus 2` with a bigger
GPU 1 on the last host (so that a container can tell GPU 1 by its memory) and gives the fleet
its GPUs back at the end. Containers are named gpus-test-*.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from docker.types import DeviceRequest
from fleet_helpers import STATE, Testbed, TestbedHost, load_testbed, run_testbed_cli

from tfsdeploy.core.inventory.load import load_inventory

# it gives every host two GPUs for the module (`up --gpus 2`): nothing else may run meanwhile
pytestmark = [pytest.mark.testbed, pytest.mark.fleet_exclusive]

GPU1_MIB = 24576
SMI_GPUS = "--query-gpu=index,minor_number,uuid,memory.total --format=csv,noheader"


def up(*args: str) -> None:
    proc = run_testbed_cli("up", "--no-images", *args)
    assert proc.returncode == 0, f"scripts/testbed up failed:\n{proc.stdout}\n{proc.stderr}"


def shape_args(hosts: list[dict[str, Any]]) -> list[str]:
    """`up` options that give each host of a hosts.json its GPUs and reservation again."""
    args = ["--hosts", str(len(hosts)),
            "--reserve", ",".join(h["name"] for h in hosts if h.get("reserved"))]
    for host in hosts:
        sizes = ",".join(str(g["memory_mib"]) for g in host["gpus"]) or "0"
        args += ["--gpu-mib", f"{host['name']}={sizes}"]
    return args


@pytest.fixture(scope="module")
def fleet(testbed: Testbed) -> Iterator[Testbed]:
    """The fleet with a host of 2 GPUs (the last one), GPU 1 of them bigger than GPU 0."""
    before = json.loads((STATE / "hosts.json").read_text())["hosts"]
    last = before[-1]
    if (len(last["gpus"]) == 2 and last["gpus"][1]["memory_mib"] == GPU1_MIB
            and not any(h.get("reserved") for h in before)):
        yield testbed
        return
    # every host in inventory/testbed.py for the module (none reserved)
    up("--hosts", str(len(before)), "--reserve", "", "--gpus", "2", "--gpu-mib",
       f"{last['name']}=16384,{GPU1_MIB}")
    try:
        yield load_testbed(testbed.started_here)
    finally:
        up(*shape_args(before))


@pytest.fixture
def host(fleet: Testbed) -> TestbedHost:
    return fleet.hosts[-1]


def in_container(fleet: Testbed, host: TestbedHost, options: list[str], script: str, *,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in a fresh container of the proxy image started with ``options``."""
    name = f"gpus-test-{uuid.uuid4().hex[:8]}"
    try:
        return fleet.docker(host, "run", "--rm", "--name", name, "--entrypoint", "sh", *options,
                            fleet.image("tfsdeploy-proxy"), "-c", script, check=check)
    finally:
        fleet.docker(host, "rm", "-f", name, check=False)


def container_gpus(fleet: Testbed, host: TestbedHost, *options: str) -> list[str]:
    """nvidia-smi's GPU lines, run inside a container started with ``options``."""
    out = in_container(fleet, host, list(options), f"nvidia-smi {SMI_GPUS}")
    return [line for line in out.stdout.splitlines() if line]


def test_up_gpus_gives_every_host_its_gpus_and_the_inventory_picks_them_up(fleet: Testbed,
                                                                          host: TestbedHost
                                                                          ) -> None:
    for each in fleet.hosts:
        assert [g["index"] for g in each.gpus] == [0, 1], each
        listing = fleet.ssh(each, "nvidia-smi -L").stdout.splitlines()
        assert [line.split(":")[0] for line in listing] == ["GPU 0", "GPU 1"]
        assert [line.split("UUID: ")[1].rstrip(")") for line in listing] == \
            [g["uuid"] for g in each.gpus]
    assert [g["memory_mib"] for g in host.gpus] == [16384, GPU1_MIB]
    inventory = load_inventory("inventory/testbed.py")
    declared = {h.name: [(g.index, g.memory_mib, g.name) for g in h.gpus] for h in inventory.hosts}
    assert declared[host.name] == [(0, 16384, "Simulated Tesla T4"),
                                   (1, GPU1_MIB, "Simulated Tesla T4")]


def test_gpus_device_1_sees_only_gpu_1_numbered_0(fleet: Testbed, host: TestbedHost) -> None:
    gpu1 = host.gpus[1]
    inside = in_container(fleet, host, ["--gpus", "device=1"],
                          "echo $NVIDIA_VISIBLE_DEVICES; cat /run/simgpu/gpus.json;"
                          f" nvidia-smi {SMI_GPUS}; nvidia-smi -L").stdout.splitlines()
    assert inside[0] == "1"
    assert [g["uuid"] for g in json.loads(inside[1])["gpus"]] == [gpu1["uuid"]]
    assert inside[2:] == [f"0, 1, {gpu1['uuid']}, {GPU1_MIB} MiB",
                          f"GPU 0: Simulated Tesla T4 (UUID: {gpu1['uuid']})"]


def test_gpus_all_and_a_count_see_the_first_gpus(fleet: Testbed, host: TestbedHost) -> None:
    uuids = [g["uuid"] for g in host.gpus]
    assert container_gpus(fleet, host, "--gpus", "all") == [
        f"0, 0, {uuids[0]}, 16384 MiB", f"1, 1, {uuids[1]}, {GPU1_MIB} MiB"]
    assert container_gpus(fleet, host, "--gpus", "1") == [f"0, 0, {uuids[0]}, 16384 MiB"]
    assert container_gpus(fleet, host, "--gpus", f"device={uuids[1]}") == [
        f"0, 1, {uuids[1]}, {GPU1_MIB} MiB"]


def test_nvidia_visible_devices_alone_asks_through_the_default_runtime(fleet: Testbed,
                                                                       host: TestbedHost) -> None:
    assert container_gpus(fleet, host, "-e", "NVIDIA_VISIBLE_DEVICES=1") == [
        f"0, 1, {host.gpus[1]['uuid']}, {GPU1_MIB} MiB"]


def test_a_container_asking_for_nothing_sees_no_gpu(fleet: Testbed, host: TestbedHost) -> None:
    out = in_container(fleet, host, [],
                       "ls /run/simgpu 2>&1; command -v nvidia-smi || echo no nvidia-smi").stdout
    assert "No such file or directory" in out and "no nvidia-smi" in out


def test_a_gpu_the_host_does_not_have_fails_the_start(fleet: Testbed, host: TestbedHost) -> None:
    proc = in_container(fleet, host, ["--gpus", "device=7"], "true", check=False)
    assert proc.returncode == 125
    assert "nvidia-container-cli: device error: 7: unknown device" in proc.stderr


def test_a_docker_sdk_device_request_over_ssh(fleet: Testbed, host: TestbedHost) -> None:
    client = docker.DockerClient(base_url=f"ssh://root@{host.address}", use_ssh_client=True)
    name = f"gpus-test-{uuid.uuid4().hex[:8]}"
    try:
        out = client.containers.run(
            fleet.image("tfsdeploy-proxy"), name=name, entrypoint=["nvidia-smi", "-L"],
            device_requests=[DeviceRequest(device_ids=["1"], capabilities=[["gpu"]])])
    finally:
        fleet.docker(host, "rm", "-f", name, check=False)
        client.close()
    assert out.decode() == f"GPU 0: Simulated Tesla T4 (UUID: {host.gpus[1]['uuid']})\n"


def procs_records(host: TestbedHost) -> list[dict[str, Any]]:
    found = []
    for path in (host.private_dir / "run" / "simgpu" / "procs").glob("*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def test_a_server_on_gpu_1_is_charged_there_on_the_hosts_nvidia_smi(fleet: Testbed,
                                                                    host: TestbedHost) -> None:
    name = f"gpus-test-{uuid.uuid4().hex[:8]}"
    model = "/var/cache/tfsdeploy/models/half_plus_two"
    fleet.docker(host, "run", "-d", "--name", name, "--hostname", name, "--gpus", "device=1",
                 "-v", f"{model}:/models/half_plus_two:ro", "-e", "MODEL_NAME=half_plus_two",
                 fleet.image("tfserving-emulator"), "--per_process_gpu_memory_fraction=0.1")
    try:
        deadline = time.monotonic() + 120
        while not (mine := [r for r in procs_records(host) if r.get("container") == name]):
            state = fleet.docker(host, "inspect", "--format", "{{.State.Status}}", name).stdout
            assert state.strip() == "running" and time.monotonic() < deadline, \
                fleet.docker(host, "logs", "--tail", "30", name, check=False).stderr
            time.sleep(1)
        # the server reserved on GPU 1 only, recorded under the host's index
        assert {r["gpu"] for r in mine} == {1}
        held = sum(r["used_mib"] for r in mine)
        assert held >= int(GPU1_MIB * 0.1)
        apps = fleet.ssh(host, "nvidia-smi --query-compute-apps=pid,used_gpu_memory,gpu_uuid "
                               "--format=csv,noheader,nounits").stdout.splitlines()
        # by the server's HOST pid (the record has the container's own), as the real
        # nvidia-smi run on a host reports it
        top = fleet.docker(host, "top", name, "-eo", "pid").stdout.split()[1:]
        assert {f"{r['used_mib']}, {host.gpus[1]['uuid']}" for r in mine} <= \
            {line.split(", ", 1)[1] for line in apps if line.split(", ", 1)[0] in top}, (apps, top)
        used = fleet.ssh(host, "nvidia-smi --query-gpu=index,memory.used "
                               "--format=csv,noheader,nounits").stdout.splitlines()
        assert int(used[1].split(", ")[1]) >= held
        # from inside, the same GPU is device 0 and shows the same usage
        inside = fleet.docker(host, "exec", name, "nvidia-smi",
                              "--query-gpu=index,uuid,memory.used",
                              "--format=csv,noheader,nounits").stdout.split(", ")
        assert inside[:2] == ["0", host.gpus[1]["uuid"]] and int(inside[2]) >= held
    finally:
        fleet.docker(host, "rm", "-f", name, check=False)
