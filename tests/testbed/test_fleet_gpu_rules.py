"""The simulated GPUs' rules, without the fleet: `up --gpus/--gpu-mib`, which GPUs a container
asks for (the NVIDIA Container Toolkit's rules), the runtime wrapper's hook, and nvidia-smi run
as the executable it is, on GPU files of a host and of a container."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import FLEET, fleet_module

cli = fleet_module("testbed")
devices = fleet_module("simgpu_devices")
runtime = fleet_module("simgpu_runtime")

GPUS = [
    {"index": 0, "name": "Simulated Tesla T4", "uuid": "GPU-a0", "memory_total_mib": 16384},
    {"index": 1, "name": "Simulated Tesla T4", "uuid": "GPU-b1", "memory_total_mib": 24576},
]


# -- scripts/testbed up --gpus / --gpu-mib --------------------------------------------------

@pytest.mark.parametrize(("sizes", "counts", "expected"), [
    ([], [], {"tb1": [16384], "tb2": [16384]}),
    ([], ["2"], {"tb1": [16384, 16384], "tb2": [16384, 16384]}),
    (["8192"], ["3"], {"tb1": [8192] * 3, "tb2": [8192] * 3}),
    (["tb2=16384,24576"], ["2"], {"tb1": [16384] * 2, "tb2": [16384, 24576]}),
    (["tb2=16384,8192"], [], {"tb1": [16384], "tb2": [16384, 8192]}),  # a list sets the count
    (["tb1=0"], ["2"], {"tb1": [], "tb2": [16384, 16384]}),
    ([], ["tb2=4"], {"tb1": [16384], "tb2": [16384] * 4}),
    ([], ["0"], {"tb1": [], "tb2": []}),
])
def test_gpus_and_gpu_mib_give_each_host_its_gpus(sizes: list[str], counts: list[str],
                                                   expected: dict[str, list[int]]) -> None:
    assert cli.parse_gpu_specs(sizes, 2, counts) == expected


CURRENT = {"tb1": [16384], "tb2": [8192, 8192]}


@pytest.mark.parametrize(("sizes", "counts", "expected"), [
    ([], [], {"tb1": [16384], "tb2": [8192, 8192], "tb3": [16384]}),  # a new host: default
    ([], ["tb1=2"], {"tb1": [16384, 16384], "tb2": [8192, 8192], "tb3": [16384]}),
    (["4096"], [], {"tb1": [4096], "tb2": [4096], "tb3": [4096]}),  # every host named
])
def test_a_host_no_option_names_keeps_its_gpus(sizes: list[str], counts: list[str],
                                               expected: dict[str, list[int]]) -> None:
    assert cli.parse_gpu_specs(sizes, 3, counts, current=CURRENT) == expected


def test_reservations_stay_until_changed_and_name_existing_hosts() -> None:
    assert cli.parse_reserve(None, 4, {"tb4"}) == {"tb4"}
    assert cli.parse_reserve(None, 3, {"tb4"}) == set()  # tb4 is gone
    assert cli.parse_reserve("", 4, {"tb4"}) == set()
    assert cli.parse_reserve("tb3,tb4", 4, set()) == {"tb3", "tb4"}
    with pytest.raises(cli.TestbedError, match=r"tb7 not among tb1\.\.tb4"):
        cli.parse_reserve("tb7", 4, set())


@pytest.mark.parametrize(("sizes", "counts", "message"), [
    (["tb1=16384,8192,8192"], ["2"], "tb1: --gpu-mib lists 3 GPU sizes but --gpus asks for 2"),
    ([], ["17"], "--gpus '17': give a number of GPUs per host, 0..16"),
    ([], ["two"], "--gpus 'two'"),
    ([], ["tb31=1"], "unknown host 'tb31'"),
    (["tb1=-1"], [], "sizes must be positive integers in MiB, or 0 alone"),
    (["16384,0"], [], "sizes must be positive integers in MiB, or 0 alone"),
])
def test_bad_gpu_options_are_refused_with_the_fix(sizes: list[str], counts: list[str],
                                                  message: str) -> None:
    with pytest.raises(cli.TestbedError, match=message.replace("(", r"\(")):
        cli.parse_gpu_specs(sizes, 2, counts)


def test_the_summary_names_each_hosts_gpus() -> None:
    assert cli.gpu_label([16384]) == "GPU 16384 MiB"
    assert cli.gpu_label([16384, 16384]) == "GPUs 2x16384 MiB"
    assert cli.gpu_label([16384, 8192]) == "GPUs 16384+8192 MiB"
    assert cli.gpu_label([]) == "no GPU"


# -- which GPUs a container asks for ----------------------------------------------------------

def asks(*env: str) -> list[str] | None:
    return devices.requested_devices(devices.env_map(env))  # type: ignore[no-any-return]


def test_visible_devices_follow_the_container_toolkit() -> None:
    assert asks() is None  # no variable: not a GPU container
    assert asks("NVIDIA_VISIBLE_DEVICES=") is None
    assert asks("NVIDIA_VISIBLE_DEVICES=void") is None
    assert asks("NVIDIA_VISIBLE_DEVICES=1,void") is None
    assert asks("NVIDIA_VISIBLE_DEVICES=all") == ["all"]
    assert asks("NVIDIA_VISIBLE_DEVICES=none") == []
    assert asks("NVIDIA_VISIBLE_DEVICES=1, GPU-a0") == ["1", "GPU-a0"]
    assert asks("NVIDIA_VISIBLE_DEVICES=0,all") == ["all"]
    # dockerd appends its value after the image's: the last one counts
    assert asks("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1") == ["1"]
    # a legacy CUDA image (CUDA_VERSION, no NVIDIA_REQUIRE_CUDA) gets every GPU by default
    assert asks("CUDA_VERSION=12.2") == ["all"]
    assert asks("CUDA_VERSION=12.2", "NVIDIA_REQUIRE_CUDA=cuda>=12.2") is None


def test_driver_capabilities_default_to_compute_and_utility() -> None:
    def caps(*env: str) -> set[str]:
        return set(devices.capabilities(devices.env_map(env)))

    assert caps() == {"compute", "utility"}
    assert caps("NVIDIA_DRIVER_CAPABILITIES=") == {"compute", "utility"}
    assert caps("NVIDIA_DRIVER_CAPABILITIES=compute") == {"compute"}
    assert "video" in caps("NVIDIA_DRIVER_CAPABILITIES=all")
    assert "graphics" in caps("CUDA_VERSION=11.8")


def test_gpus_are_chosen_by_index_or_uuid_in_the_hosts_order() -> None:
    def chosen(*requested: str) -> list[int]:
        return [g["index"] for g in devices.select_gpus(GPUS, list(requested))]

    assert chosen("all") == [0, 1]
    assert chosen("1") == [1]
    assert chosen("GPU-b1", "0") == [0, 1]
    assert chosen("1", "GPU-b1") == [1]
    assert chosen() == []  # `none`
    with pytest.raises(devices.DeviceError, match=r"^device error: 7: unknown device$"):
        chosen("0", "7")


def test_a_containers_gpu_file_keeps_the_hosts_entries() -> None:
    view = devices.view_document({"gpus": GPUS, "note": "x"}, [GPUS[1]])
    assert view == {"note": "x", "gpus": [GPUS[1]]}
    assert view["gpus"][0] is not GPUS[1]


def test_the_runtime_adds_the_hook_only_to_containers_asking_for_gpus(tmp_path: Path) -> None:
    hook = tmp_path / "nvidia-container-runtime-hook"

    def spec(*env: str, hooks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {"process": {"env": ["PATH=/bin", *env]}}
        if hooks is not None:
            doc["hooks"] = {"prestart": hooks}
        return doc

    assert runtime.with_gpu_hook(spec(), hook) is None
    assert runtime.with_gpu_hook(spec("NVIDIA_VISIBLE_DEVICES=void"), hook) is None
    added = runtime.with_gpu_hook(spec("NVIDIA_VISIBLE_DEVICES=1"), hook)
    assert added["hooks"]["prestart"] == [
        {"path": str(hook), "args": ["nvidia-container-runtime-hook", "prestart"]}]
    # dockerd already put its hook there (docker run --gpus): nothing to add
    dockerd_hook = {"path": "/srv/bin/nvidia-container-runtime-hook",
                    "args": ["nvidia-container-runtime-hook", "prestart"]}
    assert runtime.with_gpu_hook(spec("NVIDIA_VISIBLE_DEVICES=all", hooks=[dockerd_hook]),
                                 hook) is None


def test_the_runtime_finds_the_bundle_of_create() -> None:
    args = ["--root", "/run/r", "--log", "/x.log", "create", "--bundle", "/b/c", "--pid-file",
            "/p", "id"]
    command, pos = runtime.find_command(args)
    assert (command, pos) == ("create", 4)
    assert runtime.find_bundle(args[pos + 1:]) == "/b/c"


def test_the_hook_without_arguments_prints_its_usage() -> None:
    done = subprocess.run([sys.executable, str(FLEET / "nvidia_container_hook.py")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "prestart" in done.stderr
    for quiet in ("poststart", "poststop"):
        done = subprocess.run([sys.executable, str(FLEET / "nvidia_container_hook.py"), quiet],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and not done.stderr


# -- nvidia-smi on a host's and on a container's GPU files --------------------------------------

def simgpu_dir(tmp_path: Path, gpus: list[dict[str, Any]]) -> Path:
    directory = tmp_path / "simgpu"
    (directory / "procs").mkdir(parents=True)
    (directory / "lock").touch()
    (directory / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    return directory


@contextmanager
def holding(directory: Path, name: str, record: dict[str, Any]) -> Iterator[None]:
    """A live owner's reservation record: its flock held while the block runs."""
    with open(directory / "procs" / f"{name}.json", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps({"pid": 42, "process_name": "tensorflow_model_server",
                                 "container": name, **record}))
        handle.flush()
        yield


def smi(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FLEET / "nvidia_smi.py"), *args],
                          env={"SIMGPU_DIR": str(directory), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)


def test_nvidia_smi_on_a_host_shows_each_gpus_memory_and_processes(tmp_path: Path) -> None:
    host = simgpu_dir(tmp_path, GPUS)
    with holding(host, "a", {"gpu": 1, "used_mib": 3000}), \
            holding(host, "b", {"gpu": 0, "used_mib": 500}), \
            holding(host, "c", {"gpu": 0, "gpu_uuid": "GPU-b1", "used_mib": 700}):  # by UUID
        gpus = smi(host, "--query-gpu=index,minor_number,uuid,memory.total,memory.used",
                   "--format=csv,noheader,nounits")
        assert gpus.stdout.splitlines() == ["0, 0, GPU-a0, 16384, 500",
                                            "1, 1, GPU-b1, 24576, 3700"]
        apps = smi(host, "--query-compute-apps=used_gpu_memory,gpu_uuid,gpu_bus_id",
                   "--format=csv")
        assert apps.stdout.splitlines() == [
            "used_gpu_memory [MiB], gpu_uuid, gpu_bus_id",
            "500 MiB, GPU-a0, 00000000:01:00.0",
            "3000 MiB, GPU-b1, 00000000:02:00.0",
            "700 MiB, GPU-b1, 00000000:02:00.0",
        ]
        one = smi(host, "-i", "1", "--query-compute-apps=used_gpu_memory", "--format=csv,noheader")
        assert one.stdout.splitlines() == ["3000 MiB", "700 MiB"]
        plain = smi(host).stdout
        assert "GPU 1: Simulated Tesla T4  00000000:02:00.0  3700MiB / 24576MiB" in plain
        # the holder of the record's flock, as this pid namespace numbers it: this process
        assert f"GPU 1  pid {os.getpid()}  tensorflow_model_server  3000MiB" in plain
    assert smi(host, "-L").stdout == ("GPU 0: Simulated Tesla T4 (UUID: GPU-a0)\n"
                                      "GPU 1: Simulated Tesla T4 (UUID: GPU-b1)\n")


def test_nvidia_smi_in_a_container_numbers_its_gpus_from_0(tmp_path: Path) -> None:
    view = simgpu_dir(tmp_path, [GPUS[1]])  # what the hook gives `--gpus device=1`
    with holding(view, "a", {"gpu": 1, "used_mib": 3000}), \
            holding(view, "b", {"gpu": 0, "used_mib": 500}):  # host GPU 0: not this container's
        gpus = smi(view, "--query-gpu=index,minor_number,pci.bus_id,uuid,memory.total,memory.used",
                   "--format=csv,noheader")
        assert gpus.stdout == "0, 1, 00000000:02:00.0, GPU-b1, 24576 MiB, 3000 MiB\n"
        apps = smi(view, "--query-compute-apps=used_gpu_memory,gpu_uuid", "--format=csv,noheader")
        assert apps.stdout == "3000 MiB, GPU-b1\n"
        assert smi(view, "-i", "0", "-L").stdout == "GPU 0: Simulated Tesla T4 (UUID: GPU-b1)\n"
        missing = smi(view, "-i", "1", "-L")
        assert (missing.returncode, missing.stdout) == (6, "No devices were found\n")


H200 = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "h200"


def test_nvidia_smi_reports_an_h200s_reserved_memory_as_the_real_one(tmp_path: Path) -> None:
    card = cli.gpu_document("tb9", [143771], "h200")["gpus"][0]
    host = simgpu_dir(tmp_path, [card])
    query = "--query-gpu=memory.total,memory.reserved,memory.used,memory.free"
    done = smi(host, query, "--format=csv")
    real = (H200 / "nvidia-smi-query-gpu-reserved.csv").read_text().splitlines()
    ours = done.stdout.splitlines()
    assert ours[0] == real[0]  # the same columns, named and united alike
    # total and reserved as measured; free is total - reserved - used (the real card's
    # 143156 comes from byte counts rounded to MiB, one more than the MiB difference)
    assert ours[1] == "143771 MiB, 616 MiB, 0 MiB, 143155 MiB", ours
    with holding(host, "a", {"gpu": 0, "used_mib": 29257}):
        busy = smi(host, query, "--format=csv,noheader,nounits").stdout
    assert busy == "143771, 616, 29257, 113898\n"


def test_nvidia_smi_on_the_host_names_a_containerised_process_by_its_host_pid(
        tmp_path: Path) -> None:
    host = simgpu_dir(tmp_path, GPUS)
    record = host / "procs" / "server.json"
    # a server in its own pid namespace (as in a container): it records its own pid, 1
    script = ("import fcntl, json, os, sys, time\n"
              "f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
              "f.write(json.dumps({'gpu': 0, 'used_mib': 930, 'pid': os.getpid()})); f.flush()\n"
              "print(os.getpid(), flush=True); time.sleep(60)\n")
    server = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", script,
                               str(record)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "1"
        inside = json.loads(record.read_text())["pid"]
        apps = smi(host, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        pid = int(apps.stdout.split(",")[0])
        assert inside == 1 and pid != 1
        # the host pid of the server: unshare's child, below the process started here
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        assert [pid] == [int(c) for c in children], (pid, children)
        assert apps.stdout == f"{pid}, 930\n"
    finally:
        server.kill()
        server.wait()


def test_gpu_cards_follow_the_options_and_stay_as_they_are() -> None:
    current = {"tb1": "t4", "tb2": "h200", "tb3": "h200"}
    assert cli.parse_card_specs([], 3, [[], []], current) == current
    assert cli.parse_card_specs(["tb1=h200"], 3, [[], []], current) == {
        "tb1": "h200", "tb2": "h200", "tb3": "h200"}
    # a host that --gpus or --gpu-mib names without a card gets the default card again
    assert cli.parse_card_specs([], 3, [["tb2=2"], ["tb3=16384"]], current) == {
        "tb1": "t4", "tb2": "t4", "tb3": "t4"}
    with pytest.raises(cli.TestbedError, match="--gpu-card 'a100': choose one of h200, t4"):
        cli.parse_card_specs(["a100"], 3)
    sizes = cli.apply_cards({"tb1": [16384], "tb2": [16384, 16384], "tb3": [8192]},
                            {"tb1": "t4", "tb2": "h200", "tb3": "h200"}, ["tb3=8192"],
                            {"tb1": "t4", "tb2": "t4", "tb3": "t4"})
    assert sizes == {"tb1": [16384], "tb2": [143771, 143771], "tb3": [8192]}
    doc = cli.gpu_document("tb2", [143771], "h200")["gpus"][0]
    assert (doc["memory_reserved_mib"], doc["context_mib"], doc["compute_capability"]) == (
        616, 626, "9.0")


def test_nvidia_smi_without_gpus_file_fails_like_a_missing_driver(tmp_path: Path) -> None:
    done = smi(tmp_path / "nothing", "-L")
    assert done.returncode == 9 and "couldn't communicate with the NVIDIA driver" in done.stdout
