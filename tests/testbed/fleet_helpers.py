"""Helpers for the testbed tests: what hosts.json says, ssh and docker on a host, the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
TESTBED = REPO / "scripts" / "testbed"
FLEET = REPO / "testbed" / "fleet"
STATE = Path(os.environ.get("TFSDEPLOY_TESTBED_DIR", "/var/lib/tfsdeploy-testbed"))


@dataclass(frozen=True)
class TestbedHost:
    __test__ = False
    name: str
    address: str
    gpus: list[dict[str, object]]

    @property
    def private_dir(self) -> Path:
        """The host's private directories as seen from the machine (run/, docker/, srv/, tmp/)."""
        return STATE / "hosts" / self.name


@dataclass(frozen=True)
class Testbed:
    __test__ = False
    hosts: list[TestbedHost]
    registry: str
    ssh_key: Path
    known_hosts: Path
    ssh_config: Path
    started_here: bool

    def ssh_argv(self, host: TestbedHost, command: str) -> list[str]:
        """ssh exactly as a client of a real host would (strict host-key checking on)."""
        return [
            "ssh",
            "-i",
            str(self.ssh_key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            f"root@{host.address}",
            command,
        ]

    def ssh(
        self, host: TestbedHost, command: str, *, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.ssh_argv(host, command), capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"ssh {host.name} {command!r} -> {proc.returncode}\n"
                f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
            )
        return proc

    def docker(
        self, host: TestbedHost, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return self.ssh(
            host, "docker " + " ".join(shlex.quote(a) for a in args), check=check, timeout=timeout
        )

    def image(self, name: str) -> str:
        tags = {"tfserving-emulator": "2.21.0", "tfsdeploy-proxy": "2.6"}
        return f"{self.registry}/{name}:{tags[name]}"


def run_testbed_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TESTBED), *args], capture_output=True, text=True, timeout=timeout)


def testbed_healthy() -> bool:
    return run_testbed_cli("status", "--json", timeout=60).returncode == 0


def load_testbed(started_here: bool) -> Testbed:
    data = json.loads((STATE / "hosts.json").read_text())
    return Testbed(
        # hosts behind the bastion answer SSH through it alone: the big fleet's, not these tests'
        hosts=[TestbedHost(h["name"], h["address"], h["gpus"]) for h in data["hosts"]
               if not h.get("via")],
        registry=data["registry"],
        ssh_key=Path(data["ssh_key"]),
        known_hosts=Path(data["known_hosts"]),
        ssh_config=Path(data.get("ssh_config", STATE / "ssh" / "config")),
        started_here=started_here,
    )


def ensure_up() -> None:
    proc = run_testbed_cli("up")
    if proc.returncode != 0:
        raise RuntimeError(
            f"scripts/testbed up failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )


def fleet_module(name: str) -> ModuleType:
    """A module of testbed/fleet (the fleet's own stdlib-only tools), for their pure rules.

    Loaded under the name ``fleet_<name>``: `testbed` is also the repository's testbed/ folder.
    """
    if str(FLEET) not in sys.path:
        sys.path.insert(0, str(FLEET))  # their own imports (common, hosts, simgpu_devices, ...)
    key = f"fleet_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, FLEET / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
