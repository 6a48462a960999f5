"""Places, names and small process helpers shared by the testbed tools (stdlib only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BRIDGE = "tfsbr0"
GATEWAY = "10.87.0.1"
PREFIX_LEN = 24
REGISTRY = f"{GATEWAY}:5000"
# tb1..tb10 are 10.87.0.11-20 (the contract's first ten), tb11..tb30 10.87.0.111-130
MAX_HOSTS = 30
# the gateway host (`up --gateway`): a host like tbN in every way but its name and address
# (10.87.0.30), in the inventory's gateway group
GATEWAY_INDEX = 100
GATEWAY_HOST = "tbgw"
GATEWAY_ADDRESS = "10.87.0.30"
# the bastion (`up --bastion`): only an sshd with OpenSSH's default MaxStartups and
# MaxSessions, the jump host of the hosts started behind it (their sshd answers it alone)
BASTION_INDEX = 101
BASTION_HOST = "tbjump"
BASTION_ADDRESS = "10.87.0.31"
DEFAULT_HOSTS = 3
DEFAULT_GPU_MIB = 16384
DEFAULT_GPUS = 1
MAX_GPUS = 16
DEFAULT_GPU_NAME = "Simulated Tesla T4"
# the simulated cards (`up --gpu-card`): what nvidia-smi reports (memory.total, memory.reserved)
# and what a process holds beside its allocator pool (context_mib). The H200's figures are
# measured on a real one (driver 580.159.04, CUDA 13.0; docs/gpu-memory.md): nvidia-smi total
# 143,771 MiB, reserved 616 MiB, CUDA's total 143,156 MiB; TensorFlow's allocator (XLA's TSL
# BFC) held 626 MiB beside its pool. The T4 is the testbed's first card, in round figures
# (16 GiB, nothing reserved; 256 MiB beside the pool, near the 234 MiB published for
# TFServing 2.2 on a T4), not a measurement.
CARDS: dict[str, dict[str, Any]] = {
    "t4": {"name": DEFAULT_GPU_NAME, "memory_total_mib": DEFAULT_GPU_MIB,
           "memory_reserved_mib": 0, "context_mib": 256, "compute_capability": "7.5"},
    "h200": {"name": "Simulated NVIDIA H200", "memory_total_mib": 143771,
             "memory_reserved_mib": 616, "context_mib": 626, "compute_capability": "9.0"},
}
DEFAULT_CARD = "t4"
# mount points inside every host, each backed by a private directory under the state dir
# /root too: a host is a fresh Debian machine, so the machine's own root dotfiles (shell start-up
# scripts that can take a tenth of a second per SSH command) must not leak into its logins
PRIVATE_DIRS = {"run": "/run", "docker": "/var/lib/docker", "srv": "/srv/tfsdeploy", "tmp": "/tmp",
                "home": "/root"}
NVIDIA_SMI_PATH = Path("/usr/local/bin/nvidia-smi")
FLEET_DIR = Path(__file__).resolve().parent


DEFAULT_STATE_DIR = "/var/lib/tfsdeploy-testbed"


class TestbedError(Exception):
    """A step failed; the message names what failed and how to fix it."""


def private_mount_over(path: Path) -> str | None:
    """The host-private directory (``PRIVATE_DIRS``: each host mounts its own over it) that
    holds ``path``, if any: a host's mounts hide whatever the testbed keeps there."""
    absolute = path.absolute()
    for target in PRIVATE_DIRS.values():
        if absolute == Path(target) or Path(target) in absolute.parents:
            return target
    return None


@dataclass(frozen=True)
class Places:
    """Where the testbed keeps everything (all outside the repository)."""

    state: Path
    cache: Path

    @classmethod
    def from_env(cls) -> Places:
        state = Path(os.environ.get("TFSDEPLOY_TESTBED_DIR", DEFAULT_STATE_DIR))
        cache = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy"))
        return cls(state=state, cache=cache)

    def check_state_dir(self) -> None:
        """Refuse a state directory the hosts could not use (before `up` changes anything):
        one inside a directory every host mounts its own over, or under a directory that
        others may write (sshd's StrictModes then refuses the keys kept there)."""
        state = self.state.absolute()
        hidden = private_mount_over(state)
        if hidden is not None:
            raise TestbedError(
                f"TFSDEPLOY_TESTBED_DIR {state} is inside {hidden}, which every testbed host "
                f"mounts its own directory over: a host could not find its files there; "
                "choose a directory outside " + ", ".join(sorted(PRIVATE_DIRS.values())) +
                f" ({DEFAULT_STATE_DIR} by default)")
        for directory in (state, *state.parents):
            if directory.exists() and directory.stat().st_mode & 0o022:
                raise TestbedError(
                    f"TFSDEPLOY_TESTBED_DIR {state} is under {directory}, which others may "
                    "write: sshd (StrictModes) refuses the keys the testbed keeps there; "
                    f"choose a directory whose parents only root writes ({DEFAULT_STATE_DIR} "
                    "by default)")

    @property
    def ssh(self) -> Path:
        return self.state / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.ssh / "config"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def bin(self) -> Path:
        return self.state / "bin"

    @property
    def registry(self) -> Path:
        return self.state / "registry"

    @property
    def hosts_json(self) -> Path:
        return self.state / "hosts.json"

    @property
    def images(self) -> Path:
        return self.cache / "images"

    def host_dir(self, name: str) -> Path:
        return self.state / "hosts" / name


def host_name(index: int) -> str:
    return {GATEWAY_INDEX: GATEWAY_HOST, BASTION_INDEX: BASTION_HOST}.get(index, f"tb{index}")


def host_address(index: int) -> str:
    special = {GATEWAY_INDEX: GATEWAY_ADDRESS, BASTION_INDEX: BASTION_ADDRESS}
    if index in special:
        return special[index]
    return f"10.87.0.{10 + index}" if index <= 10 else f"10.87.0.{100 + index}"


def veth_name(index: int) -> str:
    # the root-namespace end of host tbN's veth pair (IFNAMSIZ is 15)
    return f"tfs-{host_name(index)}"


def log(message: str) -> None:
    print(f"testbed: {message}", file=sys.stderr, flush=True)


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    capture: bool = True,
    input_text: str | None = None,
    timeout: float | None = 600,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise TestbedError with the command and its stderr."""
    proc = subprocess.run(
        list(argv),
        text=True,
        input=input_text,
        timeout=timeout,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip()[-2000:]
        raise TestbedError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{detail}")
    return proc


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def daemon_pid(pid_file: Path, comm_prefix: str) -> int | None:
    """The pid in ``pid_file`` if that process lives and is the daemon (its comm starts with
    ``comm_prefix``: a recycled pid is not it)."""
    found = read_pid(pid_file)
    if found is None or not pid_alive(found):
        return None
    try:
        comm = Path(f"/proc/{found}/comm").read_text().strip()
    except OSError:
        return None
    return found if comm.startswith(comm_prefix) else None


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether GET ``url`` answers 200 within ``timeout``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def wait_until(predicate, *, timeout: float, interval: float = 0.05, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll predicate() until it is true or raise TestbedError naming what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TestbedError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Timer:
    """Collects named phase durations so `up` can print where the time went."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.phases: list[tuple[str, float]] = []

    def phase(self, name: str, since: float) -> None:
        self.phases.append((name, time.monotonic() - since))

    def total(self) -> float:
        return time.monotonic() - self.start


def make_ssh_key(path: Path, comment: str) -> None:
    """An ed25519 key pair without a passphrase at ``path`` (and ``path``.pub), unless present."""
    if not path.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def isolated_dockerd_argv(*, socket: str, data_root: str, exec_root: str, pidfile: str,
                          config_file: Path) -> list[str]:
    """A dockerd of its own: own socket, data and exec roots, no networking of its own (no
    bridge, no iptables rules), pulls from and pushes to the testbed's registry."""
    return [
        "dockerd",
        f"--host=unix://{socket}",
        f"--data-root={data_root}",
        f"--exec-root={exec_root}",
        f"--pidfile={pidfile}",
        f"--config-file={config_file}",
        "--bridge=none",
        "--iptables=false",
        "--ip-masq=false",
        "--ip6tables=false",
        "--storage-driver=overlay2",
        f"--insecure-registry={REGISTRY}",
        "--log-level=warn",
    ]
