"""Stopping and breaking the fleet: `down` leaves nothing behind, `up` repairs a killed host.

These take the fleet down or kill its daemons, so they only run on a fleet this test session
started itself, or with TFSDEPLOY_TESTBED_DESTRUCTIVE=1 (see conftest.py).  Each one leaves the
fleet up and healthy again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fleet_helpers import STATE, Testbed, load_testbed, run_testbed_cli

pytestmark = [pytest.mark.testbed, pytest.mark.fleet_exclusive]

OUR_DAEMONS = {
    "dockerd",
    "containerd",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "docker-registry",
}


def up(*args: str) -> str:
    proc = run_testbed_cli("up", *args)
    assert proc.returncode == 0, f"scripts/testbed up failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def status() -> tuple[int, dict[str, object]]:
    proc = run_testbed_cli("status", "--json")
    return proc.returncode, json.loads(proc.stdout)


def leftover_processes() -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        if comm in OUR_DAEMONS or str(STATE) in cmdline or "tfsdeploy-testbed-" in cmdline:
            found.append(f"{entry.name} {comm}: {cmdline[:120]}")
    return found


def leftover_mounts() -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [ln for ln in lines if "tfsdeploy" in ln or "/run/netns/tb" in ln]


def test_up_recovers_after_kill_9_of_the_daemons(destructive: Testbed) -> None:
    code, before = status()
    assert code == 0
    tb1 = before["hosts"][0]  # type: ignore[index]
    victims = [tb1["sshd"], tb1["dockerd"], before["registry"]["pid"]]  # type: ignore[index]
    victims.append(int((STATE / "hosts" / "tb1" / "holder.pid").read_text()))
    for pid in victims:
        os.kill(int(pid), signal.SIGKILL)
    code, broken = status()
    assert code != 0 and not broken["hosts"][0]["healthy"]  # type: ignore[index]
    up("--hosts", str(len(destructive.hosts)), "--no-images")
    code, after = status()
    assert code == 0, after
    assert after["hosts"][0]["dockerd"] not in victims  # type: ignore[index]
    assert destructive.ssh(destructive.hosts[0], "hostname").stdout.strip() == "tb1"
    assert destructive.docker(destructive.hosts[0], "ps").returncode == 0
    # each host's dockerd runs its own containerd (/run is private); the one of the killed
    # dockerd must not survive next to the new one (the image builder's has another config);
    # the gateway host (`up --gateway`, which `up` leaves as it is) has its own too
    containerds = [
        p
        for p in leftover_processes()
        if " containerd:" in p and "/run/docker/containerd/containerd.toml" in p
    ]
    gateway = after.get("gateway")  # type: ignore[union-attr]
    gateways = 1 if gateway and gateway["dockerd"] else 0
    assert len(containerds) == len(destructive.hosts) + gateways, containerds  # none from tb1


def gone(pid: int, within_s: float) -> bool:
    """Whether process ``pid`` has ended (a zombie counts as ended) within ``within_s``."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_the_conformance_tier_fails_when_its_host_s_docker_engine_is_stopped(
        destructive: Testbed) -> None:
    """A fleet whose Docker engine does not answer turns the conformance tier red: an error
    naming the host and the engine, never a skip or a pass (tests/conformance/conftest.py
    ``servers``, ``fleet_problem``). The tier is pointed at tb1 (TFSDEPLOY_CONFORMANCE_HOST),
    whose dockerd is killed while its sshd keeps answering."""
    code, before = status()
    assert code == 0
    dockerd = int(before["hosts"][0]["dockerd"])  # type: ignore[index]
    os.kill(dockerd, signal.SIGKILL)
    try:
        assert gone(dockerd, within_s=30), f"tb1's dockerd ({dockerd}) outlived SIGKILL"
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/conformance/test_model_server.py", "-k", "test_get_model_status"],
            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
            timeout=600, env=os.environ | {"TFSDEPLOY_CONFORMANCE_HOST": "tb1"})
    finally:
        up("--hosts", str(len(destructive.hosts)), "--no-images")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "the conformance tier cannot run: tb1's Docker engine does not answer" in out, out
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"(\d+ deselected, )?1 error in [\d.]+s", summary), out
    code, after = status()
    assert code == 0, after


def test_gpu_memory_can_be_set_per_host(destructive: Testbed) -> None:
    """GPUs and their memory change per host as hardware does, and the host keeps its disk
    (what the toolkit stored there survives the change, as on a real host given a GPU)."""
    n = str(len(destructive.hosts))
    probe = "/srv/tfsdeploy/.testbed-disk-probe"
    destructive.ssh(destructive.hosts[0], f"mkdir -p /srv/tfsdeploy && echo kept > {probe}")
    try:
        up("--hosts", n, "--no-images", "--gpu-mib", "tb2=8192")
        fleet = load_testbed(destructive.started_here)
        mib = {h.name: h.gpus[0]["memory_mib"] for h in fleet.hosts}
        assert mib["tb1"] == 16384 and mib["tb2"] == 8192
        query = "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits"
        assert fleet.ssh(fleet.hosts[1], query).stdout.strip() == "8192"
        assert fleet.ssh(fleet.hosts[0], query).stdout.strip() == "16384"
        up("--hosts", n, "--no-images", "--gpus", "tb1=3", "--gpu-mib", "tb1=4096")
        fleet = load_testbed(destructive.started_here)
        assert [g["memory_mib"] for g in fleet.hosts[0].gpus] == [4096] * 3
        assert fleet.ssh(fleet.hosts[0], query).stdout.split() == ["4096"] * 3
        assert fleet.ssh(fleet.hosts[0], f"cat {probe}").stdout == "kept\n"
        up("--hosts", n, "--no-images", "--gpu-mib", "tb2=0")
        proc = fleet.ssh(fleet.hosts[1], query, check=False)
        assert proc.returncode != 0 and "couldn't communicate with the NVIDIA driver" in proc.stdout
    finally:  # tb1 and tb2 as a new host has them (a plain `up` keeps a host's GPUs)
        up("--hosts", n, "--no-images", "--gpus", "tb1=1", "--gpu-mib", "tb1=16384",
           "--gpu-mib", "tb2=16384")
        destructive.ssh(destructive.hosts[0], f"rm -f {probe}")


def test_down_leaves_nothing_behind_and_up_keeps_images(destructive: Testbed) -> None:
    tb1 = destructive.hosts[0]
    destructive.docker(tb1, "rm", "-f", "lifecycle-probe", check=False)
    destructive.docker(
        tb1,
        "run",
        "-d",
        "--network",
        "host",
        "--name",
        "lifecycle-probe",
        "--entrypoint",
        "sleep",
        destructive.image("tfsdeploy-proxy"),
        "600",
    )
    proxy = destructive.image("tfsdeploy-proxy")
    proxy_id = destructive.docker(tb1, "image", "inspect", "--format", "{{.Id}}", proxy).stdout
    proc = run_testbed_cli("down")
    assert proc.returncode == 0, proc.stderr
    try:
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [n for n in netns.split() if n.startswith("tb")], netns
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "tfsbr0" not in links and "tfs-tb" not in links
        assert leftover_processes() == []
        assert leftover_mounts() == []
        rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
        assert "tfsdeploy-testbed" not in rules
        ssh_config = Path.home() / ".ssh" / "config"
        assert not ssh_config.exists() or "tfsdeploy-testbed" not in ssh_config.read_text()
    finally:
        up("--hosts", str(len(destructive.hosts)))
    assert status()[0] == 0
    # the engine's data root survived: same image without a pull (the emulator image may have
    # been rebuilt meanwhile if testbed/emulator changed, so it is not the witness)
    assert (
        destructive.docker(tb1, "image", "inspect", "--format", "{{.Id}}", proxy).stdout == proxy_id
    )
    ps = destructive.docker(tb1, "ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert "lifecycle-probe" in ps  # the host's engine state survived, like a rebooted machine
    destructive.docker(tb1, "rm", "-f", "lifecycle-probe")
